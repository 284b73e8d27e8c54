//! [`Consumer::poll`]: reading the shards this consumer may read, all of them at once.
//!
//! Owns the read path: per shard, setup (consumer group ensured, the previous owner's pending
//! entries claimed), then this consumer's own pending entries, then new ones, each call fenced
//! when the shard's grant carries a fence; the lease re-checked right before every call. The
//! shards of one poll are read concurrently: in the steady state (every shard reading new
//! entries) one round trip; a shard being set up or re-reading its own pending entries makes its
//! calls one after another beside the others.
//! Never: hands out an entry a cancelled poll read (it is abandoned, stays pending at Redis and
//! is redelivered), or lets a shard be reported REVOKED while a call on it may still reach Redis.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use super::{Consumer, Delivery, PollError, ReadPlan, ReadStep, Shared};
use crate::client::transport::CoordinatorTransport;
use crate::core::model::ShardId;
use crate::core::planted::PlantedBug;
use crate::store::{
    join_all, keys, FenceCheck, FencedRead, GroupStart, ReadFrom, StoreError, StreamEntry, StreamStore,
};

/// Most entries one poll reads ([`Consumer::poll`]); a larger `max` reads this many.
pub const POLL_MAX: usize = 1_000_000;

/// A shard to read, and how many entries at most.
type Share = (ReadPlan, usize);

/// The reads of one poll running concurrently: one shard's, or several read together.
type ShardReads<'a, T, S> = Pin<Box<dyn Future<Output = Vec<Result<Handed<'a, T, S>, StoreError>>> + Send + 'a>>;

impl<T: CoordinatorTransport, S: StreamStore> Consumer<T, S> {
    /// Reads up to `max` entries (at most [`POLL_MAX`]) from the shards this consumer may read
    /// right now, without waiting. A newly started shard is first set up (consumer group ensured, the previous
    /// owner's pending entries claimed), then this consumer's own pending entries are redelivered,
    /// then new entries are read.
    ///
    /// Cancel-safe: if the future is dropped before it returns, entries it had already read are
    /// abandoned (they stay pending at Redis and are redelivered), never left in flight where no
    /// one could settle them — which would keep their shard from ever being reported REVOKED.
    ///
    /// An empty poll yields to the runtime before it returns: with nothing readable (before the
    /// first grant, after the lease ended) it reached no `.await` at all, so an application loop
    /// `loop { consumer.poll(n).await }` never yielded, and on a single-threaded runtime starved
    /// the heartbeat task, which alone could make something readable (a consumer API review
    /// finding). [`Consumer::poll_wait`] waits instead of spinning.
    pub async fn poll(&self, max: usize) -> Result<Vec<Delivery>, PollError> {
        let polled = self.poll_once(max).await;
        if matches!(&polled, Ok(delivered) if delivered.is_empty()) {
            tokio::task::yield_now().await;
        }
        polled
    }

    /// [`Consumer::poll`] without its yield (`poll_wait` waits on its own).
    pub(super) async fn poll_once(&self, max: usize) -> Result<Vec<Delivery>, PollError> {
        // Redis takes a COUNT up to i64::MAX: `poll(usize::MAX)` ("everything") was refused at
        // every read and never read anything (a numbers review).
        let max = max.min(POLL_MAX);
        let plans = self.shared.with_core_now(|core, now_ms| core.read_plans(now_ms));
        if plans.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        let start = self.shared.cursor.fetch_add(1, Ordering::Relaxed) % plans.len();
        // At most `max` shards, starting from a rotating one, each read for its share of `max` (the
        // shares add up to `max`), all at once: on one connection the reads travel together, so a
        // poll costs one round trip however many shards it reads, like one multi-stream XREADGROUP.
        let chosen = plans.len().min(max);
        let shares = plans.iter().cycle().skip(start).take(chosen).enumerate();
        let (together, alone): (Vec<Share>, Vec<Share>) = shares
            .map(|(i, plan)| (*plan, max / chosen + usize::from(i < max % chosen)))
            .partition(|(plan, _)| plan.step == ReadStep::Read(ReadFrom::New));
        // Reads of new entries (the steady state) go to the store as one call (one multi-stream
        // XREADGROUP, gated when fenced); a shard being set up or re-reading its own pending
        // entries is read on its own, concurrently.
        let mut reads: Vec<ShardReads<'_, T, S>> = alone
            .into_iter()
            .map(|(plan, share)| Box::pin(async move { vec![self.read_shard(plan, share).await] }) as _)
            .collect();
        if !together.is_empty() {
            reads.push(Box::pin(self.read_new_together(together)));
        }
        // Until handed over below, entries already read sit in `Handed` values inside the join: a
        // cancelled poll drops them, which abandons them (cancel safety).
        let results = join_all(reads).await;
        let mut out = Vec::new();
        let mut failure = None;
        for result in results.into_iter().flatten() {
            match result {
                Ok(read) => out.extend(read.into_vec()),
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        // A read that came back early waited here for the slowest of the poll (a store call can be
        // held for seconds, a machine can be suspended): its shard may have stopped meanwhile
        // (lease end, fence, lost) and its entries been abandoned. Only entries still in flight
        // under a lease that holds now are handed out; the rest stay pending at Redis for whoever
        // owns the shard next.
        if !out.is_empty() {
            self.shared.with_core_now(|core, now_ms| out.retain(|delivery| core.check_ack(now_ms, delivery).is_ok()));
        }
        match failure {
            Some(error) if out.is_empty() => Err(PollError::Store(error)),
            _ => Ok(out),
        }
    }

    /// Up to three store calls on one shard: setup, own-pending, new; stops at the first read that
    /// delivers something (read for at most `max` new entries). The lease is re-checked right before every call.
    async fn read_shard(&self, first: ReadPlan, max: usize) -> Result<Handed<'_, T, S>, StoreError> {
        let (group, member) = (&self.shared.group, &self.shared.member_id);
        let stream = group.stream_key(first.shard);
        for _ in 0..3 {
            // The permission check and the call count are one step under the core's lock, so no
            // heartbeat can report the shard REVOKED between them.
            let plan = self.shared.with_core_now(|core, now_ms| {
                let plan = core.plan_for(now_ms, first.shard, first.generation);
                if plan.is_some() {
                    core.call_started(first.shard);
                }
                plan
            });
            let Some(plan) = plan else {
                return Ok(Handed::new(&self.shared, Vec::new()));
            };
            // Held until the call's result is registered (dropped on error or cancellation too).
            let reread = matches!(plan.step, ReadStep::Read(_)).then_some(plan.generation);
            let mut call = CallGuard { shared: &self.shared, shard: plan.shard, reread };
            let fence = plan.fence.map(|fence| FenceCheck { key: keys::fence_key(group, plan.shard), fence });
            match plan.step {
                ReadStep::Setup => {
                    let planted = self.shared.lock().config().planted;
                    if planted.has(PlantedBug::CreateGroupAtLatest) {
                        self.shared.store.create_group(&stream, &group.consumer_group, GroupStart::Latest).await?;
                    } else {
                        self.shared.store.ensure_group(&stream, &group.consumer_group).await?;
                    }
                    // Re-checked: the claim moves entries, so it is as sensitive as a read.
                    if self
                        .shared
                        .with_core_now(|core, now_ms| core.plan_for(now_ms, plan.shard, plan.generation))
                        .is_none()
                    {
                        return Ok(Handed::new(&self.shared, Vec::new()));
                    }
                    if !planted.has(PlantedBug::SkipPendingRecovery) {
                        let claim = match &fence {
                            Some(check) => {
                                let claimed = self.shared.store.fenced_claim_all_pending(
                                    check,
                                    &stream,
                                    &group.consumer_group,
                                    member,
                                    0,
                                );
                                claimed.await.map(drop)
                            }
                            None => {
                                let claimed =
                                    self.shared.store.claim_all_pending(&stream, &group.consumer_group, member, 0);
                                claimed.await.map(drop)
                            }
                        };
                        if let Err(error) = claim {
                            return self.refused(plan, error);
                        }
                    }
                    self.shared.with_core(|core| core.setup_done(plan.shard, plan.generation));
                }
                ReadStep::Read(from) => {
                    let count = if from == ReadFrom::OwnPending { plan.in_flight.saturating_add(max) } else { max };
                    let read = match &fence {
                        Some(check) => {
                            let group = &group.consumer_group;
                            self.shared.store.fenced_xreadgroup(check, group, member, &stream, from, count).await
                        }
                        None => {
                            let streams = [(stream.clone(), from)];
                            let read =
                                self.shared.store.xreadgroup(&group.consumer_group, member, &streams, count, None);
                            read.await.map(|replies| {
                                replies.into_iter().filter(|(s, _)| *s == stream).flat_map(|(_, e)| e).collect()
                            })
                        }
                    };
                    let entries = match read {
                        Ok(entries) => entries,
                        Err(error) => return self.refused(plan, error),
                    };
                    if from == ReadFrom::New {
                        // XREADGROUP `>` moved the group's last-delivered id to its last entry.
                        if let Some(last) = entries.last() {
                            self.shared.saw_new(plan.shard, plan.generation, last.id);
                        }
                    }
                    let delivered =
                        self.shared.with_core_now(|core, now_ms| core.handle_read(now_ms, plan, count, entries));
                    call.reread = None;
                    if !delivered.is_empty() || from == ReadFrom::New {
                        return Ok(self.ack_trimmed(Handed::new(&self.shared, delivered)).await);
                    }
                }
            }
        }
        Ok(Handed::new(&self.shared, Vec::new()))
    }

    /// Reads new entries of several shards (`(plan, count)`) in one store call per kind: the
    /// fenced ones in one fenced call, the unfenced ones in one XREADGROUP naming all their
    /// streams with the smallest of their counts (shares differ by at most one, and a poll never
    /// reads more than it asked for). Each shard is checked (lease, still reading new entries, the
    /// call counted) right before the calls, with no `.await` between the checks and the calls. A
    /// shard whose step changed since `plans` was taken is left for the next poll. One result per
    /// shard read. A failed call fails the reads of all its shards (on a Redis Cluster the fenced
    /// call is one per slot, and a slot that fails fails only its own shards; the unfenced
    /// multi-stream read still fails whole, its delivered entries staying pending to this
    /// consumer until the shard's next own-pending read, as after a read whose reply was lost).
    async fn read_new_together(&self, plans: Vec<(ReadPlan, usize)>) -> Vec<Result<Handed<'_, T, S>, StoreError>> {
        let (group, member) = (&self.shared.group, &self.shared.member_id);
        let mut calls = Vec::with_capacity(plans.len());
        let mut reads = Vec::with_capacity(plans.len());
        let mut plain: Vec<((String, ReadFrom), ReadPlan)> = Vec::new();
        for (first, count) in plans {
            let plan = self.shared.with_core_now(|core, now_ms| {
                let plan = core.plan_for(now_ms, first.shard, first.generation)?;
                (plan.step == ReadStep::Read(ReadFrom::New)).then(|| core.call_started(first.shard)).map(|()| plan)
            });
            let Some(plan) = plan else { continue };
            // Held until the read's result is registered (dropped on error or cancellation too).
            let guard = CallGuard { shared: &self.shared, shard: plan.shard, reread: Some(plan.generation) };
            match plan.fence {
                Some(fence) => reads.push(FencedRead {
                    fence: FenceCheck { key: keys::fence_key(group, plan.shard), fence },
                    stream: group.stream_key(plan.shard),
                    from: ReadFrom::New,
                    count,
                }),
                None => plain.push(((group.stream_key(plan.shard), ReadFrom::New), plan)),
            }
            calls.push((plan, count, guard));
        }
        if calls.is_empty() {
            return Vec::new();
        }
        let plain_count = calls.iter().filter(|(plan, ..)| plan.fence.is_none()).map(|(_, count, _)| *count).min();
        let fenced = async {
            match reads.is_empty() {
                true => Ok(Vec::new()),
                false => self.shared.store.fenced_xreadgroup_many(&group.consumer_group, member, &reads).await,
            }
        };
        let unfenced = async {
            let Some(count) = plain_count else { return Ok(BTreeMap::new()) };
            let store = &self.shared.store;
            let streams: Vec<(String, ReadFrom)> = plain.iter().map(|(read, _)| read.clone()).collect();
            match store.xreadgroup(&group.consumer_group, member, &streams, count, None).await {
                // XREADGROUP leaves out a stream that had nothing new.
                Ok(replies) => Ok(replies.into_iter().map(|(stream, entries)| (stream, Ok(entries))).collect()),
                // The server refused the call (one stream's group is gone: `NOGROUP` fails them
                // all): each shard is read on its own, so only the shard at fault fails.
                // A shard is read again only if it may still be read now, and still unfenced: the
                // lease and its permission are re-checked right before these calls as before the
                // first one, and a grant that an answer fenced meanwhile is left to the next poll's
                // fenced read (a shard that may not be read so is read nothing).
                Err(error) if plain.len() > 1 && !matches!(error, StoreError::Unavailable(_)) => {
                    let still: Vec<bool> = self.shared.with_core_now(|core, now_ms| {
                        let mut may = |plan: &ReadPlan| core.plan_for(now_ms, plan.shard, plan.generation);
                        let same = |plan: &ReadPlan, now: ReadPlan| now.step == plan.step && now.fence == plan.fence;
                        plain.iter().map(|(_, plan)| may(plan).is_some_and(|now| same(plan, now))).collect()
                    });
                    let alone = plain.iter().zip(still).map(|((read, _), still)| async move {
                        if !still {
                            return (read.0.clone(), Ok(Vec::new()));
                        }
                        let got =
                            store.xreadgroup(&group.consumer_group, member, std::slice::from_ref(read), count, None);
                        (read.0.clone(), got.await.map(|replies| replies.into_iter().flat_map(|(_, e)| e).collect()))
                    });
                    Ok(join_all(alone.collect()).await.into_iter().collect::<BTreeMap<String, _>>())
                }
                Err(error) => Err(error),
            }
        };
        let (fenced, unfenced) = tokio::join!(fenced, unfenced);
        // A store that answered fewer fenced reads than it was sent: the missing ones failed.
        let missing = || Err::<Vec<StreamEntry>, _>(StoreError::Protocol("fewer read results than shards".into()));
        // A call that failed as a whole is that error for each of its shards, never a refusal of
        // one shard (only a shard's own answer can say `FENCED` about it): `Err(Err(error))`.
        let mut fenced = match fenced {
            Ok(results) => Box::new(results.into_iter().map(Ok).chain(std::iter::repeat_with(|| Ok(missing()))))
                as Box<dyn Iterator<Item = Result<Result<Vec<StreamEntry>, StoreError>, StoreError>> + Send>,
            Err(error) => Box::new(std::iter::repeat_with(move || Err(error.clone()))),
        };
        let mut unfenced: Result<BTreeMap<String, Result<Vec<StreamEntry>, StoreError>>, StoreError> = unfenced;
        let results: Vec<_> = calls
            .into_iter()
            .map(|(plan, count, guard)| {
                let result = match plan.fence {
                    Some(_) => fenced.next().unwrap_or_else(|| Ok(missing())),
                    None => match &mut unfenced {
                        Ok(by_stream) => Ok(by_stream.remove(&group.stream_key(plan.shard)).unwrap_or(Ok(Vec::new()))),
                        Err(error) => Err(error.clone()),
                    },
                };
                let count = if plan.fence.is_none() { plain_count.unwrap_or(count) } else { count };
                (plan, count, guard, result)
            })
            .collect();
        // Every shard's entries are registered in flight first (no `.await`), so a cancellation
        // while trimmed entries are acked below abandons them instead of losing track of them.
        let mut out = Vec::with_capacity(results.len());
        for (plan, count, mut guard, result) in results {
            let result = match result {
                Ok(answer) => answer,
                Err(whole_call) => {
                    out.push(Err(whole_call));
                    continue;
                }
            };
            let registered = result.map(|entries| {
                // XREADGROUP `>` moved the group's last-delivered id to its last entry.
                if let Some(last) = entries.last() {
                    self.shared.saw_new(plan.shard, plan.generation, last.id);
                }
                let delivered =
                    self.shared.with_core_now(|core, now_ms| core.handle_read(now_ms, plan, count, entries));
                Handed::new(&self.shared, delivered)
            });
            if registered.is_ok() {
                guard.reread = None;
            }
            out.push(registered.or_else(|error| self.refused(plan, error)));
            drop(guard);
        }
        let mut handed = Vec::with_capacity(out.len());
        for read in out {
            handed.push(match read {
                Ok(delivered) => Ok(self.ack_trimmed(delivered).await),
                Err(error) => Err(error),
            });
        }
        handed
    }

    /// A read or claim on `plan`'s shard failed: a `FENCED` refusal loses the shard at once (see
    /// [`ConsumerCore::fenced_at_store`]) and reads nothing; any other error is the caller's.
    fn refused(&self, plan: ReadPlan, error: StoreError) -> Result<Handed<'_, T, S>, StoreError> {
        match (error, plan.fence) {
            (StoreError::Fenced { .. }, Some(fence)) => {
                self.shared.with_core_now(|core, now_ms| core.fenced_at_store(now_ms, plan.shard, fence));
                Ok(Handed::new(&self.shared, Vec::new()))
            }
            (error, _) => Err(error),
        }
    }

    /// Pending entries trimmed from the stream (MAXLEN) come back from an own-pending read with no
    /// fields (XADD never writes an entry without one): there is nothing to process, so they are
    /// acked here instead of being handed to the application. A failed ack leaves them in flight
    /// and delivered, so the application sees and settles them.
    async fn ack_trimmed<'a>(&'a self, mut delivered: Handed<'a, T, S>) -> Handed<'a, T, S> {
        let mut i = 0;
        while i < delivered.deliveries.len() {
            let trimmed = delivered.deliveries[i].entry.fields.is_empty();
            if trimmed && self.ack(&delivered.deliveries[i].clone()).await.is_ok() {
                delivered.deliveries.remove(i);
            } else {
                i += 1;
            }
        }
        delivered
    }
}

/// Deliveries read from the store (in flight in the core) and not yet handed to the application.
/// Dropped before [`Handed::into_vec`] (the poll future was cancelled), it abandons each of them.
pub(super) struct Handed<'a, T, S> {
    shared: &'a Shared<T, S>,
    deliveries: Vec<Delivery>,
}

impl<'a, T, S> Handed<'a, T, S> {
    fn new(shared: &'a Shared<T, S>, deliveries: Vec<Delivery>) -> Self {
        Self { shared, deliveries }
    }

    /// Hands the deliveries over: from now on they are the application's to settle.
    fn into_vec(mut self) -> Vec<Delivery> {
        std::mem::take(&mut self.deliveries)
    }
}

impl<T, S> Drop for Handed<'_, T, S> {
    fn drop(&mut self) {
        if self.deliveries.is_empty() {
            return;
        }
        let mut drained = false;
        for delivery in &self.deliveries {
            // Not in flight any more (the shard was lost meanwhile): nothing to give up.
            drained |= self.shared.with_core_now(|core, now_ms| core.abandon(now_ms, delivery)).unwrap_or(false);
        }
        if drained {
            self.shared.wake.notify_one();
        }
    }
}

/// Counts one store call on a shard as outstanding until dropped, so a shard is never reported
/// REVOKED while a call on it may still reach Redis (see `ConsumerCore::call_started`).
pub(super) struct CallGuard<'a, T, S> {
    shared: &'a Shared<T, S>,
    shard: ShardId,
    /// A read whose result is not registered yet, under this shard start: dropped so (the poll
    /// was cancelled, or the call failed here but may have run at Redis), the entries it may
    /// have made pending to this consumer are re-read at the next poll
    /// (`ConsumerCore::reread_own_pending`), not at the next pending sweep.
    reread: Option<u64>,
}

impl<T, S> Drop for CallGuard<'_, T, S> {
    fn drop(&mut self) {
        let (shard, reread) = (self.shard, self.reread);
        let drained = self.shared.with_core_now(|core, now_ms| {
            if let Some(generation) = reread {
                core.reread_own_pending(shard, generation);
            }
            core.call_finished(now_ms, shard)
        });
        if drained {
            self.shared.wake.notify_one();
        }
    }
}
