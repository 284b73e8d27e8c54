//! [`MetadataStore`] on Redis: metadata hash, liveness hash, mutex and index.
//!
//! Owns the command sequence of each metadata operation; the atomic parts are the scripts in
//! `scripts.rs`. Never writes the index from inside a script (it has no hash tag) and never sets
//! a TTL on metadata.

use std::collections::{BTreeMap, BTreeSet};

use ::redis::{ServerErrorKind, Value};

use super::cluster::Primary;
use super::conn::{Conn, Lane};
use super::fences::{parse_fence, parse_raise, FenceScripts};
use super::scripts::{number, parse_delete, parse_record, parse_touch, parse_touch_stamp, parse_write, text};
use super::RedisStore;
use crate::core::model::{Fence, GroupId, MemberId};
use crate::store::keys;
use crate::store::{
    CasStamp, FenceRaise, MetadataStore, PrimaryIdentity, ProbeReport, RecordStamp, ServerIdentity, StoreError,
    StoredRecord, TouchCheck, TouchResult, WriteOutcome, WriteRequest,
};

/// Upper bound on SCAN round trips of one `rebuild_index` (a limit on everything; at COUNT 1000
/// this covers a keyspace far larger than any coordinator deployment).
const SCAN_ROUNDS_MAX: u64 = 1_000_000;

/// Most fence raises sent in one pipeline (one round trip, one store deadline): 1,024 raises take
/// about 16 ms of a local server's time.
const RAISES_PER_PIPELINE: usize = 1_024;
impl MetadataStore for RedisStore {
    async fn load(&self, group: &GroupId) -> Result<Option<StoredRecord>, StoreError> {
        let mut cmd = ::redis::cmd("HMGET");
        cmd.arg(keys::metadata_key(group)).arg(&[
            keys::FIELD_AGGREGATE,
            keys::FIELD_REVISION,
            keys::FIELD_SCHEMA_VERSION,
            keys::FIELD_LAYOUT_VERSION,
            keys::FIELD_UPDATED_AT,
            keys::FIELD_WRITE_ID,
        ]);
        let fields: Vec<Value> = self.query("HMGET", cmd).await?;
        parse_record(&fields)
    }

    async fn touch_and_load_by(&self, group: &GroupId, member: &str, step: u64) -> Result<TouchResult, StoreError> {
        let mut invocation = self.inner.scripts.touch.prepare_invoke();
        invocation.key(keys::metadata_key(group)).key(keys::liveness_key(group)).arg(member).arg(step);
        let reply = self.invoke("touch script", invocation).await?;
        let (liveness, record) = parse_touch(&reply)?;
        Ok(TouchResult { liveness, record })
    }

    async fn touch_and_check_by(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
        step: u64,
    ) -> Result<TouchCheck, StoreError> {
        let metadata = keys::metadata_key(group);
        let liveness_key = keys::liveness_key(group);
        let (liveness, stamp): (u64, Vec<Value>) = if self.is_cluster() {
            // One script, never a pipeline nor two requests. A pipeline: the `redis` crate follows
            // an ASK redirect of a pipeline by sending the whole pipeline to the importing node
            // after one ASKING, which covers only its first command. While a slot migration has
            // moved the metadata key but not the liveness hash, the HINCRBY then ran on the
            // importing node too, creating a second liveness hash there (MIGRATE of the real one
            // then fails with BUSYKEY), and the HMGET bounced (MOVED, ASK, ...) until the
            // deadline. Two requests: nothing orders them at Redis (a redirect or a resend delays
            // one), and a stamp read that ran before an expiry with the increment after it would
            // answer OK, from a record that still lists the member's shards, a member the expiry
            // removed (it checked a counter the increment had not moved yet): with fencing off,
            // two owners. The script is one command: it follows ASK on its own, and while the
            // two keys are on different nodes Redis answers TRYAGAIN, which the crate retries.
            let mut invocation = self.inner.scripts.touch_stamp.prepare_invoke();
            invocation.key(&metadata).key(&liveness_key).arg(member).arg(step);
            match parse_touch_stamp(self.invoke("touch-stamp script", invocation).await?)? {
                Some(touched) => touched,
                // The metadata key is absent: the script wrote nothing.
                None => return Ok(TouchCheck::Changed(TouchResult { liveness: 0, record: None })),
            }
        } else {
            // One pipeline, the increment first: Redis runs a connection's commands in order, so
            // an expiry that ran after the stamp read also ran after the increment (and saw it).
            let mut touch = ::redis::cmd("HINCRBY");
            touch.arg(&liveness_key).arg(member).arg(step);
            let mut stamp_read = ::redis::cmd("HMGET");
            stamp_read.arg(&metadata).arg(&[
                keys::FIELD_REVISION,
                keys::FIELD_WRITE_ID,
                keys::FIELD_SCHEMA_VERSION,
                keys::FIELD_LAYOUT_VERSION,
            ]);
            let mut pipe = ::redis::pipe();
            pipe.add_command(touch).add_command(stamp_read);
            self.pipeline("HINCRBY+HMGET", pipe).await?
        };
        let [revision, write_id, schema_version, layout_version] = stamp.as_slice() else {
            return Err(StoreError::Protocol(format!("stamp read returned {} fields, expected 4", stamp.len())));
        };
        if matches!(revision, Value::Nil) {
            // The metadata key is gone: the HINCRBY may just have created the liveness hash. The
            // script deletes it only if the metadata key is still absent, so no key is left.
            let mut invocation = self.inner.scripts.forget_liveness.prepare_invoke();
            invocation.key(&metadata).key(&liveness_key);
            self.invoke("forget-liveness script", invocation).await?;
            return Ok(TouchCheck::Changed(TouchResult { liveness: 0, record: None }));
        }
        // Anything missing or malformed reads as changed: the full read then reports it.
        let version = |v: &Value| number(v).and_then(|n| u32::try_from(n).ok());
        let unchanged = match (number(revision), text(write_id), version(schema_version), version(layout_version)) {
            (Some(revision), Some(write_id), Some(schema), Some(layout)) => {
                known.matches(revision, &write_id, schema, layout)
            }
            _ => false,
        };
        if unchanged {
            return Ok(TouchCheck::Unchanged { liveness });
        }
        Ok(TouchCheck::Changed(TouchResult { liveness, record: self.load(group).await? }))
    }

    async fn liveness(&self, group: &GroupId) -> Result<BTreeMap<MemberId, u64>, StoreError> {
        let mut cmd = ::redis::cmd("HGETALL");
        cmd.arg(keys::liveness_key(group));
        let pairs: BTreeMap<String, String> = self.query("HGETALL", cmd).await?;
        pairs
            .into_iter()
            .map(|(member, counter)| match counter.parse::<u64>() {
                Ok(counter) => Ok((member, counter)),
                Err(_) => Err(StoreError::Protocol(format!("liveness counter of {member:?} is not a number"))),
            })
            .collect()
    }

    async fn write(&self, group: &GroupId, request: WriteRequest) -> Result<WriteOutcome, StoreError> {
        request.check()?;
        let (expected_revision, expected_write_id, next) = match &request.expected {
            None => (String::new(), "", 1),
            Some(expected) => {
                let next = expected.revision.checked_add(1).ok_or_else(|| {
                    StoreError::Protocol(format!("revision {} cannot be incremented", expected.revision))
                })?;
                (expected.revision.to_string(), expected.write_id.as_str(), next)
            }
        };
        let mut invocation = self.inner.scripts.write.prepare_invoke();
        invocation
            .key(keys::metadata_key(group))
            .key(keys::liveness_key(group))
            .arg(expected_revision)
            .arg(expected_write_id)
            .arg(next)
            .arg(&request.aggregate)
            .arg(request.schema_version)
            .arg(request.layout_version)
            .arg(request.updated_at_ms)
            .arg(&request.write_id)
            .arg(request.liveness_guards.len());
        for (member, counter) in &request.liveness_guards {
            invocation.arg(member).arg(*counter);
        }
        for member in &request.liveness_remove {
            invocation.arg(member);
        }
        let reply = self.invoke("write script", invocation).await?;
        let outcome = parse_write(&reply)?;
        if request.expected.is_none() && matches!(outcome, WriteOutcome::Written { .. }) {
            // After the create, not inside the script: the index key has no hash tag. If this
            // SADD fails the group exists but is not indexed until `rebuild_index` runs — the
            // index is never truth, so the write still succeeded and is reported as written.
            if let Err(err) = self.index_add(group).await {
                tracing::warn!(group = %group, error = %err, "group created but not added to the index");
            }
        }
        Ok(outcome)
    }

    async fn delete(&self, group: &GroupId, expected: &CasStamp) -> Result<WriteOutcome, StoreError> {
        let mut invocation = self.inner.scripts.delete.prepare_invoke();
        invocation
            .key(keys::metadata_key(group))
            .key(keys::liveness_key(group))
            .arg(expected.revision)
            .arg(&expected.write_id);
        let reply = self.invoke("delete script", invocation).await?;
        let outcome = parse_delete(&reply)?;
        if matches!(outcome, WriteOutcome::Written { .. }) {
            // Separate command for the same reason as the SADD on create. A stale entry left by a
            // failure here points at a missing metadata key, which readers treat as absent.
            let mut cmd = ::redis::cmd("SREM");
            cmd.arg(keys::INDEX_KEY).arg(keys::index_entry(group));
            if let Err(err) = self.query::<Value>("SREM", cmd).await {
                tracing::warn!(group = %group, error = %err, "group deleted but its index entry remains");
            }
        }
        Ok(outcome)
    }

    async fn acquire_mutex(&self, group: &GroupId, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(keys::mutex_key(group)).arg(token).arg("NX").arg("PX").arg(ttl_ms);
        let reply: Value = self.query("SET", cmd).await?;
        match reply {
            Value::Okay => Ok(true),
            Value::Nil => Ok(false),
            other => Err(StoreError::Protocol(format!("SET NX PX: unexpected reply {other:?}"))),
        }
    }

    async fn release_mutex(&self, group: &GroupId, token: &str) -> Result<bool, StoreError> {
        let mut invocation = self.inner.scripts.release.prepare_invoke();
        invocation.key(keys::mutex_key(group)).arg(token);
        let reply = self.invoke("mutex release script", invocation).await?;
        match number(&reply) {
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            _ => Err(StoreError::Protocol(format!("mutex release script: unexpected reply {reply:?}"))),
        }
    }

    async fn index_add(&self, group: &GroupId) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd("SADD");
        cmd.arg(keys::INDEX_KEY).arg(keys::index_entry(group));
        let _: Value = self.query("SADD", cmd).await?;
        Ok(())
    }

    async fn index_members(&self) -> Result<Vec<GroupId>, StoreError> {
        let mut cmd = ::redis::cmd("SMEMBERS");
        cmd.arg(keys::INDEX_KEY);
        let entries: Vec<String> = self.query("SMEMBERS", cmd).await?;
        let groups: BTreeSet<GroupId> = entries.iter().filter_map(|e| keys::parse_index_entry(e)).collect();
        Ok(groups.into_iter().collect())
    }

    async fn rebuild_index(&self) -> Result<Vec<GroupId>, StoreError> {
        let found = self.scan_metadata_groups().await?;
        if !found.is_empty() {
            let mut cmd = ::redis::cmd("SADD");
            cmd.arg(keys::INDEX_KEY);
            for group in &found {
                cmd.arg(keys::index_entry(group));
            }
            let _: Value = self.query("SADD", cmd).await?;
        }
        Ok(found.into_iter().collect())
    }

    async fn tick_roster(&self, instance: &str) -> Result<BTreeMap<String, u64>, StoreError> {
        let mut count = ::redis::cmd("HINCRBY");
        count.arg(keys::TICK_ROSTER_KEY).arg(instance).arg(1);
        let mut read = ::redis::cmd("HGETALL");
        read.arg(keys::TICK_ROSTER_KEY);
        if self.is_cluster() {
            // Two requests, as `touch_and_check` sends them there (a pipeline redirected by ASK
            // mid-migration is resent whole after one ASKING); the read may then miss this
            // pass's count, which changes nothing (a process always counts itself live).
            let (_, roster): (Value, BTreeMap<String, u64>) =
                futures_util::future::try_join(self.query("HINCRBY", count), self.query("HGETALL", read)).await?;
            return Ok(roster);
        }
        let mut pipe = ::redis::pipe();
        pipe.add_command(count).ignore().add_command(read);
        let (roster,): (BTreeMap<String, u64>,) = self.pipeline("HINCRBY+HGETALL", pipe).await?;
        Ok(roster)
    }

    async fn forget_tickers(&self, instances: &[String]) -> Result<(), StoreError> {
        if instances.is_empty() {
            return Ok(());
        }
        let mut cmd = ::redis::cmd("HDEL");
        cmd.arg(keys::TICK_ROSTER_KEY);
        for instance in instances {
            cmd.arg(instance);
        }
        let _: Value = self.query("HDEL", cmd).await?;
        Ok(())
    }

    async fn exchange_heard(
        &self,
        sender: &str,
        outgoing: &[(String, String)],
        ttl_ms: u64,
        senders: &[String],
    ) -> Result<Vec<Option<String>>, StoreError> {
        let mut commands = Vec::with_capacity(outgoing.len() + senders.len());
        for (owner, blob) in outgoing {
            let mut set = ::redis::cmd("SET");
            set.arg(keys::heard_relay_key(owner, sender)).arg(blob).arg("PX").arg(ttl_ms);
            commands.push(set);
        }
        for from in senders {
            let mut get = ::redis::cmd("GET");
            get.arg(keys::heard_relay_key(sender, from));
            commands.push(get);
        }
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let replies: Vec<Value> = if self.is_cluster() {
            // Each key in its own slot: one request per command, all at once. A node that fails
            // costs only its keys (a GET there reads as nothing); the exchange fails only when
            // every command did.
            let results =
                futures_util::future::join_all(commands.into_iter().map(|cmd| self.query::<Value>("SET/GET", cmd)))
                    .await;
            if let Some(Err(e)) = results.iter().find(|r| r.is_err()).filter(|_| results.iter().all(Result::is_err)) {
                return Err(e.clone());
            }
            results.into_iter().map(|r| r.unwrap_or(Value::Nil)).collect()
        } else {
            let mut pipe = ::redis::pipe();
            for cmd in commands {
                pipe.add_command(cmd);
            }
            self.pipeline("SET+GET", pipe).await?
        };
        replies
            .into_iter()
            .skip(outgoing.len())
            .map(|reply| match reply {
                Value::Nil => Ok(None),
                other => text(&other)
                    .map(Some)
                    .ok_or_else(|| StoreError::Protocol(format!("GET heard relay: unexpected reply {other:?}"))),
            })
            .collect()
    }

    async fn identity(&self) -> Result<ServerIdentity, StoreError> {
        self.server_identity().await
    }

    async fn primary_account(&self, listed: &PrimaryIdentity) -> Result<Option<PrimaryIdentity>, StoreError> {
        if !self.is_cluster() {
            return Ok(None);
        }
        self.listed_primary_account(listed).await.map(Some)
    }

    async fn probe(&self) -> Result<ProbeReport, StoreError> {
        self.run_probe().await
    }

    async fn raise_fences(&self, raises: &[FenceRaise]) -> Result<Vec<Fence>, StoreError> {
        if raises.is_empty() {
            return Ok(Vec::new());
        }
        let parts = self.slot_parts(raises.iter().map(|raise| raise.key.as_str()));
        let replies = if parts.len() == 1 {
            self.raise_slot(raises).await?
        } else {
            self.per_slot("fence raise script", raises, &parts, |part| async move { self.raise_slot(&part).await })
                .await?
        };
        let parsed: Vec<(Fence, Option<String>)> = raises
            .iter()
            .zip(&replies)
            .map(|(raise, reply)| parse_raise(reply, raise.nonce))
            .collect::<Result<_, _>>()?;
        // On a Cluster, an old value's gate the script did not find may be on the source node of
        // a slot move that took the fence key first: deleted here, by name (each DEL follows its
        // own key's redirect), before any grant under the new value is written. One more round
        // trip, only on a Cluster and only for a value whose gate had expired or was never opened
        // (a shard read in the last 10 s has its gate, which the script closes).
        if self.is_cluster() {
            let deletes = parsed.iter().filter_map(|(_, gate)| gate.as_ref()).map(|gate| {
                let mut delete = ::redis::cmd("DEL");
                delete.arg(gate);
                self.query::<u64>("DEL", delete)
            });
            futures_util::future::try_join_all(deletes).await?;
        }
        Ok(parsed.into_iter().map(|(fence, _)| fence).collect())
    }

    async fn read_fences(&self, keys: &[String]) -> Result<Vec<Option<Fence>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let parts = self.slot_parts(keys.iter().map(String::as_str));
        if parts.len() > 1 {
            return self
                .per_slot("fence read", keys, &parts, |part| async move { self.read_fences_pipelined(&part).await })
                .await;
        }
        self.read_fences_pipelined(keys).await
    }
}

impl RedisStore {
    /// HMGET of each fence key, all in one pipeline (one slot on a Cluster).
    async fn read_fences_pipelined(&self, keys: &[String]) -> Result<Vec<Option<Fence>>, StoreError> {
        let mut pipe = ::redis::pipe();
        for key in keys {
            pipe.cmd("HMGET").arg(key).arg(keys::FENCE_FIELD_COUNTER).arg(keys::FENCE_FIELD_NONCE);
        }
        let replies: Vec<Vec<Value>> = self.pipeline("HMGET", pipe).await?;
        if replies.len() != keys.len() {
            return Err(StoreError::Protocol(format!("fence read: {} replies for {} keys", replies.len(), keys.len())));
        }
        keys.iter().zip(&replies).map(|(key, fields)| parse_fence(key, fields)).collect()
    }

    /// The raises of one slot's keys (of any keys on a single server). On a Cluster, several keys
    /// of one slot are raised each by its own call, sent together: the `redis` crate follows an
    /// `ASK` answer to a pipeline by resending the whole pipeline to the importing node with one
    /// `ASKING` first, so while a move has split the slot's keys, a raise of a key still on the
    /// source ran on the target too and created a second copy of it there, with a counter of its
    /// own (and the move's next `MIGRATE` of it failed `BUSYKEY`: `store_contract`'s
    /// `raises_of_fence_keys_a_move_has_split_create_no_second_key`). Each call on
    /// its own follows its own key's `ASK` only.
    async fn raise_slot(&self, raises: &[FenceRaise]) -> Result<Vec<Value>, StoreError> {
        if !self.is_cluster() || raises.len() < 2 {
            // In pipelines of a bounded size, each under its own deadline: the raises of one large
            // grant (the first of a 65,536-shard group: 1.05 s of Redis time on a local server)
            // had to finish within one store deadline, and when they did not, every retry raised
            // them all again (a scale review).
            let mut replies = Vec::with_capacity(raises.len());
            for chunk in raises.chunks(RAISES_PER_PIPELINE) {
                replies.extend(self.raise_pipelined(chunk).await?);
            }
            return Ok(replies);
        }
        let script = &self.inner.scripts.fences.raise;
        let calls = raises.iter().map(|raise| async move {
            let mut invocation = script.prepare_invoke();
            invocation.key(&raise.key).arg(format!("{:016x}", raise.nonce)).arg(raise.floor);
            self.invoke("fence raise script", invocation).await
        });
        futures_util::future::join_all(calls).await.into_iter().collect()
    }

    /// One EVALSHA of the raise script per key, all in one pipeline (one round trip). A key whose
    /// call found the script missing (NOSCRIPT: a restarted or failed-over server) did not run, so
    /// after SCRIPT LOAD only those calls are sent again; a call still missing it then (on a
    /// Cluster: a new, empty primary the slot is moving onto, which the client's SCRIPT LOAD does
    /// not reach) is sent once more as EVAL of the script's text (a user without `+eval` keeps the
    /// NOSCRIPT). This code raises no key twice (on a Cluster the client resends a pipeline
    /// redirected mid-migration whole, DESIGN §11). Any other error reply fails the whole call
    /// (keys raised before it stay raised, which is harmless: values never repeat, and a raise
    /// nobody records fences nobody).
    async fn raise_pipelined(&self, raises: &[FenceRaise]) -> Result<Vec<Value>, StoreError> {
        let script = &self.inner.scripts.fences.raise;
        self.inner
            .conn
            .run(Lane::Shared, "fence raise script", 0, |mut c: Conn| async move {
                let mut replies: Vec<Option<Value>> = vec![None; raises.len()];
                let mut missing_script = None;
                for attempt in 0..3 {
                    let todo: Vec<usize> = (0..raises.len()).filter(|i| replies[*i].is_none()).collect();
                    let source = (attempt == 2).then(|| FenceScripts::sources().into_iter().next()).flatten();
                    let mut pipe = ::redis::pipe();
                    pipe.ignore_errors();
                    for &i in &todo {
                        match &source {
                            Some(source) => pipe.cmd("EVAL").arg(source.as_str()),
                            None => pipe.cmd("EVALSHA").arg(script.get_hash()),
                        };
                        pipe.arg(1).arg(&raises[i].key).arg(format!("{:016x}", raises[i].nonce)).arg(raises[i].floor);
                    }
                    let values: Vec<Value> = pipe.query_async(&mut c).await?;
                    let mut missing = false;
                    for (&i, value) in todo.iter().zip(values) {
                        match value {
                            Value::ServerError(e) if attempt < 2 && e.kind() == Some(ServerErrorKind::NoScript) => {
                                missing = true;
                                missing_script = Some(e);
                            }
                            Value::ServerError(e)
                                if source.is_some()
                                    && super::conn::refused_eval(&Ok(Value::ServerError(e.clone()))) =>
                            {
                                return Err(missing_script.take().unwrap_or(e).into());
                            }
                            Value::ServerError(e) => return Err(e.into()),
                            value => replies[i] = Some(value),
                        }
                    }
                    if !missing {
                        break;
                    }
                    if attempt == 0 {
                        script.load_async(&mut c).await?;
                    }
                }
                // A call still unanswered here means the server sent fewer replies than calls.
                let replies: Option<Vec<Value>> = replies.into_iter().collect();
                Ok((replies, c))
            })
            .await?
            .ok_or_else(|| StoreError::Protocol("fence raise script: fewer replies than calls".into()))
    }

    /// Every group with a metadata key, from a full SCAN (each round trip has its own deadline);
    /// on a Cluster, a full SCAN of every serving primary.
    async fn scan_metadata_groups(&self) -> Result<BTreeSet<GroupId>, StoreError> {
        if !self.is_cluster() {
            return self.scan_metadata_groups_on(None).await;
        }
        let mut found = BTreeSet::new();
        for primary in self.cluster_primaries().await? {
            found.extend(self.scan_metadata_groups_on(Some(&primary)).await?);
        }
        Ok(found)
    }

    /// The SCAN of one server: the store's, or one cluster primary.
    async fn scan_metadata_groups_on(&self, node: Option<&Primary>) -> Result<BTreeSet<GroupId>, StoreError> {
        let mut found = BTreeSet::new();
        let mut cursor = 0u64;
        for _ in 0..SCAN_ROUNDS_MAX {
            let mut cmd = ::redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(keys::METADATA_SCAN_PATTERN)
                .arg("COUNT")
                .arg(self.inner.options.scan_count.max(1));
            let reply: Value = match node {
                None => self.query("SCAN", cmd).await?,
                Some(node) => self.on_node("SCAN", node, cmd).await?,
            };
            let Value::Array(parts) = &reply else {
                return Err(StoreError::Protocol(format!("SCAN: unexpected reply {reply:?}")));
            };
            let (Some(next), Some(Value::Array(batch))) = (parts.first().and_then(number), parts.get(1)) else {
                return Err(StoreError::Protocol(format!("SCAN: unexpected reply {reply:?}")));
            };
            found.extend(batch.iter().filter_map(text).filter_map(|k| keys::parse_metadata_key(&k)));
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
        Err(StoreError::Protocol(format!("SCAN did not finish within {SCAN_ROUNDS_MAX} rounds")))
    }
}
