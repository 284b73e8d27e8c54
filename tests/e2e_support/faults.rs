//! [`SlowPath`]: a fault between one consumer and Redis. Its XREADGROUP calls on chosen shard
//! streams reach Redis only after a delay (a congested or retransmitting network path), so a read
//! can still be on its way when the consumer is told to give the shard up.
//!
//! Wrapped *inside* the ground-truth recorder, so a recorded read spans from the moment the
//! consumer issued it to the moment it returned, the delay included: the command may execute at
//! any point of that span.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rsc::store::{
    Doorbell, EntryId, FenceCheck, FencedAck, FencedRead, GroupStart, ReadFrom, StoreError, StreamEntry, StreamStore,
};

/// A [`StreamStore`] that delays XREADGROUP on `slow_streams` by `delay` (nothing else).
#[derive(Clone)]
pub struct SlowPath<S> {
    inner: S,
    slow_streams: BTreeSet<String>,
    delay: Duration,
    /// Slow reads issued so far (shared by clones).
    slow_started: Arc<AtomicUsize>,
}

impl<S> SlowPath<S> {
    /// No delay at all.
    pub fn none(inner: S) -> Self {
        Self::new(inner, BTreeSet::new(), Duration::ZERO)
    }

    pub fn new(inner: S, slow_streams: BTreeSet<String>, delay: Duration) -> Self {
        Self { inner, slow_streams, delay, slow_started: Arc::new(AtomicUsize::new(0)) }
    }

    /// A counter of the slow reads issued so far.
    pub fn slow_started(&self) -> Arc<AtomicUsize> {
        self.slow_started.clone()
    }
}

impl<S: StreamStore> StreamStore for SlowPath<S> {
    async fn xadd(
        &self,
        stream: &str,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    ) -> Result<EntryId, StoreError> {
        self.inner.xadd(stream, fields, maxlen).await
    }

    async fn create_group(&self, stream: &str, group: &str, start: GroupStart) -> Result<(), StoreError> {
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
        if streams.iter().any(|(s, _)| self.slow_streams.contains(s)) {
            self.slow_started.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
        }
        self.inner.xreadgroup(group, consumer, streams, count, block_ms).await
    }

    async fn wait_for_entries(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> Result<Doorbell, StoreError> {
        self.inner.wait_for_entries(group, streams, block_ms).await
    }

    async fn xack(&self, stream: &str, group: &str, ids: &[EntryId]) -> Result<u64, StoreError> {
        self.inner.xack(stream, group, ids).await
    }

    async fn claim_all_pending(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        self.inner.claim_all_pending(stream, group, consumer, min_idle_ms).await
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
        if self.slow_streams.contains(stream) {
            self.slow_started.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
        }
        self.inner.fenced_xreadgroup(fence, group, consumer, stream, from, count).await
    }

    /// Forwarded as one call; when it reads a slow stream, the whole call is held (one script
    /// call on a slow path holds every shard it reads).
    async fn fenced_xreadgroup_many(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError> {
        if reads.iter().any(|read| self.slow_streams.contains(&read.stream)) {
            self.slow_started.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
        }
        self.inner.fenced_xreadgroup_many(group, consumer, reads).await
    }

    async fn fenced_xack_many(
        &self,
        group: &str,
        acks: &[FencedAck],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        self.inner.fenced_xack_many(group, acks).await
    }

    async fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> Result<u64, StoreError> {
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
        self.inner.fenced_claim_all_pending(fence, stream, group, consumer, min_idle_ms).await
    }
}
