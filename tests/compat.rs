//! The compatibility rule of `docs/DESIGN.md` §6 for revoke ids: old clients and records written
//! (or rewritten) by old binaries lack `revokeId`; they must decode, and their absence must be the
//! safe case (nothing is released by a report that cannot name the recorded revoke).

mod core_support;

use core_support::{beat, Client, World};
use rsc::core::model::{GroupMetadata, ShardOwner};
use rsc::core::protocol::{HeartbeatRequest, HeartbeatResponse, HeartbeatStatus};

/// A owns 4 shards, B joins, A is told to drain 2 and 3 (recorded with revoke ids).
fn draining() -> (World, Client) {
    let mut w = World::new(4);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    beat(&mut w, &mut a).expect("a joins");
    beat(&mut w, &mut b).expect("b joins");
    let drain = beat(&mut w, &mut a).expect("a learns the drain");
    assert_eq!((drain.revoke.clone(), drain.drains.len()), (vec![2, 3], 2));
    (w, a)
}

/// Removes every `revokeId` key from a JSON value, as a binary that predates it would.
fn strip_revoke_ids(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove("revokeId");
            map.values_mut().for_each(strip_revoke_ids);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_revoke_ids),
        _ => {}
    }
}

#[test]
fn a_record_rewritten_by_an_old_binary_decodes_and_no_report_releases_its_revokes() {
    let (mut w, a) = draining();
    let mut json = serde_json::to_value(&w.g).expect("encode");
    strip_revoke_ids(&mut json);
    let old: GroupMetadata = serde_json::from_value(json).expect("an old binary's record decodes");
    assert!(matches!(old.current.get(&2), Some(ShardOwner::Revoking { revoke_id: None, .. })));
    w.g = old;
    let answer = w.heartbeat(&a.request()).expect("answered");
    assert!(answer.drains.is_empty(), "no instruction id to hand out for a legacy revoke");
    assert_eq!(w.g.revoking_shards("a"), vec![2, 3], "a report naming an id the record lacks releases nothing");
}

#[test]
fn an_old_clients_report_decodes_and_releases_nothing() {
    let (mut w, a) = draining();
    let mut json = serde_json::to_value(a.request()).expect("encode");
    strip_revoke_ids(&mut json);
    let old: HeartbeatRequest = serde_json::from_value(json).expect("an old client's heartbeat decodes");
    assert!(old.revoking.iter().all(|r| r.revoked && r.revoke_id.is_none()));
    let answer = w.heartbeat(&old).expect("answered, not refused");
    assert_eq!(answer.status, HeartbeatStatus::RevokePending);
    assert_eq!(w.g.revoking_shards("a"), vec![2, 3]);
}

#[test]
fn a_new_client_reads_an_old_coordinators_answer_without_drains() {
    let (mut w, a) = draining();
    let mut json = serde_json::to_value(w.heartbeat(&a.request()).expect("answered")).expect("encode");
    json.as_object_mut().expect("object").remove("drains");
    let old: HeartbeatResponse = serde_json::from_value(json).expect("an old coordinator's answer decodes");
    assert!(old.drains.is_empty());
    assert!(old.revoked_reports().iter().all(|r| r.revoke_id.is_none()), "nothing to name: the old rule applies");
}
