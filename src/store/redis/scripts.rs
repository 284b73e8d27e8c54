//! The Lua scripts that make each metadata operation one atomic server-side step, and the parsing
//! of their replies.
//!
//! Owns: the metadata script texts and their reply shapes (the fence scripts are in `fences.rs`),
//! and the store's set of scripts ([`Scripts`]). Every metadata script touches only keys of one group,
//! which share the hash tag `{streamPrefix:consumerGroup}`, so each is Redis Cluster safe; the
//! index key has no hash tag and is never touched from a script.
//! Never: sets a TTL on metadata, writes anything when a check fails, or compares revisions as
//! floating-point numbers (Lua numbers are doubles; revisions travel as decimal strings and the
//! next revision is computed in Rust with checked arithmetic).
//!
//! Scripts are sent with EVALSHA; `redis::Script` loads them with SCRIPT LOAD on NOSCRIPT (a
//! restarted or failed-over server has an empty script cache) and retries once.

use ::redis::{Script, Value};

use super::fences::FenceScripts;
use crate::core::model::MemberId;
use crate::store::{keys, StoreError, StoredRecord, WriteOutcome};

/// Conditional write with liveness guards and removals.
///
/// KEYS: metadata hash, liveness hash. ARGV: expected revision (`""` = create only if absent),
/// expected writeId (`""` = the field must be absent or empty), new revision, aggregate,
/// schemaVersion, layoutVersion, updatedAt, writeId, guard count G, G pairs (member, counter),
/// then the members to remove from the liveness hash.
/// Reply: `{"ok", rev}` | `{"conflict", current-or-nil}` | `{"liveness", member}` | `{"corrupt"}`.
/// The write condition is the whole stamp (revision and writeId, see `CasStamp`): revisions
/// repeat after a rollback, the writeId of a rewritten revision does not. It is checked first: a
/// stale decision is reported as a conflict even when a guard would also fail.
const WRITE: &str = r#"
local exists = redis.call('EXISTS', KEYS[1]) == 1
local current = redis.call('HGET', KEYS[1], 'revision')
if exists and not current then
  return {'corrupt'}
end
if ARGV[1] == '' then
  if exists then
    return {'conflict', current}
  end
elseif current ~= ARGV[1] or (redis.call('HGET', KEYS[1], 'writeId') or '') ~= ARGV[2] then
  return {'conflict', current}
end
local guards = tonumber(ARGV[9])
for i = 0, guards - 1 do
  local member = ARGV[10 + 2 * i]
  local seen = redis.call('HGET', KEYS[2], member) or '0'
  if seen ~= ARGV[11 + 2 * i] then
    return {'liveness', member}
  end
end
redis.call('HSET', KEYS[1], 'aggregate', ARGV[4], 'revision', ARGV[3], 'schemaVersion', ARGV[5],
  'layoutVersion', ARGV[6], 'updatedAt', ARGV[7], 'writeId', ARGV[8])
local batch = {}
for i = 10 + 2 * guards, #ARGV do
  batch[#batch + 1] = ARGV[i]
  if #batch == 200 then
    redis.call('HDEL', KEYS[2], unpack(batch))
    batch = {}
  end
end
if #batch > 0 then
  redis.call('HDEL', KEYS[2], unpack(batch))
end
return {'ok', ARGV[3]}
"#;

/// Heartbeat without a cached copy: reads the metadata fields and, only when the metadata key
/// exists, increments the member's liveness counter (a heartbeat for an unknown group creates
/// no key).
///
/// KEYS: metadata hash, liveness hash. ARGV: member, step. Reply: `{counter, f1..f6}` (counter 0
/// when the key is absent). The counter is the field as stored, read back after the increment:
/// HINCRBY's reply becomes a Lua number, a double, which rounds counters past 2^53.
const TOUCH: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'aggregate', 'revision', 'schemaVersion', 'layoutVersion', 'updatedAt',
  'writeId')
local counter = 0
if f[2] then
  redis.call('HINCRBY', KEYS[2], ARGV[1], ARGV[2])
  counter = redis.call('HGET', KEYS[2], ARGV[1])
end
return {counter, f[1], f[2], f[3], f[4], f[5], f[6]}
"#;

/// Touch-and-stamp, for a heartbeat whose record is cached (`touch_and_check` on a Redis Cluster):
/// if the metadata key exists, increments the member's liveness counter and reads the record's
/// stamp, as one atomic step. KEYS: metadata hash, liveness hash. ARGV: member, step. Reply:
/// `{counter, revision, writeId, schemaVersion, layoutVersion}` (`{0}` and nils, nothing written,
/// when the metadata key is absent). The counter is read back with HGET, a decimal string: HINCRBY's
/// reply would pass through a Lua number, which rounds above 2^53. On a single server the same two commands go as one pipeline,
/// in this order; on a Cluster they cannot (see `touch_and_check_by`), and sent as two requests
/// they may run in either order: a stamp read before an expiry and an increment after it would
/// answer a member the expiry removed (the expiry checked a counter the increment had not moved
/// yet), from a record that still lists its shards.
const TOUCH_STAMP: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'revision', 'writeId', 'schemaVersion', 'layoutVersion')
if not f[1] then
  return {0, false, false, false, false}
end
redis.call('HINCRBY', KEYS[2], ARGV[1], ARGV[2])
return {redis.call('HGET', KEYS[2], ARGV[1]), f[1], f[2], f[3], f[4]}
"#;

/// After a pipelined HINCRBY found the metadata key absent: deletes the liveness hash if the
/// metadata key is still absent (liveness without metadata means nothing; this removes a hash
/// the HINCRBY created). KEYS: metadata hash, liveness hash. Reply: keys deleted.
const FORGET_LIVENESS: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.call('DEL', KEYS[2])
end
return 0
"#;

/// Delete-if-stamp: the same condition as a write (revision and writeId, see `CasStamp`).
/// KEYS: metadata hash, liveness hash. ARGV: expected revision, expected writeId (`""` = the field
/// must be absent or empty). Reply: `{"ok"}` | `{"conflict", current-or-nil}`.
const DELETE: &str = r#"
local current = redis.call('HGET', KEYS[1], 'revision')
if current ~= ARGV[1] or (redis.call('HGET', KEYS[1], 'writeId') or '') ~= ARGV[2] then
  return {'conflict', current}
end
redis.call('DEL', KEYS[1], KEYS[2])
return {'ok'}
"#;

/// Mutex compare-and-delete. KEYS: mutex. ARGV: token. Reply: 1 released, 0 not the holder.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// The six metadata scripts and the four fence scripts (`fences.rs`), hashed once per store.
pub(crate) struct Scripts {
    pub(crate) write: Script,
    pub(crate) touch: Script,
    pub(crate) touch_stamp: Script,
    pub(crate) forget_liveness: Script,
    pub(crate) delete: Script,
    pub(crate) release: Script,
    pub(crate) fences: FenceScripts,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            write: Script::new(WRITE),
            touch: Script::new(TOUCH),
            touch_stamp: Script::new(TOUCH_STAMP),
            forget_liveness: Script::new(FORGET_LIVENESS),
            delete: Script::new(DELETE),
            release: Script::new(RELEASE),
            fences: FenceScripts::new(),
        }
    }

    /// The text of every script, the batched fence scripts too (for running one as `EVAL` where
    /// its `EVALSHA` is answered `NOSCRIPT`, `cluster::DirectNodes::eval_of`).
    pub(crate) fn sources() -> Vec<String> {
        let mut sources: Vec<String> =
            [WRITE, TOUCH, TOUCH_STAMP, FORGET_LIVENESS, DELETE, RELEASE].map(String::from).into();
        sources.extend(FenceScripts::sources());
        sources
    }

    /// (name used in errors, script) for the probe.
    pub(crate) fn all(&self) -> [(&'static str, &Script); 10] {
        [
            ("write script", &self.write),
            ("touch script", &self.touch),
            ("touch-stamp script", &self.touch_stamp),
            ("forget-liveness script", &self.forget_liveness),
            ("delete script", &self.delete),
            ("mutex release script", &self.release),
            ("fence raise script", &self.fences.raise),
            ("fenced read script", &self.fences.read),
            ("fenced ack script", &self.fences.ack),
            ("fenced claim script", &self.fences.claim),
        ]
    }
}

fn protocol(what: &str, value: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: unexpected reply {value:?}"))
}

/// A bulk/simple string reply as UTF-8 text.
pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A decimal counter reply (integer or string form).
pub(crate) fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}

/// Parses the six HMGET'd fields (the seed's five, then `writeId`). All absent: `None` (no
/// record). One of the five absent, or a number that does not parse: `Protocol` (the hash was not
/// written by this layout). An absent `writeId` reads as empty (such a record is never cached).
pub(crate) fn parse_record(fields: &[Value]) -> Result<Option<StoredRecord>, StoreError> {
    if fields.len() != 6 {
        return Err(StoreError::Protocol(format!("metadata read returned {} fields, expected 6", fields.len())));
    }
    if fields.iter().all(|v| matches!(v, Value::Nil)) {
        return Ok(None);
    }
    let names = [
        keys::FIELD_AGGREGATE,
        keys::FIELD_REVISION,
        keys::FIELD_SCHEMA_VERSION,
        keys::FIELD_LAYOUT_VERSION,
        keys::FIELD_UPDATED_AT,
    ];
    let bad = |i: usize| StoreError::Layout(format!("metadata field {:?} is missing or malformed", names[i]));
    let aggregate = text(&fields[0]).ok_or_else(|| bad(0))?;
    let revision = number(&fields[1]).ok_or_else(|| bad(1))?;
    let schema_version = number(&fields[2]).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad(2))?;
    let layout_version = number(&fields[3]).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad(3))?;
    let updated_at_ms = number(&fields[4]).ok_or_else(|| bad(4))?;
    let write_id = match &fields[5] {
        Value::Nil => String::new(),
        other => text(other).ok_or_else(|| StoreError::Layout("metadata field \"writeId\" is malformed".into()))?,
    };
    Ok(Some(StoredRecord { aggregate, revision, schema_version, layout_version, updated_at_ms, write_id }))
}

/// A stored revision reported by a failed check (nil: key absent).
fn current_revision(value: Option<&Value>) -> Result<Option<u64>, StoreError> {
    match value {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => number(v).map(Some).ok_or_else(|| protocol("stored revision", v)),
    }
}

/// Parses the WRITE script's reply.
pub(crate) fn parse_write(reply: &Value) -> Result<WriteOutcome, StoreError> {
    let Value::Array(items) = reply else { return Err(protocol("write script", reply)) };
    match items.first().and_then(text).as_deref() {
        Some("ok") => {
            let revision = items.get(1).and_then(number).ok_or_else(|| protocol("write script", reply))?;
            Ok(WriteOutcome::Written { revision })
        }
        Some("conflict") => Ok(WriteOutcome::RevisionConflict { current: current_revision(items.get(1))? }),
        Some("liveness") => {
            let member: MemberId = items.get(1).and_then(text).ok_or_else(|| protocol("write script", reply))?;
            Ok(WriteOutcome::LivenessChanged { member })
        }
        Some("corrupt") => {
            Err(StoreError::Layout("metadata key exists without a revision field (not written by this layout)".into()))
        }
        _ => Err(protocol("write script", reply)),
    }
}

/// Parses the DELETE script's reply.
pub(crate) fn parse_delete(reply: &Value) -> Result<WriteOutcome, StoreError> {
    let Value::Array(items) = reply else { return Err(protocol("delete script", reply)) };
    match items.first().and_then(text).as_deref() {
        Some("ok") => Ok(WriteOutcome::Written { revision: 0 }),
        Some("conflict") => Ok(WriteOutcome::RevisionConflict { current: current_revision(items.get(1))? }),
        _ => Err(protocol("delete script", reply)),
    }
}

/// Parses the TOUCH script's reply into (liveness counter, record).
pub(crate) fn parse_touch(reply: &Value) -> Result<(u64, Option<StoredRecord>), StoreError> {
    let Value::Array(items) = reply else { return Err(protocol("touch script", reply)) };
    let counter = items.first().and_then(number).ok_or_else(|| protocol("touch script", reply))?;
    Ok((counter, parse_record(items.get(1..).unwrap_or(&[]))?))
}

/// Parses the TOUCH_STAMP script's reply into (liveness counter, the four stamp fields), or
/// `None` when the metadata key is absent (the script wrote nothing).
pub(crate) fn parse_touch_stamp(reply: Value) -> Result<Option<(u64, Vec<Value>)>, StoreError> {
    let bad = |reply: &Value| protocol("touch-stamp script", reply);
    let Value::Array(mut items) = reply else { return Err(bad(&reply)) };
    let liveness = match items.first().and_then(number) {
        Some(liveness) if items.len() == 5 => liveness,
        _ => return Err(bad(&Value::Array(items))),
    };
    if matches!(items[1], Value::Nil) {
        return Ok(None);
    }
    Ok(Some((liveness, items.split_off(1))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn write_replies_parse_to_outcomes() {
        let ok = Value::Array(vec![bulk("ok"), bulk("8")]);
        assert_eq!(parse_write(&ok), Ok(WriteOutcome::Written { revision: 8 }));
        let conflict = Value::Array(vec![bulk("conflict"), bulk("9")]);
        assert_eq!(parse_write(&conflict), Ok(WriteOutcome::RevisionConflict { current: Some(9) }));
        let absent = Value::Array(vec![bulk("conflict")]);
        assert_eq!(parse_write(&absent), Ok(WriteOutcome::RevisionConflict { current: None }));
        let guard = Value::Array(vec![bulk("liveness"), bulk("m1")]);
        assert_eq!(parse_write(&guard), Ok(WriteOutcome::LivenessChanged { member: "m1".into() }));
        assert!(matches!(parse_write(&Value::Array(vec![bulk("corrupt")])), Err(StoreError::Layout(_))));
        assert!(matches!(parse_write(&Value::Int(1)), Err(StoreError::Protocol(_))));
    }

    #[test]
    fn partial_or_malformed_records_are_protocol_errors() {
        let nil = Value::Nil;
        assert_eq!(
            parse_record(&[nil.clone(), nil.clone(), nil.clone(), nil.clone(), nil.clone(), nil.clone()]),
            Ok(None)
        );
        let partial = [bulk("{}"), bulk("3"), nil.clone(), bulk("1"), bulk("5"), bulk("w")];
        assert!(matches!(parse_record(&partial), Err(StoreError::Layout(_))));
        let bad_number = [bulk("{}"), bulk("x"), bulk("1"), bulk("1"), bulk("5"), bulk("w")];
        assert!(matches!(parse_record(&bad_number), Err(StoreError::Layout(_))));
        let five = [bulk("{}"), bulk("3"), bulk("1"), bulk("2"), bulk("5")];
        assert!(matches!(parse_record(&five), Err(StoreError::Protocol(_))));
        let good = [bulk("{}"), bulk("3"), bulk("1"), bulk("2"), bulk("5"), bulk("w")];
        let expected = StoredRecord {
            aggregate: "{}".into(),
            revision: 3,
            schema_version: 1,
            layout_version: 2,
            updated_at_ms: 5,
            write_id: "w".into(),
        };
        assert_eq!(parse_record(&good), Ok(Some(expected.clone())));
        // Written by hand (no writeId): readable, but never cached.
        let by_hand = [bulk("{}"), bulk("3"), bulk("1"), bulk("2"), bulk("5"), nil.clone()];
        let record = parse_record(&by_hand).unwrap().unwrap();
        assert_eq!(record, StoredRecord { write_id: String::new(), ..expected });
        assert_eq!(record.stamp(), None);
    }
}
