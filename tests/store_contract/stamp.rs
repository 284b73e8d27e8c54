//! Contract cases for the write condition: a write or delete is applied only when the key holds
//! the very write it was computed from — revision *and* writeId (`CasStamp`). Revisions repeat
//! after a failover or rollback: revision r lost, then written again by someone else. A writer
//! that loaded the lost r must be refused, on Redis and in the fake alike (the ABA).
//!
//! The loss is made by a [`LoseAndRewrite`] per store: on a real server, by hand (`HSET` of the
//! same revision with another writeId and aggregate — exactly what a rollback followed by another
//! coordinator's write leaves); in the fake, by its own rollback fault followed by a real write.

use std::collections::BTreeMap;
use std::future::Future;

use rsc::core::model::GroupId;
use rsc::store::keys;
use rsc::store::memory::{MemoryStore, RollbackMode};
use rsc::store::{CasStamp, MetadataStore, StoreError, StreamStore, WriteOutcome, WriteRequest};

use crate::metadata::{cas, create, group, stored};
use crate::support::redis_cluster::RedisCluster;
use crate::support::RedisServer;

/// Loses the last write of `group` (revision r) and writes revision r again with `write_id` and
/// `aggregate`, as a failover that lost the write followed by another writer's write would.
pub trait LoseAndRewrite {
    fn lose_and_rewrite(&self, group: &GroupId, write_id: &str, aggregate: &str) -> impl Future<Output = ()>;
}

/// On a real server: the rewritten hash, set by hand on the admin connection.
pub struct HandRewrite<'a>(pub &'a RedisServer);

impl LoseAndRewrite for HandRewrite<'_> {
    async fn lose_and_rewrite(&self, group: &GroupId, write_id: &str, aggregate: &str) {
        let key = keys::metadata_key(group);
        let revision: String = redis::from_redis_value(self.0.cmd(&["HGET", &key, "revision"])).expect("revision");
        self.0.cmd(&["HSET", &key, "revision", &revision, "writeId", write_id, "aggregate", aggregate]);
    }
}

/// On a Redis Cluster: the same, on the primary that holds the group's metadata slot.
pub struct ClusterHandRewrite<'a>(pub &'a RedisCluster);

impl LoseAndRewrite for ClusterHandRewrite<'_> {
    async fn lose_and_rewrite(&self, group: &GroupId, write_id: &str, aggregate: &str) {
        let key = keys::metadata_key(group);
        HandRewrite(self.0.node_for_key(&key)).lose_and_rewrite(group, write_id, aggregate).await;
    }
}

/// In the fake: its silent rollback of the last journaled write, then a write through the API.
pub struct RollbackRewrite(pub MemoryStore);

impl LoseAndRewrite for RollbackRewrite {
    async fn lose_and_rewrite(&self, group: &GroupId, write_id: &str, aggregate: &str) {
        let lost = self.0.peek_record(group).expect("a record to lose");
        assert_eq!(self.0.rollback(1, RollbackMode::Silent), 1);
        let base = self.0.peek_record(group).expect("the record before the lost write").cas_stamp();
        assert_eq!(base.revision + 1, lost.revision, "the last journaled write was the lost revision");
        let request = WriteRequest { write_id: write_id.to_string(), ..cas(&base, aggregate) };
        assert_eq!(self.0.write(group, request).await, Ok(WriteOutcome::Written { revision: lost.revision }));
    }
}

/// A write and a delete computed from a lost revision are refused once that revision was written
/// again, and change nothing; the same requests on the stored write succeed.
pub async fn contract_a_lost_and_rewritten_revision_refuses_the_old_stamp<S, L>(store: &S, loss: &L)
where
    S: MetadataStore + StreamStore + Clone,
    L: LoseAndRewrite,
{
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(WriteOutcome::Written { revision: 1 }));
    store.touch_and_load(&g, "m1").await.expect("touch");
    assert_eq!(store.write(&g, cas(&stored(store, &g).await, "v2")).await, Ok(WriteOutcome::Written { revision: 2 }));
    let lost = stored(store, &g).await;

    loss.lose_and_rewrite(&g, "rewritten-after-the-loss", "v2, another write").await;
    let rewritten = store.load(&g).await.expect("load").expect("record");
    assert_eq!(rewritten.cas_stamp(), CasStamp { revision: 2, write_id: "rewritten-after-the-loss".into() });
    assert_eq!(rewritten.aggregate, "v2, another write");

    // A coordinator that loaded the lost revision 2 writes (and would expire m1) or deletes.
    let conflict = Ok(WriteOutcome::RevisionConflict { current: Some(2) });
    let stale = WriteRequest { liveness_remove: vec!["m1".into()], ..cas(&lost, "computed from the lost v2") };
    assert_eq!(store.write(&g, stale).await, conflict);
    assert_eq!(store.delete(&g, &lost).await, conflict);
    assert_eq!(store.load(&g).await, Ok(Some(rewritten.clone())), "nothing was written");
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::from([("m1".to_string(), 1)])), "nothing was removed");
    assert_eq!(store.index_members().await, Ok(vec![g.clone()]));

    // The stored write's own stamp still works, for a write and then a delete.
    let request = WriteRequest { liveness_remove: vec!["m1".into()], ..cas(&rewritten.cas_stamp(), "v3") };
    assert_eq!(store.write(&g, request).await, Ok(WriteOutcome::Written { revision: 3 }));
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::new()));
    assert_eq!(store.delete(&g, &stored(store, &g).await).await, Ok(WriteOutcome::Written { revision: 0 }));
    assert_eq!(store.load(&g).await, Ok(None));
}

/// A write without a writeId is refused before anything is sent: a record without one would match
/// the id-less condition of pre-`writeId` records, so it could not be told from another such write.
pub async fn contract_a_write_needs_a_write_id<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    let anonymous = |request: WriteRequest| WriteRequest { write_id: String::new(), ..request };
    let refused = store.write(&g, anonymous(create("v1"))).await;
    assert!(matches!(refused, Err(StoreError::Protocol(ref m)) if m.contains("writeId")), "{refused:?}");
    assert_eq!(store.load(&g).await, Ok(None));
    assert_eq!(store.write(&g, create("v1")).await, Ok(WriteOutcome::Written { revision: 1 }));
    let before = store.load(&g).await.expect("load");
    let refused = store.write(&g, anonymous(cas(&stored(store, &g).await, "v2"))).await;
    assert!(matches!(refused, Err(StoreError::Protocol(_))), "{refused:?}");
    assert_eq!(store.load(&g).await.expect("load"), before);
}
