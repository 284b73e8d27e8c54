//! [`HeldStore`]: the in-memory store with two gates a test can arm, to build exact interleavings
//! of one coordinator's store calls with other requests and with store faults.
//!
//! - [`HeldStore::hold_next_touch`]: the next touch (`touch_and_load` / `touch_and_check`) runs on
//!   the store at once — the store answers — and its *answer* waits until the test releases it
//!   (a read answered before another request's write, delivered after it).
//! - [`HeldStore::stall_next_mutation`]: the next write or delete waits *before* it reaches the
//!   store (a coordinator stalled between its load and its write).
//! - [`HeldStore::stall_load`]: a later `load` waits before it reaches the store (a coordinator
//!   stalled between two reads of one request).
//!
//! - [`HeldStore::primary_down`]: a Redis Cluster primary that does not answer: the identity read
//!   (which needs every primary), its own account and the calls of the groups set on it are
//!   `Unavailable`; [`HeldStore::set_account`] gives the other primaries' own accounts.
//!
//! Every other call goes straight to the in-memory store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rsc::core::model::{Fence, GroupId, MemberId};
use rsc::store::memory::MemoryStore;
use rsc::store::{
    CasStamp, FenceRaise, MetadataStore, PrimaryIdentity, ProbeReport, RecordStamp, ServerIdentity, StoreError,
    StoredRecord, TouchCheck, TouchResult, WriteOutcome, WriteRequest,
};
use tokio::sync::oneshot;

/// A primary that does not answer: its node key, and the groups whose keys it holds.
type DownPrimary = (String, BTreeSet<GroupId>);

/// One armed gate: taken (and awaited) by the call it holds.
type Gate = Arc<Mutex<Option<oneshot::Receiver<()>>>>;

pub struct HeldStore {
    inner: MemoryStore,
    touch_answer: Gate,
    mutation: Gate,
    load_gate: Gate,
    /// Loads still to go before the armed load gate holds one (0: none armed).
    loads_to_stall: Arc<AtomicU64>,
    /// Set when the armed load reached its gate.
    load_stalled: Arc<std::sync::atomic::AtomicBool>,
    /// `load` and `liveness` calls: what a tick reads.
    reads: Arc<AtomicU64>,
    /// What `identity` answers instead of the in-memory store's (a Redis Cluster's, say).
    identity: Arc<Mutex<Option<ServerIdentity>>>,
    /// Own accounts `primary_account` answers, by node key (empty: not a Cluster, `None`).
    accounts: Arc<Mutex<BTreeMap<String, PrimaryIdentity>>>,
    /// A primary that does not answer: its node key, and the groups whose keys it holds.
    down: Arc<Mutex<Option<DownPrimary>>>,
}

fn arm(gate: &Gate) -> oneshot::Sender<()> {
    let (release, held) = oneshot::channel();
    *gate.lock().expect("gate lock") = Some(held);
    release
}

async fn pass(gate: &Gate) {
    let held = gate.lock().expect("gate lock").take();
    if let Some(held) = held {
        let _ = held.await;
    }
}

impl HeldStore {
    pub fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            touch_answer: Gate::default(),
            mutation: Gate::default(),
            load_gate: Gate::default(),
            loads_to_stall: Arc::default(),
            load_stalled: Arc::default(),
            reads: Arc::default(),
            identity: Arc::default(),
            accounts: Arc::default(),
            down: Arc::default(),
        }
    }

    /// From now on `primary_account` answers `account` for its node (unless it is down).
    pub fn set_account(&self, account: PrimaryIdentity) {
        self.accounts.lock().expect("accounts lock").insert(account.node_key().to_string(), account);
    }

    /// From now on the primary `node` does not answer: the identity read, its own account and
    /// every call of `groups` are `Unavailable`. `None` brings it back.
    pub fn primary_down(&self, down: Option<(&str, Vec<GroupId>)>) {
        *self.down.lock().expect("down lock") =
            down.map(|(node, groups)| (node.to_string(), groups.into_iter().collect()));
    }

    fn unavailable(&self, group: &GroupId) -> Result<(), StoreError> {
        match &*self.down.lock().expect("down lock") {
            Some((node, groups)) if groups.contains(group) => {
                Err(StoreError::Unavailable(format!("{node} does not answer")))
            }
            _ => Ok(()),
        }
    }

    /// From now on `identity` answers `identity` (a cluster's, with its slot map).
    pub fn set_identity(&self, identity: ServerIdentity) {
        *self.identity.lock().expect("identity lock") = Some(identity);
    }

    /// Arms the next touch: the store executes it at once, its answer waits for the sender.
    pub fn hold_next_touch(&self) -> oneshot::Sender<()> {
        arm(&self.touch_answer)
    }

    /// True once the armed touch ran and its answer is waiting.
    pub fn touch_is_held(&self) -> bool {
        self.touch_answer.lock().expect("gate lock").is_none()
    }

    /// Arms the next write or delete: it waits for the sender before the store sees it.
    pub fn stall_next_mutation(&self) -> oneshot::Sender<()> {
        arm(&self.mutation)
    }

    /// `load` and `liveness` calls so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Arms a load: after `skip` more loads, the next one waits for the sender before the store
    /// sees it.
    pub fn stall_load(&self, skip: u64) -> oneshot::Sender<()> {
        let release = arm(&self.load_gate);
        self.loads_to_stall.store(skip + 1, Ordering::SeqCst);
        release
    }

    /// True once the armed load has been sent and is waiting.
    pub fn load_is_stalled(&self) -> bool {
        self.load_stalled.load(Ordering::SeqCst)
    }

    /// True once the armed mutation has been sent and is waiting.
    pub fn is_stalled(&self) -> bool {
        self.mutation.lock().expect("gate lock").is_none()
    }
}

impl MetadataStore for HeldStore {
    async fn load(&self, group: &GroupId) -> Result<Option<StoredRecord>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.unavailable(group)?;
        let to_go = self.loads_to_stall.load(Ordering::SeqCst);
        if to_go > 0 {
            self.loads_to_stall.store(to_go - 1, Ordering::SeqCst);
            if to_go == 1 {
                self.load_stalled.store(true, Ordering::SeqCst);
                pass(&self.load_gate).await;
            }
        }
        self.inner.load(group).await
    }
    async fn touch_and_load_by(&self, group: &GroupId, member: &str, step: u64) -> Result<TouchResult, StoreError> {
        self.unavailable(group)?;
        let answer = self.inner.touch_and_load_by(group, member, step).await;
        pass(&self.touch_answer).await;
        answer
    }
    async fn touch_and_check_by(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
        step: u64,
    ) -> Result<TouchCheck, StoreError> {
        self.unavailable(group)?;
        let answer = self.inner.touch_and_check_by(group, member, known, step).await;
        pass(&self.touch_answer).await;
        answer
    }
    async fn liveness(&self, group: &GroupId) -> Result<BTreeMap<MemberId, u64>, StoreError> {
        self.unavailable(group)?;
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.liveness(group).await
    }
    async fn write(&self, group: &GroupId, request: WriteRequest) -> Result<WriteOutcome, StoreError> {
        self.unavailable(group)?;
        pass(&self.mutation).await;
        self.inner.write(group, request).await
    }
    async fn delete(&self, group: &GroupId, expected: &CasStamp) -> Result<WriteOutcome, StoreError> {
        pass(&self.mutation).await;
        self.inner.delete(group, expected).await
    }
    async fn acquire_mutex(&self, group: &GroupId, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        self.unavailable(group)?;
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

    async fn tick_roster(&self, instance: &str) -> Result<BTreeMap<String, u64>, StoreError> {
        self.inner.tick_roster(instance).await
    }

    async fn exchange_heard(
        &self,
        sender: &str,
        outgoing: &[(String, String)],
        ttl_ms: u64,
        senders: &[String],
    ) -> Result<Vec<Option<String>>, StoreError> {
        self.inner.exchange_heard(sender, outgoing, ttl_ms, senders).await
    }

    async fn forget_tickers(&self, instances: &[String]) -> Result<(), StoreError> {
        self.inner.forget_tickers(instances).await
    }
    async fn rebuild_index(&self) -> Result<Vec<GroupId>, StoreError> {
        self.inner.rebuild_index().await
    }
    async fn identity(&self) -> Result<ServerIdentity, StoreError> {
        if let Some((node, _)) = &*self.down.lock().expect("down lock") {
            return Err(StoreError::Unavailable(format!("{node} does not answer")));
        }
        let set = self.identity.lock().expect("identity lock").clone();
        match set {
            Some(identity) => Ok(identity),
            None => self.inner.identity().await,
        }
    }
    async fn probe(&self) -> Result<ProbeReport, StoreError> {
        let mut report = self.inner.probe().await?;
        if let Some(identity) = self.identity.lock().expect("identity lock").clone() {
            report.identity = identity;
        }
        Ok(report)
    }
    async fn raise_fences(&self, raises: &[FenceRaise]) -> Result<Vec<Fence>, StoreError> {
        self.inner.raise_fences(raises).await
    }
    async fn read_fences(&self, keys: &[String]) -> Result<Vec<Option<Fence>>, StoreError> {
        self.inner.read_fences(keys).await
    }
    async fn primary_account(&self, listed: &PrimaryIdentity) -> Result<Option<PrimaryIdentity>, StoreError> {
        let node = listed.node_key();
        if self.down.lock().expect("down lock").as_ref().is_some_and(|(down, _)| down == node) {
            return Err(StoreError::Unavailable(format!("{node} does not answer")));
        }
        let accounts = self.accounts.lock().expect("accounts lock");
        if accounts.is_empty() {
            return Ok(None);
        }
        accounts.get(node).cloned().map(Some).ok_or_else(|| StoreError::Unavailable(format!("{node} is unknown")))
    }
}
