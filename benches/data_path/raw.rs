//! The `raw` row: the same work done with the `redis` crate directly, no library in between —
//! the physical limit the libraries are compared to.
//!
//! Publishing is one `XADD <prefix>:<shard> * key <k> payload <p>` per message, the shard chosen
//! with the producers' hash (`rsc::client::hash::shard_for_key`). Consumer `i` of `C` reads the
//! shards `s` with `s % C == i` (the static version of the coordinator's assignment) with one
//! `XREADGROUP ... COUNT n/k BLOCK w STREAMS <its k shards> > ...` per read (at most `n` entries,
//! like the library's `poll(n)`) and acks what it got with one XACK per stream, pipelined: two
//! round trips per busy read, one per idle wait.
//! The `raw-piggy` row instead holds a batch ([`HoldAcks`]) and sends its XACKs in one pipeline
//! with the next, non-blocking, read: the physical limit of acks that ride on the next read. That
//! pipeline counts as a read and an ack round trip, as the library's overlapping calls do.
//! Every publisher and subscriber has its own multiplexed connection, as each library client has
//! its own `RedisStore`. Never parses more of a reply than the payload field.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

use crate::counted::TripCounters;
use crate::workload::{payload_of, Board, HoldAcks, Publisher, Subscriber};

/// A reply may take this long beyond a read's BLOCK time.
const RESPONSE_MARGIN: Duration = Duration::from_secs(5);

/// The stream keys and consumer group of the raw row.
#[derive(Clone, Debug)]
pub struct RawGroup {
    pub prefix: String,
    pub group: String,
    pub shards: u32,
}

impl RawGroup {
    fn stream(&self, shard: u32) -> String {
        format!("{}:{}", self.prefix, shard)
    }
}

async fn connect(url: &str, block: Duration) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(block + RESPONSE_MARGIN));
    client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| e.to_string())
}

/// Creates the consumer group on every shard stream (MKSTREAM; an existing group is kept).
pub async fn create(url: &str, group: &RawGroup) -> Result<(), String> {
    let mut conn = connect(url, Duration::ZERO).await?;
    for shard in 0..group.shards {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE").arg(group.stream(shard)).arg(&group.group).arg("0").arg("MKSTREAM");
        match cmd.query_async::<Value>(&mut conn).await {
            Ok(_) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

pub struct RawPublisher {
    conn: MultiplexedConnection,
    group: RawGroup,
    trips: Arc<TripCounters>,
}

impl RawPublisher {
    pub async fn connect(url: &str, group: RawGroup, trips: Arc<TripCounters>) -> Result<Self, String> {
        Ok(Self { conn: connect(url, Duration::ZERO).await?, group, trips })
    }
}

impl Publisher for RawPublisher {
    async fn publish(&self, key: Vec<u8>, payload: Vec<u8>) -> Result<(), String> {
        let shard = rsc::client::hash::shard_for_key(&key, self.group.shards);
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.group.stream(shard)).arg("*").arg("key").arg(key).arg("payload").arg(payload);
        TripCounters::hit(&self.trips.xadd);
        let mut conn = self.conn.clone();
        cmd.query_async::<Value>(&mut conn).await.map(|_| ()).map_err(|e| e.to_string())
    }
}

pub struct RawSubscriber {
    conn: MultiplexedConnection,
    group: RawGroup,
    name: String,
    streams: Vec<String>,
    trips: Arc<TripCounters>,
    /// `Some`: acks ride on the next read (the `raw-piggy` row), for the batches it says.
    piggyback: Option<HoldAcks>,
    /// With `piggyback`: the batch read last, not acked yet.
    held: std::sync::Mutex<Vec<(String, Vec<RawEntry>)>>,
}

impl RawSubscriber {
    /// Acks ride on the next read, for the batches `hold` says.
    pub fn piggyback(mut self, hold: Option<HoldAcks>) -> Self {
        self.piggyback = hold;
        self
    }

    /// Subscriber `index` of `count`: reads the shards `s % count == index`.
    pub async fn connect(
        url: &str,
        group: RawGroup,
        index: u32,
        count: u32,
        block_max: Duration,
        trips: Arc<TripCounters>,
    ) -> Result<Self, String> {
        let streams = (0..group.shards).filter(|s| s % count == index).map(|s| group.stream(s)).collect();
        let conn = connect(url, block_max).await?;
        Ok(Self {
            conn,
            name: format!("raw-{index}"),
            group,
            streams,
            trips,
            piggyback: None,
            held: std::sync::Mutex::new(Vec::new()),
        })
    }
}

impl Subscriber for RawSubscriber {
    async fn consume(&self, board: &Board, max: usize, wait: Duration) -> Result<usize, String> {
        if self.streams.is_empty() {
            tokio::time::sleep(wait).await;
            return Ok(0);
        }
        // COUNT is per stream: split `max` so one read returns at most `max` entries in all, as
        // the library's `poll(max)` does.
        let count = max.div_ceil(self.streams.len()).max(1);
        if let Some(hold) = self.piggyback {
            return self.consume_piggyback(board, hold, max, count, wait).await;
        }
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP").arg(&self.group.group).arg(&self.name).arg("COUNT").arg(count);
        read.arg("BLOCK").arg(wait.as_millis().max(1) as u64).arg("STREAMS").arg(&self.streams);
        read.arg(vec![">"; self.streams.len()]);
        let mut conn = self.conn.clone();
        let reply = read.query_async::<Value>(&mut conn).await;
        let streams = reply.map_err(|e| e.to_string()).and_then(|r| parse_read(&r))?;
        self.trips.read(!streams.is_empty());
        if streams.is_empty() {
            return Ok(0);
        }
        let mut acks = redis::pipe();
        for (stream, entries) in &streams {
            acks.cmd("XACK")
                .arg(stream)
                .arg(&self.group.group)
                .arg(entries.iter().map(|(id, _)| id).collect::<Vec<_>>());
        }
        TripCounters::hit(&self.trips.xack);
        acks.query_async::<Vec<Value>>(&mut conn).await.map_err(|e| e.to_string())?;
        let mut acked = 0;
        for (_, entries) in &streams {
            for (_, payload) in entries {
                board.acked(payload);
                acked += 1;
            }
        }
        Ok(acked)
    }
}

impl RawSubscriber {
    /// The XACKs of `streams`' entries, one per stream, added to `pipe`.
    fn add_acks(&self, pipe: &mut redis::Pipeline, streams: &[(String, Vec<RawEntry>)]) {
        for (stream, entries) in streams {
            pipe.cmd("XACK")
                .arg(stream)
                .arg(&self.group.group)
                .arg(entries.iter().map(|(id, _)| id).collect::<Vec<_>>())
                .ignore();
        }
    }

    /// With `piggyback`: the held batch's XACKs ride on a read that does not block (one pipeline),
    /// and count as acked when it returned; without a held batch, a blocking read. A batch read
    /// that `hold` holds waits for the next call; another is acked at once, as without
    /// `piggyback`.
    async fn consume_piggyback(
        &self,
        board: &Board,
        hold: HoldAcks,
        max: usize,
        count: usize,
        wait: Duration,
    ) -> Result<usize, String> {
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        let mut pipe = redis::pipe();
        self.add_acks(&mut pipe, &held);
        let read = pipe.cmd("XREADGROUP").arg("GROUP").arg(&self.group.group).arg(&self.name).arg("COUNT").arg(count);
        if held.is_empty() {
            read.arg("BLOCK").arg(wait.as_millis().max(1) as u64);
        } else {
            TripCounters::hit(&self.trips.xack);
        }
        read.arg("STREAMS").arg(&self.streams).arg(vec![">"; self.streams.len()]);
        let mut conn = self.conn.clone();
        let reply = pipe.query_async::<Vec<Value>>(&mut conn).await.map_err(|e| e.to_string())?;
        let streams = parse_read(reply.first().unwrap_or(&Value::Nil))?;
        self.trips.read(!streams.is_empty());
        let read_total: usize = streams.iter().map(|(_, entries)| entries.len()).sum();
        let acked_now = if hold.holds(read_total, max) {
            *self.held.lock().unwrap_or_else(|p| p.into_inner()) = streams;
            Vec::new()
        } else {
            if !streams.is_empty() {
                let mut acks = redis::pipe();
                self.add_acks(&mut acks, &streams);
                TripCounters::hit(&self.trips.xack);
                acks.query_async::<Vec<Value>>(&mut conn).await.map_err(|e| e.to_string())?;
            }
            streams
        };
        let mut acked = 0;
        for (_, entries) in held.iter().chain(&acked_now) {
            for (_, payload) in entries {
                board.acked(payload);
                acked += 1;
            }
        }
        Ok(acked)
    }
}

/// `(id, payload)` of one entry; a trimmed entry has no payload.
type RawEntry = (String, Vec<u8>);

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// XREADGROUP's RESP2 reply (nil, or `[[stream, [[id, [field, value, ...]], ...]], ...]`), keeping
/// only streams with entries.
fn parse_read(reply: &Value) -> Result<Vec<(String, Vec<RawEntry>)>, String> {
    let bad = || format!("unexpected XREADGROUP reply {reply:?}");
    let Value::Array(streams) = reply else {
        return if matches!(reply, Value::Nil) { Ok(Vec::new()) } else { Err(bad()) };
    };
    let mut out = Vec::with_capacity(streams.len());
    for stream in streams {
        let Value::Array(pair) = stream else { return Err(bad()) };
        let (Some(name), Some(Value::Array(items))) = (pair.first().and_then(text), pair.get(1)) else {
            return Err(bad());
        };
        let mut entries = Vec::with_capacity(items.len());
        for item in items {
            let Value::Array(parts) = item else { return Err(bad()) };
            let id = parts.first().and_then(text).ok_or_else(bad)?;
            let fields: Vec<(String, Vec<u8>)> = match parts.get(1) {
                Some(Value::Array(flat)) => flat
                    .chunks(2)
                    .filter_map(|kv| match (text(&kv[0]), kv.get(1)) {
                        (Some(name), Some(Value::BulkString(v))) => Some((name, v.clone())),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            entries.push((id, payload_of(&fields).to_vec()));
        }
        if !entries.is_empty() {
            out.push((name, entries));
        }
    }
    Ok(out)
}
