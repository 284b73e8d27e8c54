//! Concurrent requests of one coordinator process: a read that Redis answered *before* another
//! request's write, delivered *after* it, is concurrency and never evidence of lost writes.
//!
//! [`HeldStore`] runs every call on the in-memory store at once (the store answers) and, for the
//! one call armed with [`HeldStore::hold_next_touch`], holds the *answer* until the test releases
//! it: exactly the order a busy coordinator sees when hundreds of heartbeats overlap a join.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rsc::core::model::MemberId;
use rsc::store::{
    CasStamp, ProbeReport, RecordStamp, ServerIdentity, StoreError, StoredRecord, TouchCheck, TouchResult,
    WriteOutcome, WriteRequest,
};
use tokio::sync::oneshot;

use super::*;

/// The in-memory store with one touch answer that can be held back.
struct HeldStore {
    inner: MemoryStore,
    hold: Arc<Mutex<Option<oneshot::Receiver<()>>>>,
}

impl HeldStore {
    fn new(inner: MemoryStore) -> Self {
        Self { inner, hold: Arc::new(Mutex::new(None)) }
    }

    /// Arms the next touch: the store executes it at once, its answer waits for the sender.
    fn hold_next_touch(&self) -> oneshot::Sender<()> {
        let (release, held) = oneshot::channel();
        *self.hold.lock().expect("hold lock") = Some(held);
        release
    }

    async fn deliver<T>(&self, answer: T) -> T {
        let held = self.hold.lock().expect("hold lock").take();
        if let Some(held) = held {
            let _ = held.await;
        }
        answer
    }
}

impl MetadataStore for HeldStore {
    async fn load(&self, group: &GroupId) -> Result<Option<StoredRecord>, StoreError> {
        self.inner.load(group).await
    }
    async fn touch_and_load(&self, group: &GroupId, member: &str) -> Result<TouchResult, StoreError> {
        let answer = self.inner.touch_and_load(group, member).await;
        self.deliver(answer).await
    }
    async fn touch_and_check(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
    ) -> Result<TouchCheck, StoreError> {
        let answer = self.inner.touch_and_check(group, member, known).await;
        self.deliver(answer).await
    }
    async fn liveness(&self, group: &GroupId) -> Result<BTreeMap<MemberId, u64>, StoreError> {
        self.inner.liveness(group).await
    }
    async fn write(&self, group: &GroupId, request: WriteRequest) -> Result<WriteOutcome, StoreError> {
        self.inner.write(group, request).await
    }
    async fn delete(&self, group: &GroupId, expected: &CasStamp) -> Result<WriteOutcome, StoreError> {
        self.inner.delete(group, expected).await
    }
    async fn acquire_mutex(&self, group: &GroupId, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        self.inner.acquire_mutex(group, token, ttl_ms).await
    }
    async fn release_mutex(&self, group: &GroupId, token: &str) -> Result<bool, StoreError> {
        self.inner.release_mutex(group, token).await
    }
    async fn index_add(&self, group: &GroupId) -> Result<(), StoreError> {
        self.inner.index_add(group).await
    }
    async fn index_members(&self) -> Result<Vec<GroupId>, StoreError> {
        self.inner.index_members().await
    }
    async fn rebuild_index(&self) -> Result<Vec<GroupId>, StoreError> {
        self.inner.rebuild_index().await
    }
    async fn identity(&self) -> Result<ServerIdentity, StoreError> {
        self.inner.identity().await
    }
    async fn probe(&self) -> Result<ProbeReport, StoreError> {
        self.inner.probe().await
    }
}

/// A steady heartbeat whose read Redis answered at revision r is delivered after a concurrent
/// join wrote r+1. Returns whether the group ended up in a correction round.
async fn steady_read_overtaken_by_a_join(planted: PlantedBugs) -> bool {
    let store = MemoryStore::new(21);
    let options = CoordinatorOptions { instance_id: "c1".into(), planted, ..CoordinatorOptions::default() };
    let held = HeldStore::new(store.connect());
    let c = Coordinator::new(held, options);
    c.start().await.expect("probe");
    let create = AdminRequest::CreateGroup { group: group(), shard_count: 4, config: fast_config() };
    c.admin(create).await.expect("create");
    let a = c.heartbeat(join("a")).await.expect("join a");
    let before = store.peek_record(&group()).expect("record").revision;

    let release = c.store().hold_next_touch();
    let slow = tokio::spawn({
        let c = c.clone();
        let steady = next(&a);
        async move { c.heartbeat(steady).await }
    });
    // The held touch has executed at the store once the spawned task parks on the hold.
    while c.store().hold.lock().expect("hold lock").is_some() {
        tokio::task::yield_now().await;
    }
    c.heartbeat(join("b")).await.expect("join b writes while a's answer is in flight");
    assert!(store.peek_record(&group()).expect("record").revision > before, "the join wrote");
    release.send(()).expect("the slow heartbeat is waiting");
    slow.await.expect("task").expect("the slow heartbeat is answered");

    recorded(&store).expect("record").correction.is_some()
}

#[tokio::test]
async fn a_read_overtaken_by_a_concurrent_write_is_not_loss_evidence() {
    assert!(!steady_read_overtaken_by_a_join(PlantedBugs::NONE).await, "concurrency started a correction round");
}

/// The same interleaving under the planted bug that compares with the process-wide maximum (the
/// behaviour before the fix) starts a correction round: the test above can fail.
#[tokio::test]
async fn the_process_wide_revision_mark_mistakes_the_same_race_for_loss() {
    assert!(steady_read_overtaken_by_a_join(PlantedBugs::only(PlantedBug::ProcessWideRevisionMark)).await);
}

/// The true positive stays: a read issued after a higher revision was observed that returns a
/// lower one (the store really went back) starts a round.
#[tokio::test]
async fn a_later_read_of_a_rolled_back_revision_is_still_evidence() {
    let store = MemoryStore::new(22);
    let c = short_mutex(&store, "c1");
    create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("join a");
    let kept = store.peek_record(&group()).expect("record").revision;
    c.heartbeat(join("b")).await.expect("join b");
    while store.peek_record(&group()).expect("record").revision > kept {
        store.rollback(1, RollbackMode::Silent);
    }
    // The rollback may restore a mutex whose release was lost: retry past its 50 ms TTL.
    for _ in 0..20 {
        let _ = c.heartbeat(next(&a)).await;
        if recorded(&store).expect("record").correction.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    panic!("a real regression was not recorded as evidence");
}

/// A request dropped inside its critical section (the client timed out, hyper dropped the handler)
/// must not leave the group's Redis mutex held until its TTL: every writer would stall for it.
#[tokio::test]
async fn a_critical_section_dropped_mid_way_releases_the_group_mutex() {
    let store = MemoryStore::new(23);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 4).await;
    c.heartbeat(join("a")).await.expect("join a");
    // Each store call takes 40 ms: the join of b holds the mutex (acquired by 40 ms) and is
    // reading the group when the caller gives up at 70 ms.
    store.set_latency_ms(40);
    let dropped = tokio::time::timeout(Duration::from_millis(70), c.heartbeat(join("b"))).await;
    assert!(dropped.is_err(), "the join was cut off inside its critical section");
    store.set_latency_ms(0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The default mutex TTL is 2 s and a busy mutex is retried for about 0.3 s: a leaked mutex
    // answers STORE_UNAVAILABLE here.
    let joined = c.heartbeat(join("c")).await;
    assert!(joined.is_ok(), "the next writer found the mutex still held: {joined:?}");
}
