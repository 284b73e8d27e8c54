//! [`StreamStore`] on Redis: XADD, XGROUP CREATE, XREADGROUP, XACK, XAUTOCLAIM, and their fenced
//! forms (the scripts of `fences.rs`: fence check and stream command in one atomic step).
//!
//! Owns the stream commands and the parsing of their replies (RESP2 arrays; RESP3 maps are
//! accepted too). Never sends `BLOCK 0` (block forever) and never blocks the shared connection:
//! blocking reads use the dedicated blocking lane.

use ::redis::Value;

use super::conn::{Conn, Lane, WatchedFailure};
use super::fences::{accepted, check_args, gate_key, CLAIM_PAGES_PER_CALL};
use super::scripts::{number, text};
use super::RedisStore;
use crate::store::{
    Doorbell, EntryId, FenceCheck, FencedAck, FencedRead, GroupStart, ReadFrom, StoreError, StreamEntry, StreamStore,
};

/// Upper bound on XAUTOCLAIM pages of one `claim_all_pending`.
const CLAIM_PAGES_MAX: u64 = 100_000;

fn protocol(what: &str, value: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: unexpected reply {value:?}"))
}

/// An id as a command argument (`<ms>-<seq>`), written straight into the command being built:
/// acks and doorbells send one per entry or shard, and no string is made for it.
impl ::redis::ToRedisArgs for EntryId {
    fn write_redis_args<W: ?Sized + ::redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        // Every writer the crate passes (a command's buffer, a script's argument list) is memory:
        // writing to it cannot fail.
        let _ = write!(out.writer_for_next_arg(), "{}-{}", self.ms, self.seq);
    }
}

/// Fence keys the connection of watched acks keeps watching: those of the call, and of earlier
/// calls up to this many in all (each costs an `HMGET` per ack).
const WATCHED_KEYS_MAX: usize = 8;

/// The XREADGROUP id argument of `from`.
fn read_from_id(from: ReadFrom) -> &'static str {
    match from {
        ReadFrom::New => ">",
        ReadFrom::OwnPending => "0",
    }
}

fn entry_id(value: &Value) -> Option<EntryId> {
    match value {
        // Parsed in place: one id per entry read, so no copy of it is made.
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        other => text(other)?.parse().ok(),
    }
}

/// One `[id, [field, value, ...]]` entry. A nil body (the entry was trimmed while pending) gives
/// an entry without fields. Takes the reply apart: field names and values are moved out of it,
/// not copied (the payloads are most of what a read moves).
fn parse_entry(value: Value) -> Result<StreamEntry, StoreError> {
    let Value::Array(mut parts) = value else { return Err(protocol("stream entry", &value)) };
    let Some(id) = parts.first().and_then(entry_id) else {
        return Err(protocol("stream entry id", &Value::Array(parts)));
    };
    let flat = match parts.get_mut(1) {
        None | Some(Value::Nil) => Vec::new(),
        Some(Value::Array(flat)) if flat.len() % 2 == 0 => std::mem::take(flat),
        Some(Value::Array(_)) => return Err(protocol("stream entry fields", &Value::Array(parts))),
        Some(other) => return Err(protocol("stream entry fields", other)),
    };
    let mut fields = Vec::with_capacity(flat.len() / 2);
    let mut flat = flat.into_iter();
    while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
        // Field names are binary-safe in Redis; another writer's non-UTF-8 name is read with its
        // invalid bytes replaced (U+FFFD) rather than failing the read: a read that fails after
        // XREADGROUP delivered the entry would fail again at every re-read of the pending entry
        // and stall the shard. Values keep their exact bytes; a replaced name is logged, since
        // two such names can read alike — the 1st, 2nd, 4th, 8th, ... of the process, so a
        // writer that always uses such names does not make every read log a line per entry.
        let name = match name {
            Value::BulkString(bytes) => String::from_utf8(bytes).unwrap_or_else(|invalid| {
                let name = String::from_utf8_lossy(invalid.as_bytes()).into_owned();
                let seen = NON_UTF8_FIELD_NAMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if seen.is_power_of_two() {
                    tracing::warn!(entry = %id, field = %name, seen, "a stream field name is not UTF-8: read with U+FFFD in place of its invalid bytes (logged at the 1st, 2nd, 4th, ... such name read)");
                }
                name
            }),
            other => text(&other).ok_or_else(|| protocol("stream field name", &other))?,
        };
        let bytes = match value {
            Value::BulkString(bytes) => bytes,
            other => text(&other).ok_or_else(|| protocol("stream field value", &other))?.into_bytes(),
        };
        fields.push((name, bytes));
    }
    Ok(StreamEntry { id, fields })
}

/// Non-UTF-8 field names read by this process (each read of one counts).
static NON_UTF8_FIELD_NAMES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn parse_entries(value: Value) -> Result<Vec<StreamEntry>, StoreError> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) => items.into_iter().map(parse_entry).collect(),
        other => Err(protocol("stream entries", &other)),
    }
}

/// XREADGROUP's reply: nil, `[[stream, entries], ...]`, or a RESP3 map stream -> entries.
fn parse_read_reply(reply: Value) -> Result<Vec<(String, Vec<StreamEntry>)>, StoreError> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::Array(kv) => match <[Value; 2]>::try_from(kv) {
                    Ok([name, entries]) => Ok((name, entries)),
                    Err(kv) => Err(protocol("XREADGROUP", &Value::Array(kv))),
                },
                other => Err(protocol("XREADGROUP", &other)),
            })
            .collect::<Result<_, _>>()?,
        Value::Map(kv) => kv,
        other => return Err(protocol("XREADGROUP", &other)),
    };
    let mut out = Vec::with_capacity(pairs.len());
    for (name, entries) in pairs {
        let stream = text(&name).ok_or_else(|| protocol("XREADGROUP stream name", &name))?;
        let entries = parse_entries(entries)?;
        if !entries.is_empty() {
            out.push((stream, entries));
        }
    }
    Ok(out)
}

impl StreamStore for RedisStore {
    async fn fenced_xreadgroup(
        &self,
        fence: &FenceCheck,
        group: &str,
        consumer: &str,
        stream: &str,
        from: ReadFrom,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        if from == ReadFrom::New && self.inner.options.fenced_read_gates {
            let read = FencedRead { fence: fence.clone(), stream: stream.to_string(), from, count };
            if let Some(Some(entries)) = self.gated_reads(group, consumer, &[&read]).await?.pop() {
                return Ok(entries);
            }
        }
        let (counter, nonce) = check_args(&fence.fence);
        let mut invocation = self.inner.scripts.fences.read.prepare_invoke();
        invocation
            .key(&fence.key)
            .key(stream)
            .arg(counter)
            .arg(nonce)
            .arg(group)
            .arg(consumer)
            .arg(count)
            .arg(read_from_id(from));
        let reply = self.invoke("fenced read script", invocation).await?;
        match accepted("fenced read script", &fence.key, &reply)? {
            [entries] => parse_entries(entries.clone()),
            _ => Err(protocol("fenced read script", &reply)),
        }
    }

    async fn fenced_xreadgroup_many(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError> {
        const WHAT: &str = "fenced read script";
        let parts = self.slot_parts(reads.iter().map(|read| read.stream.as_str()));
        if parts.len() > 1 {
            return self
                .per_slot_each(WHAT, reads, &parts, |part| async move {
                    self.fenced_reads_one_slot(group, consumer, &part).await
                })
                .await;
        }
        self.fenced_reads_one_slot(group, consumer, reads).await
    }

    async fn fenced_xack_many(
        &self,
        group: &str,
        acks: &[FencedAck],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        if acks.is_empty() {
            return Ok(Vec::new());
        }
        let parts = self.slot_parts(acks.iter().map(|ack| ack.stream.as_str()));
        if parts.len() > 1 {
            return self
                .per_slot_each("fenced ack script", acks, &parts, |part| async move {
                    self.fenced_acks_one_slot(group, &part).await
                })
                .await;
        }
        self.fenced_acks_one_slot(group, acks).await
    }

    async fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> Result<u64, StoreError> {
        // Sent even without ids: the fake checks the fence then too, so a stale ack of nothing is
        // still FENCED.
        let (counter, nonce) = check_args(&fence.fence);
        let mut invocation = self.inner.scripts.fences.ack.prepare_invoke();
        invocation.key(&fence.key).key(stream).arg(counter).arg(nonce).arg(group);
        for id in ids {
            invocation.arg(id);
        }
        let reply = self.invoke("fenced ack script", invocation).await?;
        match accepted("fenced ack script", &fence.key, &reply)? {
            [count] => number(count).ok_or_else(|| protocol("fenced ack script", &reply)),
            _ => Err(protocol("fenced ack script", &reply)),
        }
    }

    /// One script call runs up to `CLAIM_PAGES_PER_CALL` XAUTOCLAIM pages after its fence check;
    /// a pending list longer than that takes several calls, each re-checking the fence (the fake
    /// claims everything in one step). A call refused after earlier ones succeeded is `Fenced`:
    /// the entries the earlier calls moved stay pending to `consumer` until the newer owner's
    /// claim takes them, and no call after the newer grant's first use moves anything.
    async fn fenced_claim_all_pending(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let (counter, nonce) = check_args(&fence.fence);
        let page_count = self.inner.options.claim_page_count.max(1);
        let mut claimed = Vec::new();
        let mut cursor = "0-0".to_string();
        for _ in 0..CLAIM_PAGES_MAX.div_ceil(CLAIM_PAGES_PER_CALL) {
            let mut invocation = self.inner.scripts.fences.claim.prepare_invoke();
            invocation
                .key(&fence.key)
                .key(stream)
                .arg(&counter)
                .arg(&nonce)
                .arg(group)
                .arg(consumer)
                .arg(min_idle_ms)
                .arg(&cursor)
                .arg(page_count)
                .arg(CLAIM_PAGES_PER_CALL);
            let reply = self.invoke("fenced claim script", invocation).await?;
            let [next, entries] = accepted("fenced claim script", &fence.key, &reply)? else {
                return Err(protocol("fenced claim script", &reply));
            };
            let next = text(next).ok_or_else(|| protocol("fenced claim script cursor", &reply))?;
            // As in `claim_all_pending`: an entry deleted while pending (6.2: nil body) is not work.
            claimed.extend(parse_entries(entries.clone())?.into_iter().filter(|entry| !entry.fields.is_empty()));
            if next == "0-0" {
                return Ok(claimed);
            }
            cursor = next;
        }
        Err(StoreError::Protocol(format!("fenced XAUTOCLAIM did not finish within {CLAIM_PAGES_MAX} pages")))
    }

    async fn wait_for_entries(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> Result<Doorbell, StoreError> {
        self.doorbell(group, streams, block_ms).await
    }

    async fn xadd(
        &self,
        stream: &str,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    ) -> Result<EntryId, StoreError> {
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(stream);
        if let Some(maxlen) = maxlen {
            cmd.arg("MAXLEN").arg("~").arg(maxlen);
        }
        cmd.arg("*");
        for (name, value) in &fields {
            cmd.arg(name).arg(value.as_slice());
        }
        let reply: Value = self.query("XADD", cmd).await?;
        entry_id(&reply).ok_or_else(|| protocol("XADD", &reply))
    }

    async fn create_group(&self, stream: &str, group: &str, start: GroupStart) -> Result<(), StoreError> {
        let id = match start {
            GroupStart::Beginning => "0",
            GroupStart::Latest => "$",
        };
        let mut cmd = ::redis::cmd("XGROUP");
        cmd.arg("CREATE").arg(stream).arg(group).arg(id).arg("MKSTREAM");
        self.inner
            .conn
            .run(Lane::Shared, "XGROUP CREATE", 0, |mut c: Conn| async move {
                match cmd.query_async::<Value>(&mut c).await {
                    Ok(_) => Ok(((), c)),
                    // The group exists already: ensuring it is a no-op.
                    Err(err) if err.code() == Some("BUSYGROUP") => Ok(((), c)),
                    Err(err) => Err(err),
                }
            })
            .await
    }

    async fn xreadgroup(
        &self,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<(String, Vec<StreamEntry>)>, StoreError> {
        if streams.is_empty() {
            return Ok(Vec::new());
        }
        let block_ms = block_ms.filter(|ms| *ms > 0);
        let parts = self.slot_parts(streams.iter().map(|(stream, _)| stream.as_str()));
        if parts.len() == 1 {
            return self.xreadgroup_one_slot(group, consumer, streams, count, block_ms).await;
        }
        // A Cluster: one non-blocking read per slot, concurrently. A blocking read must not block
        // in several slots at once (each would deliver, and only one answer can be returned), so
        // when nothing came it waits on the doorbell (which consumes nothing) and reads once more.
        let read_all = || async {
            let reads = parts.iter().map(|part| {
                let sub: Vec<(String, ReadFrom)> = part.iter().map(|&i| streams[i].clone()).collect();
                async move { self.xreadgroup_one_slot(group, consumer, &sub, count, None).await }
            });
            let mut out = Vec::new();
            for answer in futures_util::future::join_all(reads).await {
                out.extend(answer?);
            }
            Ok::<_, StoreError>(out)
        };
        let out = read_all().await?;
        let Some(block_ms) = block_ms.filter(|_| out.is_empty()) else { return Ok(out) };
        let new: Vec<(String, Option<EntryId>)> = streams
            .iter()
            .filter(|(_, from)| *from == ReadFrom::New)
            .map(|(stream, _)| (stream.clone(), None))
            .collect();
        if new.is_empty() || !self.doorbell(group, &new, block_ms).await?.rang {
            return Ok(out);
        }
        read_all().await
    }

    async fn xack(&self, stream: &str, group: &str, ids: &[EntryId]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut cmd = ::redis::cmd("XACK");
        cmd.arg(stream).arg(group);
        for id in ids {
            cmd.arg(id);
        }
        self.query("XACK", cmd).await
    }

    async fn claim_all_pending(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let mut claimed = Vec::new();
        let mut cursor = "0-0".to_string();
        for _ in 0..CLAIM_PAGES_MAX {
            let mut cmd = ::redis::cmd("XAUTOCLAIM");
            cmd.arg(stream)
                .arg(group)
                .arg(consumer)
                .arg(min_idle_ms)
                .arg(&cursor)
                .arg("COUNT")
                .arg(self.inner.options.claim_page_count.max(1));
            let reply: Value = self.query("XAUTOCLAIM", cmd).await?;
            // 6.2 replies [cursor, entries]; 7.0+ adds a third element, the ids it dropped from
            // the pending list because their entries were deleted.
            let Value::Array(parts) = &reply else { return Err(protocol("XAUTOCLAIM", &reply)) };
            let next = parts.first().and_then(text).ok_or_else(|| protocol("XAUTOCLAIM cursor", &reply))?;
            // A nil body (6.2: the entry was deleted while pending) is not claimable work; 7.0+
            // drops such ids from the pending list itself. Real entries always have fields.
            let page = parse_entries(parts.get(1).cloned().unwrap_or(Value::Nil))?;
            claimed.extend(page.into_iter().filter(|entry| !entry.fields.is_empty()));
            if next == "0-0" {
                return Ok(claimed);
            }
            cursor = next;
        }
        Err(StoreError::Protocol(format!("XAUTOCLAIM did not finish within {CLAIM_PAGES_MAX} pages")))
    }
}

impl RedisStore {
    /// One XREADGROUP of `streams` (one slot on a Cluster), blocking on the blocking lane.
    async fn xreadgroup_one_slot(
        &self,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<(String, Vec<StreamEntry>)>, StoreError> {
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(group).arg(consumer).arg("COUNT").arg(count);
        if let Some(ms) = block_ms {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS");
        for (stream, _) in streams {
            cmd.arg(stream);
        }
        for (_, from) in streams {
            cmd.arg(read_from_id(*from));
        }
        let (lane, extra_ms) = match block_ms {
            Some(ms) => (Lane::Blocking, ms),
            None => (Lane::Shared, 0),
        };
        let reply: Value = self
            .inner
            .conn
            .run(lane, "XREADGROUP", extra_ms, |mut c: Conn| async move {
                let value: Value = cmd.query_async(&mut c).await?;
                Ok((value, c))
            })
            .await?;
        parse_read_reply(reply)
    }

    /// The fenced reads of one slot (all reads on a single server): gates first, then the read
    /// script for the rest.
    async fn fenced_reads_one_slot(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError> {
        const WHAT: &str = "fenced read script";
        let mut out: Vec<Option<Result<Vec<StreamEntry>, StoreError>>> = reads.iter().map(|_| None).collect();
        if self.inner.options.fenced_read_gates {
            let gated: Vec<usize> = (0..reads.len()).filter(|&i| reads[i].from == ReadFrom::New).collect();
            let via_gates: Vec<&FencedRead> = gated.iter().map(|&i| &reads[i]).collect();
            let answers = self.gated_reads(group, consumer, &via_gates).await?;
            for (i, answer) in gated.into_iter().zip(answers) {
                out[i] = answer.map(Ok);
            }
        }
        // The rest (own-pending reads, and gated reads that found no gate) through the script.
        let rest: Vec<usize> = (0..reads.len()).filter(|&i| out[i].is_none()).collect();
        if rest.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        let scripted: Vec<&FencedRead> = rest.iter().map(|&i| &reads[i]).collect();
        let mut invocation = self.inner.scripts.fences.read_many.prepare_invoke();
        invocation.arg(group).arg(consumer);
        for read in &scripted {
            let (counter, nonce) = check_args(&read.fence.fence);
            invocation.key(&read.fence.key).key(&read.stream);
            invocation.arg(counter).arg(nonce).arg(read.count).arg(read_from_id(read.from));
        }
        let reply = self.invoke(WHAT, invocation).await?;
        let items = self.many_items(WHAT, reply, scripted.len())?;
        for ((i, read), item) in rest.into_iter().zip(scripted).zip(items) {
            out[i] = Some(item.and_then(|item| match accepted(WHAT, &read.fence.key, &item)? {
                [entries] => parse_entries(entries.clone()),
                _ => Err(StoreError::Protocol(format!("{WHAT}: unexpected reply for {}", read.stream))),
            }));
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The fenced acks of one slot (all acks on a single server): watched where it may
    /// ([`RedisStore::watched_acks`]), else one script call.
    async fn fenced_acks_one_slot(
        &self,
        group: &str,
        acks: &[FencedAck],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        let watched = self.inner.options.watched_acks
            && !self.is_cluster()
            && !self.inner.watched_acks_refused.load(std::sync::atomic::Ordering::Relaxed);
        if watched && !acks.is_empty() {
            return self.watched_acks(group, acks).await;
        }
        self.scripted_acks(group, acks).await
    }

    /// Fenced acks without Lua, where Redis's optimistic locking gives what the script's check
    /// gives (DESIGN §10, watched acks). On the connection of watched acks
    /// ([`Connector::run_watched`]), every call ends with `WATCH` of its fence keys (and of
    /// those acked most recently, up to [`WATCHED_KEYS_MAX`] in all), an `HMGET` of each, and
    /// `MULTI`. The next call, if that `MULTI` was answered `OK` (the connection is in the
    /// transaction, so what it sends is queued, not run), sends the `XACK` of each shard whose
    /// key it read holding exactly the presented fence, and `EXEC` (with nothing queued without one),
    /// which Redis runs only if no watched key was written since its `WATCH` (a raise for
    /// another grant, a heal, a hand edit, a flush, even a write of the same value). An `XACK`
    /// is never sent on a connection not known to be in a transaction: a refused `MULTI` is seen
    /// one call before any `XACK` could depend on it. Every other shard — a fence not read yet
    /// or different, a transaction Redis aborted or refused, an `XACK` that failed inside it —
    /// goes to the fenced ack script, which decides as always (`FENCED`, a heal, the stream's own
    /// error): one more round trip, only then. So does every shard when the connection is busy
    /// with another call or fails; a call whose deadline passes fails as a whole, as a script
    /// call would (its transaction may still run, under its `WATCH`). A script call costs Redis
    /// several times these commands (README, data path): Lua's fixed cost per call.
    async fn watched_acks(&self, group: &str, acks: &[FencedAck]) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        const WHAT: &str = "watched fenced acks";
        let presented: Vec<(String, String)> = acks.iter().map(|ack| check_args(&ack.fence.fence)).collect();
        let run = self.inner.conn.run_watched(WHAT, |mut watched| async move {
            // This call's fence keys, then those acked most recently.
            let mut keys: Vec<String> = Vec::new();
            for ack in acks {
                if !keys.contains(&ack.fence.key) {
                    keys.push(ack.fence.key.clone());
                }
            }
            let limit = keys.len().max(WATCHED_KEYS_MAX);
            for key in &watched.recent {
                if keys.len() >= limit {
                    break;
                }
                if !keys.contains(key) {
                    keys.push(key.clone());
                }
            }
            let in_multi = std::mem::take(&mut watched.in_multi);
            let exact: Vec<usize> = (0..acks.len())
                .filter(|&i| {
                    let (counter, nonce) = &presented[i];
                    in_multi
                        && !acks[i].ids.is_empty()
                        && watched.verified.get(&acks[i].fence.key).is_some_and(|(c, n)| {
                            c.as_slice() == counter.as_bytes() && n.as_slice() == nonce.as_bytes()
                        })
                })
                .collect();
            // What the connection watches is known again only from this call's replies.
            watched.verified.clear();
            watched.recent.clear();
            let mut pipe = ::redis::pipe();
            pipe.ignore_errors();
            if in_multi {
                for &i in &exact {
                    pipe.cmd("XACK").arg(&acks[i].stream).arg(group).arg(acks[i].ids.as_slice());
                }
                // Ends the transaction and unwatches every key, whether it ran or not (also
                // with nothing queued: no DISCARD, which the client's ACL need not grant).
                pipe.cmd("EXEC");
            }
            pipe.cmd("WATCH");
            for key in &keys {
                pipe.arg(key);
            }
            for key in &keys {
                pipe.cmd("HMGET").arg(key).arg("counter").arg("nonce");
            }
            pipe.cmd("MULTI");
            let replies: Vec<Value> = pipe.query_async(&mut watched.conn).await?;
            let mut outcomes: Vec<Option<u64>> = vec![None; acks.len()];
            let ended = if in_multi { exact.len() + 1 } else { 0 };
            if replies.len() != ended + 1 + keys.len() + 1 {
                return Ok(((outcomes, false), None));
            }
            // Refused for good: this user may not run the command (ACL; not a key it may not
            // touch, which the script reports for that shard), the server renamed it away, or
            // it is not served here at all (`ERR`: a proxy without transactions).
            let refused = |value: &Value| {
                let Value::ServerError(e) = value else { return false };
                let detail = e.details().unwrap_or_default();
                detail.contains("permissions to run") || detail.starts_with("unknown command") || e.code() == "ERR"
            };
            let mut replies = replies.into_iter();
            let queued: Vec<Value> = replies.by_ref().take(exact.len()).collect();
            let end = if in_multi { replies.next().unwrap_or(Value::Nil) } else { Value::Okay };
            let watch = replies.next().unwrap_or(Value::Nil);
            let fields: Vec<Value> = replies.by_ref().take(keys.len()).collect();
            let multi = replies.next().unwrap_or(Value::Nil);
            // An XACK answered otherwise than QUEUED (or refused) ran: the connection was not in a
            // transaction after all (a proxy that answers MULTI but keeps no connection state).
            // Nothing can undo it; the path is turned off so it never happens again.
            let ran_outside =
                queued.iter().any(|q| !matches!(q, Value::ServerError(_)) && !matches!(q, Value::SimpleString(t) if t == "QUEUED"));
            if ran_outside {
                tracing::error!("watched acks: an XACK sent inside a transaction was not queued; fenced acks run the ack script from now on");
            }
            let denied = ran_outside || refused(&watch) || refused(&multi) || (in_multi && refused(&end));
            let mut healthy = !ran_outside;
            match end {
                // The transaction ran: each XACK's count, or its error (it did nothing: the
                // script decides).
                Value::Array(results) if results.len() == exact.len() => {
                    for (&i, result) in exact.iter().zip(results) {
                        if let Value::Int(count) = result {
                            outcomes[i] = u64::try_from(count).ok();
                        }
                    }
                }
                // Aborted: a watched key was written since it was read. Or no transaction to
                // end (a new connection).
                Value::Nil | Value::Okay => {}
                // Refused as a whole (EXECABORT: a queued XACK was, for a key this user may not
                // touch, READONLY on a demoted master, NOREPLICAS): nothing ran, the script
                // decides those shards. The connection is kept; after a failover the shared
                // connection is replaced and this one follows it (`run_watched`).
                Value::ServerError(e) if e.code() == "EXECABORT" => {}
                _ => healthy = false,
            }
            let watching = matches!(watch, Value::Okay);
            let in_transaction = matches!(multi, Value::Okay);
            healthy &= watching && in_transaction;
            if healthy {
                for (key, fields) in keys.into_iter().zip(fields) {
                    // A key that is missing, not a fence, or refused is just not read.
                    if let Value::Array(fields) = fields {
                        if let [Value::BulkString(counter), Value::BulkString(nonce)] = fields.as_slice() {
                            watched.verified.insert(key.clone(), (counter.clone(), nonce.clone()));
                            watched.recent.push(key);
                        }
                    }
                }
                watched.in_multi = true;
            }
            Ok(((outcomes, denied), healthy.then_some(watched)))
        });
        let outcomes = match run.await {
            Ok((outcomes, denied)) => {
                if denied && !self.inner.watched_acks_refused.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        "the server refused MULTI, EXEC or WATCH to this store's user (ACL), does not know or serve \
                         them: fenced acks run the ack script from now on (README: the client user's ACL)"
                    );
                }
                outcomes
            }
            // A call that may still run at Redis fails as a script call would.
            Err(WatchedFailure::TimedOut(error)) => return Err(error),
            // The script decides every shard, on the shared connection.
            Err(WatchedFailure::Busy) => vec![None; acks.len()],
            Err(WatchedFailure::Failed(error)) => {
                tracing::debug!(%error, "watched acks: the connection failed; the ack script decides");
                vec![None; acks.len()]
            }
        };
        // Nothing acked yet: the script decides the call as it would have, failing it as a whole
        // where it fails as a whole (a demoted master, NOREPLICAS: the caller replaces the
        // connection).
        if outcomes.iter().all(Option::is_none) {
            return self.scripted_acks(group, acks).await;
        }
        let rest: Vec<FencedAck> =
            acks.iter().zip(&outcomes).filter(|(_, outcome)| outcome.is_none()).map(|(ack, _)| ack.clone()).collect();
        // A script call that fails as a whole fails only the shards it was to decide: the others
        // were acked.
        let mut decided: Box<dyn Iterator<Item = Result<u64, StoreError>> + Send> =
            match self.scripted_acks(group, &rest).await {
                Ok(results) => Box::new(results.into_iter()),
                Err(error) => Box::new(std::iter::repeat_with(move || Err(error.clone()))),
            };
        Ok(outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Some(count) => Ok(count),
                None => decided
                    .next()
                    .unwrap_or_else(|| Err(StoreError::Protocol(format!("{WHAT}: fewer results than shards")))),
            })
            .collect())
    }

    /// The fenced acks of one slot through one call of the fenced ack script.
    async fn scripted_acks(&self, group: &str, acks: &[FencedAck]) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        const WHAT: &str = "fenced ack script";
        if acks.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.inner.scripts.fences.ack_many.prepare_invoke();
        invocation.arg(group);
        for ack in acks {
            let (counter, nonce) = check_args(&ack.fence.fence);
            invocation.key(&ack.fence.key).key(&ack.stream);
            invocation.arg(counter).arg(nonce).arg(ack.ids.len());
            for id in &ack.ids {
                invocation.arg(id);
            }
        }
        let reply = self.invoke(WHAT, invocation).await?;
        let items = self.many_items(WHAT, reply, acks.len())?;
        Ok(acks
            .iter()
            .zip(items)
            .map(|(ack, item)| match accepted(WHAT, &ack.fence.key, &item?)? {
                [count] => number(count).ok_or_else(|| protocol(WHAT, count)),
                _ => Err(StoreError::Protocol(format!("{WHAT}: unexpected reply for {}", ack.stream))),
            })
            .collect())
    }

    /// Fenced reads of new entries through their gates (see `fences.rs`): plain `XREADGROUP`s
    /// that name each read's gate beside its stream, one command per distinct COUNT (the shares
    /// of one poll differ by at most one, so one or two commands), all in one pipeline (one round
    /// trip). Per read: the entries, or `None` when Redis refused its command (a gate is gone — an
    /// older or newer grant's value, or a raise a failover lost — or a stream's own error: one
    /// refused shard fails the reads that share its command); the caller then runs the fenced
    /// read script for those, which decides and reports exactly as without gates (and reopens the
    /// gate of a value the key holds). The fallback is a second round trip after the caller's
    /// lease check: like any read that reaches Redis late, it runs only under the fence the key
    /// still holds, and the consumer drops entries returned after its lease (the next owner
    /// claims them).
    async fn gated_reads(
        &self,
        group: &str,
        consumer: &str,
        reads: &[&FencedRead],
    ) -> Result<Vec<Option<Vec<StreamEntry>>>, StoreError> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let mut by_count: std::collections::BTreeMap<usize, Vec<usize>> = std::collections::BTreeMap::new();
        for (i, read) in reads.iter().enumerate() {
            by_count.entry(read.count).or_default().push(i);
        }
        let mut pipe = ::redis::pipe();
        pipe.ignore_errors();
        for (count, members) in &by_count {
            pipe.cmd("XREADGROUP").arg("GROUP").arg(group).arg(consumer).arg("COUNT").arg(*count).arg("STREAMS");
            for &i in members {
                pipe.arg(gate_key(&reads[i].fence.key, &reads[i].fence.fence)).arg(&reads[i].stream);
            }
            for _ in 0..members.len() * 2 {
                pipe.arg(">");
            }
        }
        let replies: Vec<Value> = self.pipeline("XREADGROUP", pipe).await?;
        if replies.len() != by_count.len() {
            return Err(StoreError::Protocol(format!(
                "gated reads: {} replies for {} commands",
                replies.len(),
                by_count.len()
            )));
        }
        let mut out: Vec<Option<Vec<StreamEntry>>> = vec![None; reads.len()];
        for (members, reply) in by_count.values().zip(replies) {
            // A refusal, or a reply that does not parse: the script decides for these reads.
            let Ok(mut streams) = parse_read_reply(reply) else { continue };
            for &i in members {
                let at = streams.iter().position(|(name, _)| *name == reads[i].stream);
                out[i] = Some(at.map(|at| streams.swap_remove(at).1).unwrap_or_default());
            }
        }
        Ok(out)
    }

    /// The per-shard elements of a `*_many` script's reply (one per shard, in order); an
    /// `{'error', text}` element is that shard's error, mapped as the command's own.
    fn many_items(&self, what: &str, reply: Value, n: usize) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        let Value::Array(items) = reply else { return Err(protocol(what, &reply)) };
        if items.len() != n {
            return Err(StoreError::Protocol(format!("{what}: {} replies for {n} shards", items.len())));
        }
        Ok(items
            .into_iter()
            .map(|item| match &item {
                Value::Array(parts) if parts.first().and_then(text).as_deref() == Some("error") => {
                    let message = parts.get(1).and_then(text).unwrap_or_default();
                    Err(self.inner.conn.nested_error(what, &message))
                }
                _ => Ok(item),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// An id argument is the same bytes its text is, in a command and in a script's arguments.
    #[test]
    fn an_id_argument_is_its_text() {
        let id = EntryId { ms: 1_700_000_000_123, seq: u64::MAX };
        let mut with_id = ::redis::cmd("XACK");
        with_id.arg(id);
        let mut with_text = ::redis::cmd("XACK");
        with_text.arg(id.to_string());
        assert_eq!(with_id.get_packed_command(), with_text.get_packed_command());
        let mut args: Vec<Vec<u8>> = Vec::new();
        ::redis::ToRedisArgs::write_redis_args(&id, &mut args);
        assert_eq!(args, vec![b"1700000000123-18446744073709551615".to_vec()]);
    }

    #[test]
    fn read_replies_keep_stream_order_and_drop_empty_streams() {
        let reply = Value::Array(vec![
            Value::Array(vec![bulk("s:1"), Value::Array(vec![])]),
            Value::Array(vec![
                bulk("s:0"),
                Value::Array(vec![
                    Value::Array(vec![bulk("5-1"), Value::Array(vec![bulk("k"), bulk("v")])]),
                    Value::Array(vec![bulk("6-0"), Value::Nil]),
                ]),
            ]),
        ]);
        let parsed = parse_read_reply(reply).unwrap_or_default();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].0, "s:0");
        assert_eq!(parsed[0].1[0].id, EntryId { ms: 5, seq: 1 });
        assert_eq!(parsed[0].1[0].fields, vec![("k".to_string(), b"v".to_vec())]);
        assert!(parsed[0].1[1].fields.is_empty());
        assert_eq!(parse_read_reply(Value::Nil), Ok(Vec::new()));
        assert!(matches!(parse_read_reply(Value::Int(3)), Err(StoreError::Protocol(_))));
    }
}
