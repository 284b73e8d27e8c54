//! Settling many deliveries at once: [`Consumer::ack_all`] acknowledges them with one XACK per
//! shard, the fenced shards' XACKs in one store call (one script on Redis), the unfenced ones in
//! flight together; [`Consumer::abandon_in_flight`] gives up everything in flight.
//!
//! Owns only the batching: every delivery is checked and settled in the core exactly as a single
//! [`Consumer::ack`] is (in flight, lease holds; acked, or the shard lost on `FENCED`). Never
//! sends anything for a delivery that fails the check, and never holds the core's lock across an
//! `.await`.

use std::collections::{BTreeMap, BTreeSet};

use super::{AckError, Consumer, Delivery};
use crate::client::transport::CoordinatorTransport;
use crate::core::model::{Fence, ShardId};
use crate::store::{join_all, keys, EntryId, FenceCheck, FencedAck, StoreError, StreamStore};

/// The deliveries of one shard in a batch, and the fence their XACK presents.
struct ShardBatch<'a> {
    stream: &'a str,
    fence: Option<Fence>,
    deliveries: Vec<&'a Delivery>,
}

impl<T: CoordinatorTransport, S: StreamStore> Consumer<T, S> {
    /// Gives up every entry in flight (handed out, neither acked nor abandoned), on every shard:
    /// for an application that lost track of its deliveries (a batch loop left by `?`, processing
    /// tasks that panicked or were cancelled) and would otherwise hold them in flight until
    /// [`ConsumerConfig::max_in_flight_ms`](super::ConsumerConfig::max_in_flight_ms), keeping
    /// their shards from being handed over and `close` from leaving. Like Kafka's seek back to
    /// the last commit: they stay pending at Redis and the next poll delivers them again (a
    /// revoked shard's next owner, if it was revoked); acks of the old deliveries are refused
    /// (`NotInFlight`). Only for deliveries nobody works on any more: one still being processed
    /// is then processed twice at once. Returns how many were in flight; the sink hears each
    /// (`EntryAbandoned`, reason `Application`). [`ConsumerStatus::in_flight`](super::ConsumerStatus)
    /// says how many are.
    pub fn abandon_in_flight(&self) -> usize {
        self.abandon_in_flight_on(None)
    }

    /// [`Consumer::abandon_in_flight`] for one shard's entries only (say from `on_revoked`, for
    /// work the application cancels rather than finishes).
    pub fn abandon_in_flight_of(&self, shard: ShardId) -> usize {
        self.abandon_in_flight_on(Some(shard))
    }

    fn abandon_in_flight_on(&self, shard: Option<ShardId>) -> usize {
        let abandoned = self.shared.with_core_now(|core, now_ms| core.abandon_in_flight(now_ms, shard));
        if abandoned > 0 {
            // A revoking shard may be drained now: its REVOKED report (or the leave) is due.
            self.shared.wake.notify_one();
        }
        abandoned
    }

    /// Acknowledges every delivery in `deliveries` (like Kafka's `commitSync` of a batch): one
    /// XACK per shard, the fenced shards' XACKs in one `fenced_xack_many` call (one script on
    /// Redis) and the unfenced ones concurrently beside it, so a batch costs one round trip
    /// instead of one per entry.
    ///
    /// First every delivery is checked as [`Consumer::ack`] checks it (in flight here, lease
    /// holds): one that fails is not sent, the others are. A delivery listed twice is acked once.
    /// Then each shard's outcome is settled as a single ack's: acked entries leave the in-flight
    /// set; a `FENCED` refusal loses the shard at once ([`AckError::Fenced`]); a failed XACK
    /// leaves that shard's entries in flight ([`AckError::Store`]), to be acked again. The other
    /// deliveries are acked even then, so the same batch can simply be acked again after an error:
    /// what was acked already answers `NotInFlight`, and the rest is sent. The error returned is
    /// the one that most needs acting on, the first by shard id among equals: `Store` (entries
    /// still in flight: ack the batch again), then `Fenced`, `LeaseExpired`, and last
    /// `NotInFlight` (nothing of the batch is left in flight here because of it), so a retry
    /// that acked everything still in flight answers `NotInFlight` at most, never `Store`. (One delivery that failed the check
    /// used to keep the whole batch from being sent: a retry after one shard's XACK failed was
    /// refused whole, for the shard acked the first time, and the failed shard's entries stayed
    /// in flight for ever, keeping it from draining — a consumer API review finding.)
    pub async fn ack_all(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        let mut seen: BTreeSet<(ShardId, EntryId)> = BTreeSet::new();
        let unique: Vec<&Delivery> = deliveries.iter().filter(|d| seen.insert((d.shard, d.entry.id))).collect();
        let group = &self.shared.group;
        // Every error, from the check or from the store, with its shard.
        let mut errors: Vec<(ShardId, AckError)> = Vec::new();
        let batches = self.shared.with_core_now(|core, now_ms| {
            let mut batches: BTreeMap<ShardId, ShardBatch<'_>> = BTreeMap::new();
            for delivery in unique.iter().copied() {
                if let Err(error) = core.check_ack(now_ms, delivery) {
                    errors.push((delivery.shard, error));
                    continue;
                }
                let batch = batches.entry(delivery.shard).or_insert_with(|| ShardBatch {
                    stream: &delivery.stream,
                    fence: core.fence_of(delivery.shard),
                    deliveries: Vec::new(),
                });
                batch.deliveries.push(delivery);
            }
            batches
        });
        // Fenced shards' XACKs go to the store as one call; unfenced ones each as its own XACK, all
        // concurrently.
        let fenced: Vec<FencedAck> = batches
            .iter()
            .filter_map(|(shard, batch)| {
                Some(FencedAck {
                    fence: FenceCheck { key: keys::fence_key(group, *shard), fence: batch.fence? },
                    stream: batch.stream.to_string(),
                    ids: batch.deliveries.iter().map(|d| d.entry.id).collect(),
                })
            })
            .collect();
        let consumer_group = group.consumer_group.as_str();
        let plain = batches.iter().filter(|(_, batch)| batch.fence.is_none()).map(|(_, batch)| {
            let ids: Vec<EntryId> = batch.deliveries.iter().map(|d| d.entry.id).collect();
            async move { self.shared.store.xack(batch.stream, consumer_group, &ids).await }
        });
        let together = async {
            if fenced.is_empty() {
                return Vec::new();
            }
            match self.shared.store.fenced_xack_many(consumer_group, &fenced).await {
                Ok(results) => results,
                Err(error) => fenced.iter().map(|_| Err(error.clone())).collect(),
            }
        };
        let (fenced_results, plain_results) = tokio::join!(together, join_all(plain.collect()));
        let (mut fenced_results, mut plain_results) = (fenced_results.into_iter(), plain_results.into_iter());
        let results: Vec<Result<u64, StoreError>> = batches
            .values()
            .map(|batch| {
                let next = if batch.fence.is_some() { fenced_results.next() } else { plain_results.next() };
                next.unwrap_or_else(|| Err(StoreError::Protocol("fewer ack results than shards".into())))
            })
            .collect();
        // Every shard's outcome is settled under one lock (not one per entry): nothing awaits in
        // between, so this is the same as settling them one by one.
        let drained = self.shared.with_core_now(|core, now_ms| {
            let mut drained = false;
            for ((shard, batch), result) in batches.iter().zip(results) {
                // A batch holds at least one delivery; the first names the refused batch.
                let entry = batch.deliveries.first().map_or(EntryId { ms: 0, seq: 0 }, |d| d.entry.id);
                let error = match result {
                    Ok(_) => {
                        for delivery in &batch.deliveries {
                            drained |= core.acked(now_ms, delivery);
                        }
                        continue;
                    }
                    Err(StoreError::Fenced { .. }) => {
                        if let Some(fence) = batch.fence {
                            core.fenced_at_store(now_ms, *shard, fence);
                        }
                        AckError::Fenced { shard: *shard, entry }
                    }
                    Err(e) => AckError::Store(e.to_string()),
                };
                errors.push((*shard, error));
            }
            drained
        });
        if drained {
            self.shared.wake.notify_one();
        }
        let urgency = |error: &AckError| match error {
            AckError::Store(_) => 0,
            AckError::Fenced { .. } => 1,
            AckError::LeaseExpired { .. } => 2,
            AckError::NotInFlight { .. } => 3,
        };
        // `min_by_key` keeps the first of equals; check errors come before store errors, in
        // delivery order.
        errors.into_iter().min_by_key(|(shard, error)| (urgency(error), *shard)).map_or(Ok(()), |(_, e)| Err(e))
    }
}
