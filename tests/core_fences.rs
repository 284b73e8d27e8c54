//! Fences in grants (issue #10, DESIGN §10), against the pure core and a world that raises fences
//! the way the coordinator does (fence first, then the grant, then the answer): every grant is
//! recorded with a fence and answered with exactly that value, repeated answers repeat it, a drain
//! keeps it, a new owner gets a strictly newer one, the owner's report of a refused fence gets it a
//! new one (and a late, foreign or mismatched report changes nothing), a grant recorded without a
//! fence by an older binary is fenced before it is answered again, and fencing off records none.

mod core_support;

use core_support::{beat, config, Client, World};
use rsc::core::fence::ShardFence;
use rsc::core::model::{Fence, GroupMetadata, ShardId, ShardOwner};
use rsc::core::protocol::{HeartbeatResponse, HeartbeatStatus};
use rsc::core::GroupConfig;

fn recorded_fence(g: &GroupMetadata, shard: ShardId) -> Option<Fence> {
    match g.current.get(&shard)? {
        ShardOwner::Owned { fence, .. } | ShardOwner::Revoking { fence, .. } | ShardOwner::Fenced { fence, .. } => {
            *fence
        }
    }
}

fn answered(r: &HeartbeatResponse, shard: ShardId) -> Option<Fence> {
    r.fences.iter().find(|f| f.shard == shard).map(|f| f.fence)
}

/// One member owning all four shards.
fn owned_world() -> (World, Client) {
    let mut w = World::new(4);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("join");
    let ok = beat(&mut w, &mut a).expect("ok");
    assert_eq!((ok.status, ok.assigned.clone()), (HeartbeatStatus::Ok, vec![0, 1, 2, 3]));
    (w, a)
}

#[test]
fn every_grant_is_recorded_with_a_fence_and_answered_with_that_value() {
    let (mut w, mut a) = owned_world();
    let answer = beat(&mut w, &mut a).expect("steady");
    for shard in 0..4 {
        let recorded = recorded_fence(&w.g, shard).expect("a recorded fence");
        assert_eq!(answered(&answer, shard), Some(recorded), "shard {shard}");
    }
    let revision = w.revision;
    let again = beat(&mut w, &mut a).expect("steady again");
    assert_eq!(w.revision, revision, "a steady heartbeat writes nothing");
    assert_eq!(again.fences, answer.fences, "a repeated answer carries the same fences");
}

#[test]
fn a_drain_keeps_the_fence_and_the_next_owner_gets_a_newer_one() {
    let (mut w, mut a) = owned_world();
    let before: Vec<Option<Fence>> = (0..4).map(|s| recorded_fence(&w.g, s)).collect();
    let mut b = Client::new("b");
    beat(&mut w, &mut b).expect("b joins");
    let drain = beat(&mut w, &mut a).expect("a is told to drain");
    assert_eq!(drain.status, HeartbeatStatus::RevokePending);
    for shard in &drain.revoke {
        assert_eq!(answered(&drain, *shard), before[*shard as usize], "draining shard {shard} keeps its fence");
    }
    beat(&mut w, &mut a).expect("a reports REVOKED");
    let granted = beat(&mut w, &mut b).expect("b is granted");
    assert_eq!(granted.status, HeartbeatStatus::Ok);
    for shard in &granted.assigned {
        let new = answered(&granted, *shard).expect("b's grant is fenced");
        let old = before[*shard as usize].expect("a's grant was fenced");
        assert!(new.counter > old.counter, "shard {shard}: {new} is not newer than {old}");
    }
}

#[test]
fn the_owners_report_of_a_refused_fence_gets_it_a_new_one_and_nothing_else_does() {
    let (mut w, a) = owned_world();
    let mut b = Client::new("b");
    beat(&mut w, &mut b).expect("b joins");
    // A shard `a` keeps through the rebalance.
    let shard = *w.g.target.iter().find(|(_, m)| m.as_str() == "a").expect("a keeps a shard").0;
    let old = recorded_fence(&w.g, shard).expect("fenced");
    // Another member's report of the same value changes nothing.
    let mut foreign = b.request();
    foreign.fenced = vec![ShardFence { shard, fence: old }];
    let _ = w.heartbeat(&foreign);
    assert_eq!(recorded_fence(&w.g, shard), Some(old), "a report from another member refences nothing");
    // A report of a value that is not the recorded one changes nothing.
    let mut wrong = a.request();
    wrong.fenced = vec![ShardFence { shard, fence: Fence { counter: old.counter, nonce: old.nonce ^ 1 } }];
    w.heartbeat(&wrong).expect("answered");
    assert_eq!(recorded_fence(&w.g, shard), Some(old), "a mismatched report refences nothing");
    // The owner's report of exactly the recorded value: a new, newer fence for the same owner.
    let mut report = a.request();
    report.fenced = vec![ShardFence { shard, fence: old }];
    let answer = w.heartbeat(&report).expect("refenced");
    let new = recorded_fence(&w.g, shard).expect("fenced again");
    assert!(new.counter > old.counter, "{new} is not newer than {old}");
    assert!(
        matches!(w.g.current.get(&shard), Some(ShardOwner::Owned { member, .. } | ShardOwner::Revoking { member, .. }) if member == "a")
    );
    assert_eq!(answered(&answer, shard), Some(new), "the answer carries the new value");
    // The same report delivered late (or twice) changes nothing now.
    let revision = w.revision;
    w.heartbeat(&report).expect("late duplicate");
    assert_eq!(recorded_fence(&w.g, shard), Some(new));
    assert_eq!(w.revision, revision, "a late duplicate writes nothing");
}

#[test]
fn a_grant_recorded_without_a_fence_is_fenced_before_it_is_answered_again() {
    let (mut w, mut a) = owned_world();
    // An older binary rewrote the record and dropped the fences.
    for owner in w.g.current.values_mut() {
        if let ShardOwner::Owned { fence, .. } = owner {
            *fence = None;
        }
    }
    let answer = beat(&mut w, &mut a).expect("steady");
    for shard in 0..4 {
        let recorded = recorded_fence(&w.g, shard).expect("fenced again");
        assert_eq!(answered(&answer, shard), Some(recorded));
    }
}

#[test]
fn with_fencing_off_grants_carry_no_fence() {
    let mut w = World::with_config(4, GroupConfig { fencing: false, ..config() });
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("join");
    let ok = beat(&mut w, &mut a).expect("ok");
    assert_eq!(ok.assigned, vec![0, 1, 2, 3]);
    assert!(ok.fences.is_empty(), "{:?}", ok.fences);
    assert!((0..4).all(|s| recorded_fence(&w.g, s).is_none()));
}

#[test]
fn a_record_without_the_fencing_field_reads_as_fencing_on() {
    let mut json = serde_json::to_value(config()).expect("config");
    json.as_object_mut().expect("object").remove("fencing");
    let config: GroupConfig = serde_json::from_value(json).expect("an older record's config");
    assert!(config.fencing);
}
