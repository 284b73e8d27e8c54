//! [`Consumer::poll_wait`]: waiting for new entries with a doorbell instead of re-polling.
//!
//! An empty poll is followed by one [`StreamStore::wait_for_entries`] (an unfenced
//! `XREAD BLOCK` on every readable shard after its last-seen id), then by one more poll when it
//! rang. A raw consumer would wait in one `XREADGROUP BLOCK`, which a fenced read cannot do: the
//! fence check runs as a script, and scripts must never block. Costs: a busy read (the previous
//! wait delivered) sends no doorbell; the first idle wait after busy ones costs its empty poll
//! (one read per shard) plus one doorbell; every further idle wait rings first, before any read
//! (the ids are known by then), and costs the doorbell alone, plus the poll when it rings.
//!
//! The last-seen id of a shard is the group's last-delivered id, which this module keeps per
//! shard start (shard, generation) from the read path at no cost: a read of `>` that delivered
//! entries moved it to the last of them. Only a shard with no delivery yet (or after a ring that
//! found nothing, see below) is sent without an id, and the store reads it (one more round trip,
//! once). Why this id is race-free: right after a read of `>` returned nothing, every entry of the
//! stream was delivered, and an entry added later has a larger id, so it rings; `$` would miss an
//! entry added between the empty read and the XREAD.
//!
//! Never reads, acks or claims for the group (the doorbell only wakes the next poll, which does
//! the fenced or unfenced read); never holds the core's lock across an `.await`; never waits past
//! the lease end or the caller's deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Consumer, Delivery, PollError, ReadStep, Shared};
use crate::client::transport::CoordinatorTransport;
use crate::core::model::ShardId;
use crate::store::{EntryId, ReadFrom, StreamStore};

/// Longest single doorbell wait: bounds how late a newly assigned shard is first read when no
/// assignment change wakes the wait, and how stale the wait's shard list can get.
pub(super) const DOORBELL_BLOCK_MS_MAX: u64 = 1_000;

/// Longest `poll_wait` (a century): a longer `wait` waits this long.
const WAIT_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3_600);

impl<T: CoordinatorTransport, S: StreamStore> Consumer<T, S> {
    /// Like [`Consumer::poll`], but waits up to `wait` for at least one entry: after an empty
    /// poll, one doorbell wait on the readable shards (up to the deadline, the lease end, or
    /// [`DOORBELL_BLOCK_MS_MAX`]; cut short when the assignment changes), then a poll again if
    /// it rang. When the previous wait ended empty, the doorbell goes first (see the module
    /// docs). When no doorbell can be used (no readable shard, a shard still being set up, or a
    /// store error), it pauses `poll_idle_ms` between polls as before. Cancel-safe like `poll`:
    /// dropping it (e.g. in a `tokio::select!` with a shutdown signal) loses no entry and leaves
    /// no shard undrainable.
    pub async fn poll_wait(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, PollError> {
        // `Duration::MAX` ("until something arrives") overflowed the clock and panicked in the
        // application (a numbers review): a wait beyond a century is one.
        let deadline = tokio::time::Instant::now() + wait.min(WAIT_MAX);
        let idle = Duration::from_millis(self.shared.lock().config().poll_idle_ms.max(1));
        // After an empty wait the doorbell goes first: with every last-seen id known it returns at
        // once if anything undelivered exists, so an idle consumer's next wait costs that one call
        // and a busy one's (its last wait delivered) none.
        let mut ring_first = self.shared.idle.load(Ordering::Relaxed);
        let mut rang = false;
        loop {
            // Registered before the assignment is read, so a change after it is not missed.
            let changed = self.shared.reads_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !ring_first {
                let delivered = self.poll_once(max).await?;
                if rang && delivered.is_empty() {
                    // The doorbell rang for entries no read of `>` found: the group's last-delivered
                    // ids moved without this consumer (someone else read the group). Forget them, so
                    // the next wait watches after the group's own.
                    self.shared.lock_last_seen().clear();
                }
                if !delivered.is_empty() || tokio::time::Instant::now() >= deadline || max == 0 {
                    self.shared.idle.store(delivered.is_empty(), Ordering::Relaxed);
                    return Ok(delivered);
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                self.shared.idle.store(true, Ordering::Relaxed);
                return Ok(Vec::new());
            }
            // Rounded up: a wait never ends before the deadline.
            let remaining_ms = u64::try_from((deadline - now).as_micros().div_ceil(1_000)).unwrap_or(u64::MAX);
            let bell = self.ring(remaining_ms, ring_first, changed).await;
            rang = matches!(bell, Bell::Rang);
            ring_first = false;
            match bell {
                // Poll again at once.
                Bell::Rang | Bell::Changed | Bell::PollFirst => {}
                // The full wait passed with nothing newer: the wait is over without another poll.
                Bell::Silent { waited_to_deadline: true } => {
                    self.shared.idle.store(true, Ordering::Relaxed);
                    return Ok(Vec::new());
                }
                // Nothing newer, so a poll would find nothing: ring again.
                Bell::Silent { waited_to_deadline: false } => ring_first = true,
                Bell::Unusable => {
                    let now = tokio::time::Instant::now();
                    crate::time::sleep(idle.min(deadline.saturating_duration_since(now))).await;
                }
            }
        }
    }

    /// One doorbell wait of up to `remaining_ms` on every readable shard. `known_only`: only if
    /// every shard's last-seen id is known (else [`Bell::PollFirst`]): the wait comes before any
    /// read, so no empty read of `>` vouches for the group's last-delivered id being current.
    async fn ring(
        &self,
        remaining_ms: u64,
        known_only: bool,
        changed: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    ) -> Bell {
        let group = &self.shared.group;
        let (plans, lease_end_ms, now_ms) = self
            .shared
            .with_core_now(|core, now_ms| (core.read_plans(now_ms), core.lease_end_ms().unwrap_or(now_ms), now_ms));
        // A shard being set up or re-reading its own pending entries has work the next poll
        // does; a doorbell would only delay it.
        let busy = plans.iter().any(|p| p.step != ReadStep::Read(ReadFrom::New));
        if known_only && (busy || plans.iter().any(|p| self.shared.last_seen(p.shard, p.generation).is_none())) {
            return Bell::PollFirst;
        }
        if plans.is_empty() || busy {
            return Bell::Unusable;
        }
        let block_ms = remaining_ms.min(lease_end_ms.saturating_sub(now_ms)).min(DOORBELL_BLOCK_MS_MAX);
        if block_ms == 0 {
            return Bell::Unusable;
        }
        let shards: Vec<(ShardId, u64)> = plans.iter().map(|p| (p.shard, p.generation)).collect();
        let streams: Vec<(String, Option<EntryId>)> = shards
            .iter()
            .map(|(shard, generation)| (group.stream_key(*shard), self.shared.last_seen(*shard, *generation)))
            .collect();
        // One call for every shard: a single server holds them all. On Redis Cluster one XREAD
        // cannot span slots; there this becomes one call per shard (the shards' streams are in
        // different slots), run concurrently, the first ring ending the wait.
        let wait = self.shared.store.wait_for_entries(&group.consumer_group, &streams, block_ms);
        let bell = tokio::select! {
            biased;
            _ = changed => return Bell::Changed,
            bell = wait => bell,
        };
        let Ok(bell) = bell else { return Bell::Unusable };
        note_bell(&mut self.shared.lock_last_seen(), &shards, &bell.after);
        if bell.rang {
            Bell::Rang
        } else {
            Bell::Silent { waited_to_deadline: block_ms == remaining_ms }
        }
    }
}

/// What a doorbell wait on `shards` (shard, start generation) learnt: the last-seen id of each
/// (`after`, in order); ids of shards not waited on are forgotten. A set: `Vec::contains` per
/// retained entry was quadratic, seconds per wait under the lock the read path takes for a
/// consumer of 65,536 shards (a scale review).
fn note_bell(last_seen: &mut BTreeMap<ShardId, (u64, EntryId)>, shards: &[(ShardId, u64)], after: &[EntryId]) {
    let waited: BTreeSet<(ShardId, u64)> = shards.iter().copied().collect();
    last_seen.retain(|shard, (generation, _)| waited.contains(&(*shard, *generation)));
    for ((shard, generation), after) in shards.iter().zip(after) {
        last_seen.insert(*shard, (*generation, *after));
    }
}

/// How a doorbell wait ended.
enum Bell {
    /// Something newer exists: poll now.
    Rang,
    /// The readable shards changed during the wait: poll now.
    Changed,
    /// Nothing newer within the wait; `waited_to_deadline` when the wait ran to the caller's
    /// deadline.
    Silent { waited_to_deadline: bool },
    /// No doorbell could be used: pause and poll.
    Unusable,
    /// Asked to ring before polling, but a shard needs the poll first (its last-seen id is not
    /// known, or it has other work): poll now.
    PollFirst,
}

impl<T, S> Shared<T, S> {
    /// The group's last-delivered id on `shard` as this consumer knows it for the shard start
    /// `generation` (`None`: not known).
    fn last_seen(&self, shard: ShardId, generation: u64) -> Option<EntryId> {
        self.lock_last_seen().get(&shard).filter(|(g, _)| *g == generation).map(|(_, id)| *id)
    }

    /// The read path's note: a read of `>` on `shard` delivered entries up to `last`, which is now
    /// the group's last-delivered id there.
    pub(super) fn saw_new(&self, shard: ShardId, generation: u64, last: EntryId) {
        self.lock_last_seen().insert(shard, (generation, last));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ms: u64) -> EntryId {
        EntryId { ms, seq: 0 }
    }

    #[test]
    fn a_bell_on_65536_shards_keeps_the_ids_of_the_shards_waited_on_in_linear_time() {
        const SHARDS: ShardId = 65_536;
        // Known before the wait: every shard, the odd ones under an older start.
        let mut last_seen: BTreeMap<ShardId, (u64, EntryId)> =
            (0..SHARDS).map(|shard| (shard, (u64::from(shard % 2), id(1)))).collect();
        // The wait: every shard but the last, all under start 0.
        let shards: Vec<(ShardId, u64)> = (0..SHARDS - 1).map(|shard| (shard, 0)).collect();
        let after: Vec<EntryId> = (0..SHARDS - 1).map(|shard| id(u64::from(shard) + 10)).collect();
        let started = std::time::Instant::now();
        note_bell(&mut last_seen, &shards, &after);
        // Quadratic, this took minutes in a debug build (4.3e9 comparisons); linear, milliseconds.
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        assert_eq!(last_seen.len(), (SHARDS - 1) as usize, "the shard not waited on is forgotten");
        assert!(last_seen
            .iter()
            .all(|(shard, (generation, seen))| *generation == 0 && *seen == id(u64::from(*shard) + 10)));
    }

    #[test]
    fn a_bell_forgets_an_id_of_an_earlier_start_of_a_shard_it_has_no_answer_for() {
        let mut last_seen = BTreeMap::from([(1, (0, id(5))), (2, (3, id(6))), (3, (1, id(7)))]);
        // Shards 1 and 2 (2 under a newer start than known); the store answered for shard 1 only.
        note_bell(&mut last_seen, &[(1, 0), (2, 4)], &[id(9)]);
        assert_eq!(last_seen, BTreeMap::from([(1, (0, id(9)))]));
    }
}
