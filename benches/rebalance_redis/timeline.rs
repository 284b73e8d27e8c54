//! `REB_TIMELINE=1`: one timed rebalance as a table of time buckets — heartbeats sent, statuses
//! applied by kind, coordinator writes, how long the group mutex was held, attempts that found it
//! taken (busy), and how many members had reached their final view — to see which round trips a
//! rebalance waits for.
//! Never measures anything itself: it only buckets what the board and the store wrapper saw.

use std::time::Instant;

use super::board::{BoardCounts, Seen, Settled};
use super::instrumented::TraceCounts;
use rsc::core::protocol::HeartbeatStatus;

/// Bucket width.
const BUCKET_MS: u64 = 250;

#[derive(Clone, Copy, Default)]
struct Bucket {
    sent: u64,
    ok: u64,
    revoke_pending: u64,
    sync: u64,
    writes: u64,
    held_ms: f64,
    busy: u64,
}

/// Prints the timeline from `start_ms` (client clock) to the settle time. `ms_at` converts a
/// store-wrapper instant to client clock ms.
pub fn print(
    title: &str,
    start_ms: u64,
    board: &BoardCounts,
    store: &TraceCounts,
    settled: &Settled,
    ms_at: impl Fn(Instant) -> u64,
) {
    let end_ms = settled.at_ms.max(start_ms);
    let count = ((end_ms - start_ms) / BUCKET_MS + 1) as usize;
    let mut buckets = vec![Bucket::default(); count];
    let index = |at_ms: u64| ((at_ms.saturating_sub(start_ms) / BUCKET_MS) as usize).min(count - 1);
    for (at_ms, seen) in &board.events {
        let b = &mut buckets[index(*at_ms)];
        match seen {
            Seen::Sent => b.sent += 1,
            Seen::Applied(HeartbeatStatus::Ok) => b.ok += 1,
            Seen::Applied(HeartbeatStatus::RevokePending) => b.revoke_pending += 1,
            Seen::Applied(HeartbeatStatus::SyncMetadata) => b.sync += 1,
        }
    }
    for at in &store.written_at {
        buckets[index(ms_at(*at))].writes += 1;
    }
    for at in &store.busy_at {
        buckets[index(ms_at(*at))].busy += 1;
    }
    for (from, to) in &store.held {
        // Attributed to the bucket the hold started in (holds are a few ms).
        buckets[index(ms_at(*from))].held_ms += to.duration_since(*from).as_secs_f64() * 1e3;
    }
    println!("    timeline of {title} ({BUCKET_MS} ms buckets from the start of the change):");
    println!(
        "    {:>6} {:>5} {:>5} {:>6} {:>5} {:>6} {:>8} {:>6} {:>6}",
        "t s", "sent", "OK", "RPEND", "SYNC", "writes", "held ms", "busy", "final"
    );
    for (i, b) in buckets.iter().enumerate() {
        let bucket_end = start_ms + (i as u64 + 1) * BUCKET_MS;
        let settled_by = settled.since_ms.iter().filter(|&&t| t < bucket_end).count();
        println!(
            "    {:>6.2} {:>5} {:>5} {:>6} {:>5} {:>6} {:>8.0} {:>6} {:>6}",
            (i as u64 * BUCKET_MS) as f64 / 1000.0,
            b.sent,
            b.ok,
            b.revoke_pending,
            b.sync,
            b.writes,
            b.held_ms,
            b.busy,
            settled_by
        );
    }
}
