//! Benchmark of the pure decision core (not a test: it prints numbers).
//!
//! For 10 / 100 / 1,000 members x 64 / 1,024 / 16,384 shards it measures, on a settled group:
//! - a full rebalance: the decision for a new member's join (target recomputation with the sticky
//!   assignor, reconciliation of every shard, version/epoch bookkeeping, the cloned next state);
//! - the sticky assignor alone on the same join (the part Kafka's assignor benchmarks measure);
//! - a steady heartbeat decision that changes nothing (the read-only path), for a group without
//!   a view-proof key (written by an older release) and with one (every answer then carries its
//!   HMAC proof of the version, DESIGN §8), side by side;
//! - the same keyed steady heartbeat answered from the state's per-member index
//!   (`decide_heartbeat_indexed`, as the coordinator answers from its decoded cache), and the time
//!   to build that index (once per written state, by its first steady heartbeat);
//! - the aggregate's JSON size, and the time to encode it.
//!
//! Median of several runs, in microseconds. Run: `cargo bench --bench core`.

use std::collections::BTreeMap;
use std::time::Instant;

use rsc::core::assignor::{Assignor, StickyUniform};
use rsc::core::model::{Fence, GroupConfig, GroupId, GroupMetadata, Member, MemberState, ShardOwner};
use rsc::core::proof::ViewKey;
use rsc::core::protocol::HeartbeatRequest;
use rsc::core::{decide_heartbeat, decide_heartbeat_indexed, Context, GroupIndex, Observations};

fn settled(members: usize, shards: u32) -> GroupMetadata {
    let mut g = GroupMetadata::new(GroupId::new("bench", "group"), shards, GroupConfig::default());
    g.metadata_version = 10;
    g.assignment_epoch = 1;
    let ids: Vec<String> = (0..members).map(|i| format!("member-{i:05}")).collect();
    for id in &ids {
        g.members.insert(
            id.clone(),
            Member {
                member_epoch: 10,
                incarnation_epoch: 5,
                state: MemberState::Active,
                joined_at_version: 5,
                session: None,
            },
        );
    }
    g.target = StickyUniform.assign(shards, &ids, &BTreeMap::new(), &BTreeMap::new());
    for (shard, member) in &g.target {
        // Fencing is on by default: a settled grant carries its fence (without one, the next
        // decision raises it, which is a write, not a steady heartbeat).
        let fence = Some(Fence { counter: 1, nonce: u64::from(*shard) });
        g.current.insert(*shard, ShardOwner::Owned { member: member.clone(), since_assignment_epoch: 1, fence });
    }
    g.validate().expect("settled state is valid");
    g
}

fn request(g: &GroupMetadata, member: &str, epoch: u64) -> HeartbeatRequest {
    HeartbeatRequest {
        metadata_version_proof: None,
        group: g.group.clone(),
        member_id: member.into(),
        member_epoch: epoch,
        metadata_version: g.metadata_version,
        assignment_epoch: g.assignment_epoch,
        owned: g.owned_shards(member),
        revoking: Vec::new(),
        leave: false,
        member_session: None,
        fenced: Vec::new(),
    }
}

fn median_us(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[runs / 2]
}

fn main() {
    let obs = Observations::default();
    println!(
        "{:>8} {:>7} | {:>13} {:>12} {:>13} {:>12} {:>14} {:>15} {:>11} {:>12}",
        "members",
        "shards",
        "rebalance_us",
        "assignor_us",
        "heartbeat_us",
        "keyed_hb_us",
        "indexed_hb_us",
        "index_build_us",
        "json_bytes",
        "encode_us"
    );
    for members in [10usize, 100, 1_000] {
        for shards in [64u32, 1_024, 16_384] {
            let g = settled(members, shards);
            let ctx = Context {
                fresh_view_key: None,
                wall_clock_secs: 0,
                stored_revision: 7,
                observations: &obs,
                planted: Default::default(),
                nonce: 1,
            };
            let runs = if shards >= 16_384 { 15 } else { 51 };
            let join = request(&g, "member-new", 0);
            let rebalance = median_us(runs, || {
                let d = decide_heartbeat(&g, &join, ctx);
                assert!(d.write.next.is_some(), "a join rebalances");
            });
            let mut with_new: Vec<String> = g.members.keys().cloned().collect();
            with_new.push("member-new".into());
            with_new.sort();
            let assignor = median_us(runs, || {
                std::hint::black_box(StickyUniform.assign(shards, &with_new, &g.target, &g.current));
            });
            let steady = request(&g, "member-00000", 10);
            let heartbeat = median_us(runs, || {
                let d = decide_heartbeat(&g, &steady, ctx);
                assert!(d.write.next.is_none(), "a steady heartbeat changes nothing");
            });
            let mut keyed = g.clone();
            keyed.view_key = Some(ViewKey::from_bytes([7; 32]));
            let keyed_heartbeat = median_us(runs, || {
                let d = decide_heartbeat(&keyed, &steady, ctx);
                assert!(d.write.next.is_none(), "a steady heartbeat changes nothing");
                assert!(
                    d.outcome.as_ref().is_ok_and(|r| r.metadata_version_proof.is_some()),
                    "a keyed group's answer carries a proof"
                );
            });
            let index = GroupIndex::build(&keyed);
            assert_eq!(
                decide_heartbeat_indexed(&keyed, Some(&index), &steady, ctx),
                decide_heartbeat(&keyed, &steady, ctx),
                "the index answers as the scan does"
            );
            let indexed_heartbeat = median_us(runs, || {
                let d = decide_heartbeat_indexed(&keyed, Some(&index), &steady, ctx);
                assert!(d.write.next.is_none(), "a steady heartbeat changes nothing");
            });
            let index_build = median_us(runs, || {
                std::hint::black_box(GroupIndex::build(&keyed));
            });
            let json = serde_json::to_string(&g).expect("encodes");
            let encode = median_us(runs, || {
                std::hint::black_box(serde_json::to_string(&g).expect("encodes"));
            });
            println!(
                "{members:>8} {shards:>7} | {rebalance:>13.1} {assignor:>12.1} {heartbeat:>13.1} {keyed_heartbeat:>12.1} {indexed_heartbeat:>14.1} {index_build:>15.1} {:>11} {encode:>12.1}",
                json.len()
            );
        }
    }
}
