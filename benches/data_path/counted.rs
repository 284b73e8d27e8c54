//! [`Counted`]: a [`StreamStore`] that counts the round trips the client libraries make, by
//! command and by outcome, and passes every call on unchanged.
//!
//! Owns only counters (atomics: no lock on the data path). Never changes, retries or reorders a
//! call. Each `RedisStore` stream method is one round trip except `claim_all_pending`, which pages
//! XAUTOCLAIM (one page per call at the sizes this bench runs; counted as one). The fenced
//! variants (one script call each) count under the same names as the plain ones, so the rows
//! with fencing on and off compare directly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rsc::store::{Doorbell, EntryId, FenceCheck, GroupStart, ReadFrom, StoreError, StreamEntry, StreamStore};

/// Round trips by kind, since the counters were made.
#[derive(Default)]
pub struct TripCounters {
    pub xadd: AtomicU64,
    /// XREADGROUP calls that returned at least one entry.
    pub read_busy: AtomicU64,
    /// XREADGROUP calls that returned nothing.
    pub read_empty: AtomicU64,
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

    /// Counts one XREADGROUP by whether it delivered anything.
    pub fn read(&self, delivered: bool) {
        Self::hit(if delivered { &self.read_busy } else { &self.read_empty });
    }
}

/// The wrapped store and the counters it adds to (shared by every clone).
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    trips: Arc<TripCounters>,
}

impl<S> Counted<S> {
    pub fn new(inner: S, trips: Arc<TripCounters>) -> Self {
        Self { inner, trips }
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
        let result = self.inner.xreadgroup(group, consumer, streams, count, block_ms).await;
        self.trips.read(matches!(&result, Ok(replies) if replies.iter().any(|(_, e)| !e.is_empty())));
        result
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
        TripCounters::hit(&self.trips.xack);
        self.inner.xack(stream, group, ids).await
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
        let result = self.inner.fenced_xreadgroup(fence, group, consumer, stream, from, count).await;
        self.trips.read(matches!(&result, Ok(entries) if !entries.is_empty()));
        result
    }

    async fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> Result<u64, StoreError> {
        TripCounters::hit(&self.trips.xack);
        self.inner.fenced_xack(fence, stream, group, ids).await
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
