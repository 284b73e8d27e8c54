//! The consumer's doorbell on Redis ([`StreamStore::wait_for_entries`]): `XINFO GROUPS` for the
//! streams whose last-seen id the caller does not know, then one `XREAD COUNT 1 BLOCK` on the
//! blocking lane.
//!
//! Owns those two commands and the parsing of their replies. Never sends `BLOCK 0` (block
//! forever), never blocks the shared connection, and never reads for a consumer group: the
//! doorbell only says whether something newer exists; the fenced or unfenced read that follows
//! delivers it. Keeps the doorbell's invariant that the id watched is never newer than an entry
//! the group has not been delivered (see the trait method).
//!
//! [`StreamStore::wait_for_entries`]: crate::store::StreamStore::wait_for_entries

use ::redis::Value;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::conn::{Conn, Lane};
use super::scripts::text;
use super::RedisStore;
use crate::store::{Doorbell, EntryId, StoreError};

/// Watched after when the group or the stream does not exist yet: any entry rings.
const ZERO_ID: EntryId = EntryId { ms: 0, seq: 0 };

fn protocol(what: &str, value: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: unexpected reply {value:?}"))
}

impl RedisStore {
    /// See [`crate::store::StreamStore::wait_for_entries`]. Two round trips when some id is
    /// unknown (XINFO GROUPS for all of those; then XREAD), else one. On a Redis Cluster the XREAD
    /// is one blocking XREAD per slot, concurrently; the doorbell rings when the first one does.
    pub(super) async fn doorbell(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> Result<Doorbell, StoreError> {
        let started = Instant::now();
        let after = self.resolve_after(group, streams).await?;
        if streams.is_empty() {
            return Ok(Doorbell { rang: false, after });
        }
        // Resolving unknown ids takes a round trip per batch (many, for a consumer of thousands of
        // shards on a Cluster): the wait that follows is shortened by that time, so the doorbell
        // does not hold its caller past the deadline it asked for by more than the resolution's
        // last round trip. The resolution is not cut short: the caller keeps the ids it finds, so
        // a large consumer resolves once, however long that takes, rather than never.
        let spent_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // BLOCK 0 would block forever.
        let block_ms = block_ms.saturating_sub(spent_ms).max(1);
        let names: Vec<&str> = streams.iter().map(|(stream, _)| stream.as_str()).collect();
        let parts = self.slot_parts(names.iter().copied());
        let rang = if parts.len() == 1 {
            self.ring(&names, &after, block_ms).await?
        } else {
            // A Cluster: one XREAD cannot span slots, so one blocking XREAD per slot, each on its
            // own connection, and the first that rings answers (the others are dropped with their
            // connections; XREAD consumes nothing, so nothing is lost by abandoning them).
            let mut waits: FuturesUnordered<_> = parts
                .iter()
                .map(|part| {
                    let names: Vec<&str> = part.iter().map(|&i| names[i]).collect();
                    let ids: Vec<EntryId> = part.iter().map(|&i| after[i]).collect();
                    async move { self.ring(&names, &ids, block_ms).await }
                })
                .collect();
            let mut rang = false;
            while let Some(answer) = waits.next().await {
                if answer? {
                    rang = true;
                    break;
                }
            }
            rang
        };
        Ok(Doorbell { rang, after })
    }

    /// The given ids, with each unknown one replaced by the group's last-delivered id.
    /// One blocking `XREAD COUNT 1` of `streams` (one slot on a Cluster) after `after`: whether
    /// any has an entry there, or gets one within `block_ms`.
    async fn ring(&self, streams: &[&str], after: &[EntryId], block_ms: u64) -> Result<bool, StoreError> {
        let mut cmd = ::redis::cmd("XREAD");
        cmd.arg("COUNT").arg(1).arg("BLOCK").arg(block_ms).arg("STREAMS");
        for stream in streams {
            cmd.arg(*stream);
        }
        for id in after {
            cmd.arg(id);
        }
        let reply: Value = self
            .inner
            .conn
            .run(Lane::Blocking, "XREAD", block_ms, |mut c: Conn| async move {
                let value: Value = cmd.query_async(&mut c).await?;
                Ok((value, c))
            })
            .await?;
        match &reply {
            Value::Nil => Ok(false),
            Value::Array(items) => Ok(!items.is_empty()),
            Value::Map(items) => Ok(!items.is_empty()),
            other => Err(protocol("XREAD", other)),
        }
    }

    async fn resolve_after(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
    ) -> Result<Vec<EntryId>, StoreError> {
        let unknown: Vec<&str> = streams.iter().filter(|(_, id)| id.is_none()).map(|(s, _)| s.as_str()).collect();
        if unknown.is_empty() {
            return Ok(streams.iter().map(|(_, id)| id.unwrap_or(ZERO_ID)).collect());
        }
        let replies: Vec<Value> = if self.is_cluster() {
            self.xinfo_in_runs(&unknown).await?
        } else {
            self.xinfo_pipelined(&unknown).await?
        };
        let mut replies = replies.into_iter();
        streams
            .iter()
            .map(|(_, id)| match id {
                Some(id) => Ok(*id),
                None => last_delivered(&replies.next().unwrap_or(Value::Nil), group),
            })
            .collect()
    }
}

impl RedisStore {
    /// `XINFO GROUPS` of each of `streams` on a single server, in pipelines of at most
    /// [`XINFO_PIPELINE_MAX`], each under its own deadline: a round trip per 1,024 shards. They
    /// used to go one after another under one deadline, so that past about 2,000 unknown shards
    /// (at 1 ms a round trip) the resolution always timed out, the doorbell was never usable, and
    /// every attempt dropped the shared connection the consumer's reads and acks use (a scale
    /// review); and one pipeline of all of them (10–15 MB of replies at 65,536 shards) could miss
    /// its one deadline the same way on a slower link. Each reply is the stream's own: `Nil` for a
    /// stream that does not exist yet (nothing was delivered from it). Any other refusal fails the
    /// call as the first refused command did before, inside the same round trip's handling, so
    /// the connection is replaced on the same errors (a server that is no longer a master, say).
    async fn xinfo_pipelined(&self, streams: &[&str]) -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::with_capacity(streams.len());
        for batch in streams.chunks(XINFO_PIPELINE_MAX) {
            out.extend(self.xinfo_pipeline(batch).await?);
        }
        Ok(out)
    }

    /// One pipeline of [`RedisStore::xinfo_pipelined`].
    async fn xinfo_pipeline(&self, streams: &[&str]) -> Result<Vec<Value>, StoreError> {
        let mut pipe = ::redis::pipe();
        // Each command's error stays in its own reply instead of failing the pipeline.
        pipe.ignore_errors();
        for stream in streams {
            pipe.cmd("XINFO").arg("GROUPS").arg(*stream);
        }
        let replies: Vec<Value> = self
            .inner
            .conn
            .run(Lane::Shared, "XINFO GROUPS", 0, |mut c: Conn| async move {
                let replies: Vec<Value> = pipe.query_async(&mut c).await?;
                let mut out = Vec::with_capacity(replies.len());
                for reply in replies {
                    out.push(match reply {
                        Value::ServerError(err) => {
                            let err = ::redis::RedisError::from(err);
                            if !no_such_key(&err) {
                                return Err(err);
                            }
                            Value::Nil
                        }
                        other => other,
                    });
                }
                Ok((out, c))
            })
            .await?;
        if replies.len() != streams.len() {
            return Err(StoreError::Protocol(format!(
                "XINFO GROUPS: {} replies for {} streams",
                replies.len(),
                streams.len()
            )));
        }
        Ok(replies)
    }

    /// `XINFO GROUPS` of each of `streams` on a Redis Cluster (each command follows its own key's
    /// slot), in runs of [`XINFO_RUN_MAX`] under a deadline each, the commands of a run sent
    /// together on the multiplexed cluster connection: about a round trip per run. One deadline
    /// for all of them timed out past a few thousand shards, as on a single server; and a run's
    /// commands sent one after another made resolving 8,192 shards take 8 s at 1 ms a round trip
    /// (a diff review).
    async fn xinfo_in_runs(&self, streams: &[&str]) -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::with_capacity(streams.len());
        for run in streams.chunks(XINFO_RUN_MAX) {
            let replies = self
                .inner
                .conn
                .run(Lane::Shared, "XINFO GROUPS", 0, |c: Conn| async move {
                    let queries = run.iter().map(|stream| {
                        let mut c = c.clone();
                        let mut cmd = ::redis::cmd("XINFO");
                        cmd.arg("GROUPS").arg(*stream);
                        async move { cmd.query_async::<Value>(&mut c).await }
                    });
                    let mut replies = Vec::with_capacity(run.len());
                    for reply in futures_util::future::join_all(queries).await {
                        match reply {
                            Ok(value) => replies.push(value),
                            // The stream does not exist yet: nothing was delivered from it.
                            Err(err) if no_such_key(&err) => replies.push(Value::Nil),
                            Err(err) => return Err(err),
                        }
                    }
                    Ok((replies, c))
                })
                .await?;
            out.extend(replies);
        }
        Ok(out)
    }
}

/// Most `XINFO GROUPS` of one run under one deadline on a Redis Cluster.
const XINFO_RUN_MAX: usize = 64;

/// Most `XINFO GROUPS` in one pipeline under one deadline on a single server.
const XINFO_PIPELINE_MAX: usize = 1_024;

/// Redis's answer to `XINFO GROUPS` of a stream that does not exist.
fn no_such_key(err: &::redis::RedisError) -> bool {
    err.code() == Some("ERR") && err.to_string().contains("no such key")
}

/// The `last-delivered-id` of `group` in an XINFO GROUPS reply (a list of groups, each a flat
/// field/value list in RESP2 or a map in RESP3); `0-0` when the group is not listed.
fn last_delivered(reply: &Value, group: &str) -> Result<EntryId, StoreError> {
    let groups: &[Value] = match reply {
        Value::Nil => return Ok(ZERO_ID),
        Value::Array(groups) => groups,
        other => return Err(protocol("XINFO GROUPS", other)),
    };
    for info in groups {
        let pairs: Vec<(&Value, &Value)> = match info {
            Value::Array(flat) => flat.chunks(2).filter_map(|kv| Some((kv.first()?, kv.get(1)?))).collect(),
            Value::Map(kv) => kv.iter().map(|(k, v)| (k, v)).collect(),
            other => return Err(protocol("XINFO GROUPS entry", other)),
        };
        let field = |name: &str| pairs.iter().find(|(k, _)| text(k).as_deref() == Some(name)).map(|(_, v)| *v);
        if field("name").and_then(text).as_deref() != Some(group) {
            continue;
        }
        let id = field("last-delivered-id").ok_or_else(|| protocol("XINFO GROUPS last-delivered-id", info))?;
        return text(id).ok_or_else(|| protocol("XINFO GROUPS last-delivered-id", id))?.parse();
    }
    Ok(ZERO_ID)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn last_delivered_is_read_for_the_named_group_only() {
        let group = |name: &str, id: &str| {
            Value::Array(vec![
                bulk("name"),
                bulk(name),
                bulk("pending"),
                Value::Int(0),
                bulk("last-delivered-id"),
                bulk(id),
            ])
        };
        let reply = Value::Array(vec![group("other", "9-9"), group("g", "5-1")]);
        assert_eq!(last_delivered(&reply, "g"), Ok(EntryId { ms: 5, seq: 1 }));
        assert_eq!(last_delivered(&reply, "missing"), Ok(ZERO_ID));
        assert_eq!(last_delivered(&Value::Nil, "g"), Ok(ZERO_ID));
        assert!(matches!(last_delivered(&Value::Int(1), "g"), Err(StoreError::Protocol(_))));
    }
}
