//! [`Counted`]: a [`StreamStore`] that counts the round trips the client libraries make, by
//! command and by outcome, and passes every call on unchanged.
//!
//! Owns only counters (atomics: no lock on the data path). Never changes, retries or reorders a
//! call. Calls of one kind that overlap in time on one wrapper (one client's connection) travel
//! together and count as one round trip (`Consumer::poll` and `Consumer::ack_all` send their
//! shards' calls at once); calls of different kinds count apart even when they overlap (the
//! `lib-on-overlap` row's `ack_all` beside its next `poll` counts as an ack and a read).
//! Sequential calls of one shard that overlap another shard's call (a shard being set up beside a
//! steady one) count once too: setup is not what this bench times. Each `RedisStore` stream
//! method is one round trip except `claim_all_pending`, which pages
//! XAUTOCLAIM (one page per call at the sizes this bench runs; counted as one). The fenced
//! variants (one script call each) count under the same names as the plain ones, so the rows
//! with fencing on and off compare directly.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rsc::store::{
    Doorbell, EntryId, FenceCheck, FencedAck, FencedRead, GroupStart, ReadFrom, StoreError, StreamEntry, StreamStore,
};

/// Round trips by kind, since the counters were made.
#[derive(Default)]
pub struct TripCounters {
    pub xadd: AtomicU64,
    /// XREADGROUP round trips (overlapping reads of one client count once) that returned at
    /// least one entry.
    pub read_busy: AtomicU64,
    /// XREADGROUP round trips that returned nothing.
    pub read_empty: AtomicU64,
    /// XACK round trips (overlapping acks of one client count once).
    pub xack: AtomicU64,
    /// XGROUP CREATE and XAUTOCLAIM (shard setup and pending sweeps).
    pub setup: AtomicU64,
    /// Doorbell waits (`XREAD BLOCK`; counted as one, though an unknown last-seen id adds an
    /// XINFO GROUPS round trip before it).
    pub doorbell: AtomicU64,
}

/// A copy of [`TripCounters`] at one moment; subtract two to get a window's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Trips {
    pub xadd: u64,
    pub read_busy: u64,
    pub read_empty: u64,
    pub xack: u64,
    pub setup: u64,
    pub doorbell: u64,
}

impl Trips {
    pub fn total(&self) -> u64 {
        self.xadd + self.read_busy + self.read_empty + self.xack + self.setup + self.doorbell
    }

    pub fn since(&self, earlier: &Trips) -> Trips {
        Trips {
            xadd: self.xadd - earlier.xadd,
            read_busy: self.read_busy - earlier.read_busy,
            read_empty: self.read_empty - earlier.read_empty,
            xack: self.xack - earlier.xack,
            setup: self.setup - earlier.setup,
            doorbell: self.doorbell - earlier.doorbell,
        }
    }
}

impl TripCounters {
    pub fn snapshot(&self) -> Trips {
        Trips {
            xadd: self.xadd.load(Ordering::Relaxed),
            read_busy: self.read_busy.load(Ordering::Relaxed),
            read_empty: self.read_empty.load(Ordering::Relaxed),
            xack: self.xack.load(Ordering::Relaxed),
            setup: self.setup.load(Ordering::Relaxed),
            doorbell: self.doorbell.load(Ordering::Relaxed),
        }
    }

    pub fn hit(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one read round trip by whether it delivered anything.
    pub fn read(&self, delivered: bool) {
        Self::hit(if delivered { &self.read_busy } else { &self.read_empty });
    }
}

/// The calls of one kind in flight on one wrapper: overlapping calls are one round trip.
#[derive(Default)]
struct Round {
    in_flight: AtomicU64,
    /// Some call of the current round delivered entries.
    delivered: AtomicBool,
}

impl Round {
    /// Starts one call of the round; the call ends when the guard is finished or dropped (a
    /// cancelled call still ends its part of the round).
    fn start(&self) -> RoundCall<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        RoundCall { round: self, ended: false }
    }

    /// Ends one call; `Some(delivered)` when it was the round's last (the round is then counted).
    fn finish(&self, delivered: bool) -> Option<bool> {
        if delivered {
            self.delivered.store(true, Ordering::SeqCst);
        }
        (self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1).then(|| self.delivered.swap(false, Ordering::SeqCst))
    }
}

/// One call in a [`Round`].
struct RoundCall<'a> {
    round: &'a Round,
    ended: bool,
}

impl RoundCall<'_> {
    fn finish(mut self, delivered: bool) -> Option<bool> {
        self.ended = true;
        self.round.finish(delivered)
    }
}

impl Drop for RoundCall<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.round.finish(false);
        }
    }
}

/// The wrapped store and the counters it adds to (shared by every clone).
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    trips: Arc<TripCounters>,
    reads: Arc<Round>,
    acks: Arc<Round>,
}

impl<S> Counted<S> {
    pub fn new(inner: S, trips: Arc<TripCounters>) -> Self {
        Self { inner, trips, reads: Arc::default(), acks: Arc::default() }
    }

    /// Runs one XREADGROUP-like call, counting its round (busy when any call of it delivered).
    async fn read<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
        delivered: impl Fn(&T) -> bool,
    ) -> Result<T, StoreError> {
        let round = self.reads.start();
        let result = call.await;
        if let Some(busy) = round.finish(result.as_ref().is_ok_and(&delivered)) {
            self.trips.read(busy);
        }
        result
    }

    /// Runs one XACK-like call, counting its round.
    async fn ack<T>(&self, call: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let round = self.acks.start();
        let result = call.await;
        if round.finish(false).is_some() {
            TripCounters::hit(&self.trips.xack);
        }
        result
    }
}

impl<S: StreamStore> StreamStore for Counted<S> {
    async fn xadd(
        &self,
        stream: &str,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    ) -> Result<EntryId, StoreError> {
        TripCounters::hit(&self.trips.xadd);
        self.inner.xadd(stream, fields, maxlen).await
    }

    async fn ensure_group(&self, stream: &str, group: &str) -> Result<(), StoreError> {
        TripCounters::hit(&self.trips.setup);
        self.inner.ensure_group(stream, group).await
    }

    async fn create_group(&self, stream: &str, group: &str, start: GroupStart) -> Result<(), StoreError> {
        TripCounters::hit(&self.trips.setup);
        self.inner.create_group(stream, group, start).await
    }

    async fn xreadgroup(
        &self,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<(String, Vec<StreamEntry>)>, StoreError> {
        let call = self.inner.xreadgroup(group, consumer, streams, count, block_ms);
        self.read(call, |replies: &Vec<(String, Vec<StreamEntry>)>| replies.iter().any(|(_, e)| !e.is_empty())).await
    }

    async fn wait_for_entries(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> Result<Doorbell, StoreError> {
        TripCounters::hit(&self.trips.doorbell);
        self.inner.wait_for_entries(group, streams, block_ms).await
    }

    async fn xack(&self, stream: &str, group: &str, ids: &[EntryId]) -> Result<u64, StoreError> {
        self.ack(self.inner.xack(stream, group, ids)).await
    }

    async fn fenced_xreadgroup(
        &self,
        fence: &FenceCheck,
        group: &str,
        consumer: &str,
        stream: &str,
        from: ReadFrom,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let call = self.inner.fenced_xreadgroup(fence, group, consumer, stream, from, count);
        self.read(call, |entries: &Vec<StreamEntry>| !entries.is_empty()).await
    }

    async fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> Result<u64, StoreError> {
        self.ack(self.inner.fenced_xack(fence, stream, group, ids)).await
    }

    async fn fenced_xreadgroup_many(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError> {
        let call = self.inner.fenced_xreadgroup_many(group, consumer, reads);
        self.read(call, |results: &Vec<Result<Vec<StreamEntry>, StoreError>>| {
            results.iter().any(|r| r.as_ref().is_ok_and(|entries| !entries.is_empty()))
        })
        .await
    }

    async fn fenced_xack_many(
        &self,
        group: &str,
        acks: &[FencedAck],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        self.ack(self.inner.fenced_xack_many(group, acks)).await
    }

    async fn fenced_claim_all_pending(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        TripCounters::hit(&self.trips.setup);
        self.inner.fenced_claim_all_pending(fence, stream, group, consumer, min_idle_ms).await
    }

    async fn claim_all_pending(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        TripCounters::hit(&self.trips.setup);
        self.inner.claim_all_pending(stream, group, consumer, min_idle_ms).await
    }
}
