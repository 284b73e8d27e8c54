//! Fences at the resource on Redis (DESIGN §10): the Lua scripts that raise a shard's fence key
//! and that check it in the same atomic step as the stream operation it guards, and the parsing
//! of their replies.
//!
//! Owns: the fence script texts, their reply shapes, and the rule they share with the fake
//! (`store/memory/fences.rs`): accept exactly the fence the key holds, or a fence with a strictly
//! larger counter (which replaces it, so a raise lost in a failover heals on the newer grant's
//! first use); refuse anything else as [`StoreError::Fenced`] and touch nothing.
//! Never: blocks inside a script (no `BLOCK`: blocking waits happen outside, unfenced), compares
//! counters as Lua numbers (doubles lose integers above 2^53; counters are compared as canonical
//! decimal strings, by length then text, which is exact for any length), or returns a counter as
//! a Lua number (the raise reads it back with HGET, a decimal string).
//! Invariant: every script touches only the fence key, its gates (`GATES`: `<fence key>:gate:…`,
//! named inside the script from the key, so in its hash tag) and the shard's stream, which all
//! share the stream's hash slot (`keys::fence_key`), so each stays on one Redis Cluster node.
//! Invariant: a gate exists only while the fence key holds exactly its value — the gated reads
//! (`streams.rs`) rely on it.
//!
//! Errors of the stream command inside a fenced script (`NOGROUP`, `WRONGTYPE`) are caught with
//! `redis.pcall` and returned as the script's error reply, which carries the command's own error
//! code and text: the store maps them exactly as it maps the unfenced command's errors.

use ::redis::{Script, Value};

use super::scripts::{number, text};
use crate::core::model::Fence;
use crate::store::StoreError;

/// A fence's *gate* (DESIGN §10): an empty stream `<fence key>:gate:<counter>.<nonce>` with the
/// consumer group, which exists only while the fence key holds exactly that value. A fenced read
/// of new entries is then a plain `XREADGROUP … STREAMS <gate> <stream> > >`: Redis answers
/// `NOGROUP` to the whole command unless the gate exists, and the entries never pass through Lua.
/// Every script that changes the fence key closes the old value's gate and opens the new one in
/// the same atomic step; nothing else creates gates. Closing comes *before* the key changes and
/// opening after: a script that fails midway keeps its earlier writes (Redis does not roll a
/// script back), so a failure can leave a value without its gate (reads fall back to the script)
/// but never a gate for a value the key does not hold. Opening is best effort (`pcall`: a user
/// without `EXISTS`/`PEXPIRE`, or a server out of memory, just reads through the script), and a
/// gate lives 10 s (`PEXPIRE`; the next fallback reopens it): that bounds a gate the rule cannot
/// close — one whose fence key was deleted by hand or evicted, or whose counter was hand-edited
/// into something that is not a number. The gate shares the fence key's hash tag (so its slot),
/// and the consumer group is the fence key's last segment (group names have no ':').
const GATES: &str = r#"
local function gate_of(key, counter, nonce)
  return key .. ':gate:' .. counter .. '.' .. nonce
end
local function open_gate(key, counter, nonce)
  local gate = gate_of(key, counter, nonce)
  local group = string.match(key, ':fence:([^:]+)$')
  if not group or redis.pcall('EXISTS', gate) ~= 0 then
    return
  end
  local made = redis.pcall('XGROUP', 'CREATE', gate, group, '$', 'MKSTREAM')
  if type(made) ~= 'table' or not made.err then
    redis.pcall('PEXPIRE', gate, 10000)
  end
end
local function close_gate(key, counter, nonce)
  if counter and nonce then
    return redis.call('DEL', gate_of(key, counter, nonce))
  end
end
"#;

/// The fence check every fenced script runs first: `check(key, counter, nonce, open)` with the
/// fence key and the presented counter (canonical decimal) and nonce (16 hex digits). Returns nil
/// to go on, or the `{'fenced', counter, nonce}` reply to return. A missing key (or counter field)
/// counts as 0 and accepts any counter up to `Fence::COUNTER_MAX` (2^53 − 1). A larger one never
/// replaces the key (it is refused like a stale one unless it is exactly the key's value, which
/// raises reach from there): the raise is `HINCRBY`, which fails above 2^63 − 1, so a made-up
/// counter near it, installed, would keep every later grant of the shard from raising its fence,
/// for ever (no coordinator hands one out; a client that made one up gets `FENCED` and reports it,
/// and the next grant heals). A stored counter that is not canonical decimal is
/// `{'corrupt'}` (a hand edit): nothing is touched. A replaced value's gate is closed and the new
/// one opened; `open` also (re)opens the gate of an exactly matching value (the read scripts: a
/// gated read that found no gate falls back to them, and they leave the gate in place).
const CHECK: &str = r#"
local function newer(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end
local function canonical(s)
  return s == '0' or string.match(s, '^[1-9][0-9]*$') ~= nil
end
local function check(key, presented, nonce, open)
  local cur = redis.call('HMGET', key, 'counter', 'nonce')
  local counter = cur[1] or '0'
  if not canonical(counter) or not canonical(presented) then
    return {'corrupt', counter}
  end
  if cur[1] and counter == presented and cur[2] == nonce then
    if open then
      open_gate(key, presented, nonce)
    end
    return nil
  end
  if (not cur[1] or newer(presented, counter)) and not newer(presented, '9007199254740991') then
    close_gate(key, cur[1], cur[2])
    redis.call('HSET', key, 'counter', presented, 'nonce', nonce)
    open_gate(key, presented, nonce)
    return nil
  end
  return {'fenced', counter, cur[2] or ''}
end
"#;

/// Raise. KEYS: fence key. ARGV: nonce (16 hex digits), floor (canonical decimal,
/// `FenceRaise::floor`: the coordinator's wall clock in ms). The counter becomes `counter + 1`,
/// or, for a key that holds none (new, or vanished: evicted, flushed, a restart without
/// persistence), the floor (1 if it is 0), so a vanished key does not restart at 1 below the
/// counters of earlier grants. A counter that is not canonical decimal (a hand edit, or an
/// application's `HSET`) counts as none: every fenced operation refuses it (`CHECK`), so no grant
/// of it is in use, and `HINCRBY` on it failed the whole batch of the group's raises — every write
/// of the group, until someone repaired the key by hand (a numbers review). So does `0`, which
/// only a client's check can install (on a key without a counter): counted up, it would restart
/// the key at 1 below the floor. The old value's gate, named by a counter the key no longer holds,
/// is not closed here: it expires within 10 s, as the gate of a vanished key does. Closes the old value's gate and opens the new one. Reply:
/// `{counter}`, the new counter as a decimal string (read back with HGET after the increment, or
/// the floor as given, so it never passes through a Lua number), or `{counter, gate}` when the old value's gate was not
/// found here: expired, never opened — or, on a Cluster, still on the source node of a slot move
/// that has taken the fence key already (a script reaches only its own node's keys; the gate,
/// moved later, would let the old value's gated reads through). The store then deletes `gate`
/// by name before the raise returns (`RedisStore::raise_fences`), wherever it is.
const RAISE: &str = r#"
local cur = redis.call('HMGET', KEYS[1], 'counter', 'nonce')
if cur[1] and not string.match(cur[1], '^[1-9][0-9]*$') then
  cur[1] = false
end
local closed = close_gate(KEYS[1], cur[1], cur[2])
local counter
if cur[1] then
  redis.call('HINCRBY', KEYS[1], 'counter', 1)
  counter = redis.call('HGET', KEYS[1], 'counter')
elseif ARGV[2] and ARGV[2] ~= '0' then
  counter = ARGV[2]
else
  counter = '1'
end
redis.call('HSET', KEYS[1], 'counter', counter, 'nonce', ARGV[1])
open_gate(KEYS[1], counter, ARGV[1])
if closed == 0 then
  return {counter, gate_of(KEYS[1], cur[1], cur[2])}
end
return {counter}
"#;

/// Fenced XREADGROUP (never BLOCK). KEYS: fence key, stream. ARGV: counter, nonce, group,
/// consumer, count, `>` or `0`. Reply: `{'ok', entries}` | check refusal | the command's error.
const READ_BODY: &str = r#"
local refused = check(KEYS[1], ARGV[1], ARGV[2], true)
if refused then
  return refused
end
local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[3], ARGV[4], 'COUNT', ARGV[5], 'STREAMS', KEYS[2], ARGV[6])
if type(r) == 'table' and r.err then
  return r
end
if not r or not r[1] then
  return {'ok', {}}
end
return {'ok', r[1][2]}
"#;

/// The fast path of a fenced XACK, shared by the ack scripts: `ack_exact(key, presented, nonce,
/// stream, group, first, last)` acks `ARGV[first..=last]` (1 to 1,000 ids) and returns
/// `{'ok', count}` when the fence key holds exactly the presented value and that value is a
/// canonical counter above 0 — the one case in which `CHECK` writes nothing and lets the XACK run
/// (`open` is false for acks). Anything else returns nil having written nothing, and the caller
/// runs the full check and XACK, which decide exactly as without this path: another or a missing
/// value, a counter of `0` or a hand edit, more than 1,000 ids, no id, a fence key of another
/// type, or an XACK that failed (it did nothing, and the full path repeats it to report its error
/// as before). Why it exists: the full path's helpers (`GATES`, `CHECK`, `EACH_SHARD`) are
/// closures built on every call; an ack whose fence is current, nearly every ack, builds none
/// (the full path's are built inside `ack_full` only when it runs): 8–15% less Redis time per
/// batched call in `redis-benchmark`, the single one within noise (README, Benchmarks). A fallback
/// after a failed HMGET or XACK runs that command again, so INFO's error and call counts (and
/// the ACL log, for a user refused it) count it twice; replies and data are as without the fast
/// path.
const ACK_EXACT: &str = r#"
local function ack_exact(key, presented, nonce, stream, group, first, last)
  if last < first or last - first >= 1000 or not string.find(presented, '^[1-9][0-9]*$') then
    return nil
  end
  local cur = redis.pcall('HMGET', key, 'counter', 'nonce')
  if cur[1] ~= presented or cur[2] ~= nonce then
    return nil
  end
  local acked = redis.pcall('XACK', stream, group, unpack(ARGV, first, last))
  if type(acked) ~= 'number' then
    return nil
  end
  return {'ok', acked}
end
"#;

/// Fenced XACK. KEYS: fence key, stream. ARGV: counter, nonce, group, ids... (none: the check
/// alone, acknowledging 0). Reply: `{'ok', count}` | check refusal | the command's error.
/// `ACK_EXACT` first; the full check (built only then) for the rest, which acks 1,000 ids per
/// XACK (Lua's `unpack` is bounded by its stack: one XACK of about 8,000 ids failed the script).
/// Only valid ids reach it (the store sends `EntryId`s), so no later chunk fails after an earlier
/// one acked.
const ACK_BODY: &str = r#"
local fast = ack_exact(KEYS[1], ARGV[1], ARGV[2], KEYS[2], ARGV[3], 4, #ARGV)
if fast then
  return fast
end
local function ack_full()
"#;

/// The rest of the fenced XACK: the full check and the XACK, as before `ACK_EXACT` (closes
/// `ack_full`, whose body is `GATES`, `CHECK` and this).
const ACK_FULL_BODY: &str = r#"
  local refused = check(KEYS[1], ARGV[1], ARGV[2], false)
  if refused then
    return refused
  end
  local acked = 0
  local first = 4
  while first <= #ARGV do
    local upto = math.min(first + 999, #ARGV)
    local r = redis.pcall('XACK', KEYS[2], ARGV[3], unpack(ARGV, first, upto))
    if type(r) == 'table' and r.err then
      return r
    end
    acked = acked + r
    first = upto + 1
  end
  return {'ok', acked}
end
return ack_full()
"#;

/// Fenced XAUTOCLAIM pages. KEYS: fence key, stream. ARGV: counter, nonce, group, consumer,
/// min-idle-ms, start cursor, page COUNT, pages max. Loops over at most `pages max` pages inside
/// the script (bounded, so one call never holds the server long). Reply: `{'ok', next cursor,
/// entries}` (`0-0`: the pending list was scanned to its end) | check refusal | the command's
/// error.
const CLAIM_BODY: &str = r#"
local refused = check(KEYS[1], ARGV[1], ARGV[2], false)
if refused then
  return refused
end
local cursor = ARGV[6]
local out = {}
for _ = 1, tonumber(ARGV[8]) do
  local r = redis.pcall('XAUTOCLAIM', KEYS[2], ARGV[3], ARGV[4], ARGV[5], cursor, 'COUNT', ARGV[7])
  if type(r) == 'table' and r.err then
    return r
  end
  cursor = r[1]
  local page = r[2]
  for i = 1, #page do
    out[#out + 1] = page[i]
  end
  if cursor == '0-0' then
    break
  end
end
return {'ok', cursor, out}
"#;

/// The batched read script's loop (the batched ack script applies the same rule, `SHARD_OUTCOME`,
/// in its own loop): runs `one(i, ...)` for every shard under Lua's `pcall`, so an
/// error of one shard's commands (a fence key of another type, a missing group) is that shard's
/// `{'error', text}` and the other shards go on. A server that is no longer a writable master
/// (`READONLY`, `MASTERDOWN`, or `NOREPLICAS`: a master cut off from its replicas) fails the
/// whole call instead, as the single-shard scripts do, so
/// the client drops the connection and finds the new master. (An error element inside an array
/// reply would fail the whole call in the client: errors travel as text.)
const EACH_SHARD: &str = r#"
local function each_shard(one)
  local out = {}
  for i = 1, #KEYS / 2 do
    local result, whole = shard_outcome(pcall(one, i))
    if whole then
      return whole
    end
    out[i] = result
  end
  return out
end
"#;

/// The batched scripts' rule for one shard's outcome under Lua's `pcall` (see `EACH_SHARD`):
/// `shard_outcome(ok, result)` returns the shard's reply — its result, or `{'error', text}` — or,
/// for a server that is no longer a writable master, `nil` and the error reply that fails the
/// whole call.
const SHARD_OUTCOME: &str = r#"
local function shard_outcome(ok, result)
  if ok then
    return result
  end
  local text = type(result) == 'table' and result.err or tostring(result)
  if string.find(text, '^READONLY') or string.find(text, '^MASTERDOWN') or string.find(text, '^NOREPLICAS') then
    return nil, redis.error_reply(text)
  end
  return {'error', text}
end
"#;

/// Fenced XREADGROUPs of several shards for one consumer (never BLOCK), each shard checked and
/// read as `READ_BODY` does. KEYS: fence key and stream of each shard, in pairs. ARGV: group,
/// consumer, then per shard: counter, nonce, count, `>` or `0`. Reply: one element per shard,
/// `{'ok', entries}` | check refusal | `{'error', text}` (see `EACH_SHARD`).
const READ_MANY_BODY: &str = r#"
return each_shard(function(i)
  local a = 2 + (i - 1) * 4
  local refused = check(KEYS[2 * i - 1], ARGV[a + 1], ARGV[a + 2], true)
  if refused then
    return refused
  end
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[a + 3], 'STREAMS', KEYS[2 * i], ARGV[a + 4])
  if not r or not r[1] then
    return {'ok', {}}
  end
  return {'ok', r[1][2]}
end)
"#;

/// Fenced XACKs of several shards, each as `ACK_BODY`. KEYS: fence key and stream of each shard,
/// in pairs. ARGV: group, then per shard: counter, nonce, the number of ids `n`, then the `n`
/// ids. Reply: one element per shard, `{'ok', count}` | check refusal | `{'error', text}`. Ids
/// are acked 1,000 per XACK (Lua's `unpack` is bounded by its stack). Each shard tries
/// `ACK_EXACT` first; the others go through `ack_full(i, a)` (the full check and XACKs, whose
/// helpers are built only when it runs) under Lua's `pcall`, with `EACH_SHARD`'s rule for errors
/// (`SHARD_OUTCOME`; not through `each_shard`, whose closure per call the fast path avoids). The
/// id counts are all read before any shard is acked, as before the fast path: a malformed one
/// fails the whole call having done nothing.
const ACK_MANY_HEAD: &str = r#"
local function ack_full(i, a)
"#;

/// The body of `ack_full` after its helpers, the end of its definition, and the loop over the
/// shards.
const ACK_MANY_BODY: &str = r#"
  local last = a + 2 + tonumber(ARGV[a + 2])
  local refused = check(KEYS[2 * i - 1], ARGV[a], ARGV[a + 1], false)
  if refused then
    return refused
  end
  local acked = 0
  local first = a + 3
  while first <= last do
    local upto = math.min(first + 999, last)
    acked = acked + redis.call('XACK', KEYS[2 * i], ARGV[1], unpack(ARGV, first, upto))
    first = upto + 1
  end
  return {'ok', acked}
end
local counts = {}
local a = 2
for i = 1, #KEYS / 2 do
  counts[i] = tonumber(ARGV[a + 2])
  a = a + 3 + counts[i]
end
local out = {}
a = 2
for i = 1, #KEYS / 2 do
  local n = counts[i]
  local result = ack_exact(KEYS[2 * i - 1], ARGV[a], ARGV[a + 1], KEYS[2 * i], ARGV[1], a + 3, a + 2 + n)
  if not result then
    local whole
    result, whole = shard_outcome(pcall(ack_full, i, a))
    if whole then
      return whole
    end
  end
  out[i] = result
  a = a + 3 + n
end
return out
"#;

/// XAUTOCLAIM pages one fenced claim script call runs at most: bounds how long one call holds
/// the server (at the default page COUNT of 100, 1,000 entries).
pub(crate) const CLAIM_PAGES_PER_CALL: u64 = 10;

/// The fence scripts, hashed once per store.
pub(crate) struct FenceScripts {
    pub(crate) raise: Script,
    pub(crate) read: Script,
    pub(crate) ack: Script,
    pub(crate) claim: Script,
    pub(crate) read_many: Script,
    pub(crate) ack_many: Script,
}

impl FenceScripts {
    pub(crate) fn new() -> Self {
        let [raise, read, ack, claim, read_many, ack_many] = Self::sources().map(|source| Script::new(&source));
        Self { raise, read, ack, claim, read_many, ack_many }
    }

    /// The scripts' texts: raise, read, ack, claim, read many, ack many.
    pub(crate) fn sources() -> [String; 6] {
        [
            format!("{GATES}{RAISE}"),
            format!("{GATES}{CHECK}{READ_BODY}"),
            format!("{ACK_EXACT}{ACK_BODY}{GATES}{CHECK}{ACK_FULL_BODY}"),
            format!("{GATES}{CHECK}{CLAIM_BODY}"),
            format!("{GATES}{CHECK}{SHARD_OUTCOME}{EACH_SHARD}{READ_MANY_BODY}"),
            format!("{ACK_EXACT}{SHARD_OUTCOME}{ACK_MANY_HEAD}{GATES}{CHECK}{ACK_MANY_BODY}"),
        ]
    }
}

fn protocol(what: &str, value: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: unexpected reply {value:?}"))
}

/// Parses the raise script's reply: the new counter (decimal).
/// Parses a raise script's reply: the new fence, and the old value's gate if the script did not
/// find it to close (see `RAISE`).
pub(crate) fn parse_raise(reply: &Value, nonce: u64) -> Result<(Fence, Option<String>), StoreError> {
    let bad = || protocol("fence raise script", reply);
    let Value::Array(items) = reply else { return Err(bad()) };
    let counter = items.first().and_then(number).ok_or_else(bad)?;
    let leftover = match items.get(1) {
        None => None,
        Some(gate) => Some(text(gate).filter(|gate| gate.contains(":gate:")).ok_or_else(bad)?),
    };
    if items.len() > 2 {
        return Err(bad());
    }
    Ok((Fence { counter, nonce }, leftover))
}

/// Parses one HMGET `counter nonce` of a fence key. Both absent: never raised.
pub(crate) fn parse_fence(key: &str, fields: &[Value]) -> Result<Option<Fence>, StoreError> {
    let bad = || StoreError::Layout(format!("fence key {key:?} is not a fence (fields {fields:?})"));
    match fields {
        [Value::Nil, Value::Nil] => Ok(None),
        [counter, nonce] => {
            let counter = number(counter).ok_or_else(bad)?;
            let nonce = text(nonce).filter(|n| n.len() == 16).ok_or_else(bad)?;
            Ok(Some(Fence { counter, nonce: u64::from_str_radix(&nonce, 16).map_err(|_| bad())? }))
        }
        _ => Err(protocol("fence read", &Value::Array(fields.to_vec()))),
    }
}

/// Splits a fenced script's reply: `Ok(rest)` after `'ok'`, or the refusal as
/// [`StoreError::Fenced`] naming what the key holds (`<counter>.<nonce>`).
pub(crate) fn accepted<'a>(what: &str, key: &str, reply: &'a Value) -> Result<&'a [Value], StoreError> {
    let Value::Array(items) = reply else { return Err(protocol(what, reply)) };
    match items.first().and_then(text).as_deref() {
        Some("ok") => Ok(&items[1..]),
        Some("fenced") => {
            let counter = items.get(1).and_then(text).unwrap_or_default();
            let nonce = items.get(2).and_then(text).unwrap_or_default();
            let raw = format!("{counter}.{nonce}");
            // The fake reports `Fence`'s own text; a well-formed stored value reads the same.
            let current = raw.parse::<Fence>().map_or(raw, |f| f.to_string());
            Err(StoreError::Fenced { key: key.to_string(), current })
        }
        Some("corrupt") => Err(StoreError::Layout(format!(
            "fence key {key:?} holds a counter that is not a decimal number: {:?}",
            items.get(1).and_then(text).unwrap_or_default()
        ))),
        _ => Err(protocol(what, reply)),
    }
}

/// The gate stream of `fence` on `fence_key` (see `GATES`): exists only while the key holds
/// exactly `fence`.
pub(crate) fn gate_key(fence_key: &str, fence: &Fence) -> String {
    format!("{fence_key}:gate:{}.{}", fence.counter, fence.nonce_hex())
}

/// The fence check's arguments: counter (decimal) and nonce (16 hex digits).
pub(crate) fn check_args(fence: &Fence) -> (String, String) {
    (fence.counter.to_string(), fence.nonce_hex())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keys;

    #[test]
    fn the_check_refuses_counters_above_the_same_bound_as_the_fake() {
        assert!(CHECK.contains(&format!("not newer(presented, '{}')", Fence::COUNTER_MAX)));
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn refusals_name_the_stored_fence_and_acceptances_pass_the_rest() {
        let key = keys::fence_key(&crate::core::model::GroupId::new("p", "g"), 3);
        let refused = Value::Array(vec![bulk("fenced"), bulk("7"), bulk("00000000000000ab")]);
        assert_eq!(
            accepted("x", &key, &refused),
            Err(StoreError::Fenced { key: key.clone(), current: "7.00000000000000ab".into() })
        );
        let ok = Value::Array(vec![bulk("ok"), Value::Int(2)]);
        assert_eq!(accepted("x", &key, &ok), Ok(&[Value::Int(2)][..]));
        assert!(matches!(
            accepted("x", &key, &Value::Array(vec![bulk("corrupt"), bulk("x")])),
            Err(StoreError::Layout(_))
        ));
        assert!(matches!(accepted("x", &key, &Value::Int(1)), Err(StoreError::Protocol(_))));
    }

    #[test]
    fn fence_reads_parse_or_refuse() {
        assert_eq!(parse_fence("k", &[Value::Nil, Value::Nil]), Ok(None));
        let fence = parse_fence("k", &[bulk("12"), bulk("deadbeef00000001")]);
        assert_eq!(fence, Ok(Some(Fence { counter: 12, nonce: 0xdead_beef_0000_0001 })));
        assert!(matches!(parse_fence("k", &[bulk("x"), bulk("deadbeef00000001")]), Err(StoreError::Layout(_))));
        assert!(matches!(parse_fence("k", &[bulk("1"), Value::Nil]), Err(StoreError::Layout(_))));
        let raised = parse_raise(&Value::Array(vec![bulk("18446744073709551615")]), 5);
        assert_eq!(raised, Ok((Fence { counter: u64::MAX, nonce: 5 }, None)));
        let gate = "redis-stream:coord:{o:0}:fence:g:gate:1.0000000000000001";
        let leftover = parse_raise(&Value::Array(vec![bulk("2"), bulk(gate)]), 5);
        assert_eq!(leftover, Ok((Fence { counter: 2, nonce: 5 }, Some(gate.to_string()))));
        // Only a gate name is deleted by name.
        assert!(parse_raise(&Value::Array(vec![bulk("2"), bulk("orders:0")]), 5).is_err());
        assert!(parse_raise(&bulk("2"), 5).is_err());
    }
}
