//! Property tests: random sequences of time, heartbeat outcomes, reads and acks against a small
//! model of what the consumer is *permitted* to read. The model is deliberately simpler than the
//! core: a permission set that only `OK` can grow, that every other outcome can only shrink, and a
//! lease end counted from the send time of the last successful heartbeat.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::core::protocol::{ApiError, Drain, ErrorCode, HeartbeatStatus};

const LEASE_MS: u64 = 500;
const SHARDS: u32 = 4;

#[derive(Clone, Debug)]
enum Outcome {
    Success { status: HeartbeatStatus, assigned: BTreeSet<ShardId>, revoke: BTreeSet<ShardId> },
    Transient,
    Fenced,
    GroupGone,
}

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    /// Send the due heartbeat (if any), answer it `delay_ms` later.
    Heartbeat {
        delay_ms: u64,
        outcome: Outcome,
    },
    /// Run every read plan; reads return `entries` new entries each.
    Read {
        entries: u8,
    },
    /// Ack (or abandon) the `index`-th delivery still held by the app.
    Settle {
        index: usize,
        abandon: bool,
    },
    Close,
}

fn shard_set() -> impl Strategy<Value = BTreeSet<ShardId>> {
    proptest::collection::btree_set(0..SHARDS, 0..=SHARDS as usize)
}

fn outcome() -> impl Strategy<Value = Outcome> {
    let status = prop_oneof![
        3 => Just(HeartbeatStatus::Ok),
        1 => Just(HeartbeatStatus::RevokePending),
        1 => Just(HeartbeatStatus::SyncMetadata),
    ];
    prop_oneof![
        6 => (status, shard_set(), shard_set()).prop_map(|(status, assigned, revoke)| {
            let revoke = revoke.difference(&assigned).copied().collect();
            Outcome::Success { status, assigned, revoke }
        }),
        2 => Just(Outcome::Transient),
        1 => Just(Outcome::Fenced),
        1 => Just(Outcome::GroupGone),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u64..300).prop_map(Step::Advance),
        4 => (0u64..700, outcome()).prop_map(|(delay_ms, outcome)| Step::Heartbeat { delay_ms, outcome }),
        3 => (0u8..3).prop_map(|entries| Step::Read { entries }),
        2 => (0usize..8, any::<bool>()).prop_map(|(index, abandon)| Step::Settle { index, abandon }),
        1 => Just(Step::Close),
    ]
}

fn response(status: HeartbeatStatus, assigned: &BTreeSet<ShardId>, revoke: &BTreeSet<ShardId>) -> HeartbeatResponse {
    HeartbeatResponse {
        metadata_version_proof: None,
        status,
        member_id: "m1".into(),
        member_epoch: 3,
        metadata_version: 5,
        assignment_epoch: 2,
        shard_count: SHARDS,
        assigned: assigned.iter().copied().collect(),
        pending: Vec::new(),
        revoke: revoke.iter().copied().collect(),
        drains: revoke.iter().map(|&shard| Drain { shard, revoke_id: u64::from(shard) + 1 }).collect(),
        assignment_lease_ms: LEASE_MS,
        heartbeat_interval_ms: 100,
        store_revision: 1,
        fences: Vec::new(),
    }
}

/// What the consumer may read, per the rules, independent of how the core tracks it.
struct Model {
    permitted: BTreeSet<ShardId>,
    lease_end_ms: Option<u64>,
}

impl Model {
    fn expire(&mut self, now_ms: u64) {
        if self.lease_end_ms.is_some_and(|end| now_ms >= end) {
            self.lease_end_ms = None;
            self.permitted.clear();
        }
    }

    fn apply(&mut self, sent_ms: u64, now_ms: u64, outcome: &Outcome, active: bool) {
        match outcome {
            Outcome::Success { status, assigned, .. } => {
                let lease_end = sent_ms + LEASE_MS;
                self.lease_end_ms = Some(lease_end);
                self.permitted = if *status == HeartbeatStatus::Ok && active && now_ms < lease_end {
                    assigned.clone()
                } else {
                    self.permitted.intersection(assigned).copied().collect()
                };
                if !active {
                    self.permitted.clear();
                }
            }
            Outcome::Transient => {}
            Outcome::Fenced | Outcome::GroupGone => {
                self.lease_end_ms = None;
                self.permitted.clear();
            }
        }
        self.expire(now_ms);
    }
}

fn check_request(req: &HeartbeatRequest, readable: &[ShardId]) -> Result<(), TestCaseError> {
    let owned: BTreeSet<ShardId> = req.owned.iter().copied().collect();
    prop_assert_eq!(&req.owned, &readable.to_vec(), "owned = what may be read at send time");
    for report in &req.revoking {
        prop_assert!(!owned.contains(&report.shard), "shard {} both owned and revoking", report.shard);
        prop_assert!(!report.revoked || report.in_flight == 0, "REVOKED only when drained");
        if req.leave {
            prop_assert!(report.revoked, "a leave reports every shard REVOKED");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn reads_stay_within_the_permission_and_the_lease(steps in proptest::collection::vec(step(), 1..60)) {
        let mut core = ConsumerCore::new(ConsumerConfig::new(GroupId::new("p", "g"), "m1"));
        let mut model = Model { permitted: BTreeSet::new(), lease_end_ms: None };
        let mut now_ms = 0u64;
        let mut next_entry_ms = 1u64;
        let mut held: Vec<Delivery> = Vec::new();
        for step in steps {
            match step {
                Step::Advance(ms) => now_ms += ms,
                Step::Heartbeat { delay_ms, outcome } => {
                    let readable = core.readable_shards(now_ms);
                    let Some(req) = core.poll_heartbeat(now_ms) else { continue };
                    check_request(&req, &readable)?;
                    let sent_ms = now_ms;
                    now_ms += delay_ms;
                    model.expire(now_ms);
                    let result = match &outcome {
                        Outcome::Success { status, assigned, revoke } => Ok(response(*status, assigned, revoke)),
                        Outcome::Transient => Err(TransportError::Timeout),
                        Outcome::Fenced => Err(TransportError::Api(ApiError::new(ErrorCode::FencedMemberEpoch, "x"))),
                        Outcome::GroupGone => Err(TransportError::Api(ApiError::new(ErrorCode::MetadataMissing, "x"))),
                    };
                    let active = core.phase() == Phase::Active && !req.leave;
                    core.handle_heartbeat(now_ms, result);
                    model.apply(sent_ms, now_ms, &outcome, active);
                    if matches!(outcome, Outcome::Success { .. }) && core.phase() != Phase::Left {
                        prop_assert_eq!(core.lease_end_ms(), model.lease_end_ms, "lease from the send time");
                    }
                    if matches!(outcome, Outcome::Fenced) {
                        if let Some(next) = core.poll_heartbeat(now_ms + 1_000) {
                            prop_assert_eq!(next.member_epoch, 0, "fenced members rejoin with epoch 0");
                            prop_assert!(next.owned.is_empty() && next.revoking.is_empty());
                            core.handle_heartbeat(now_ms + 1_000, Err(TransportError::Timeout));
                        }
                        now_ms += 1_000;
                        model.expire(now_ms);
                    }
                }
                Step::Read { entries } => {
                    for plan in core.read_plans(now_ms) {
                        prop_assert!(model.permitted.contains(&plan.shard), "read plan for unpermitted shard {}", plan.shard);
                        match plan.step {
                            ReadStep::Setup => core.setup_done(plan.shard, plan.generation),
                            ReadStep::Read(_) => {
                                let batch: Vec<StreamEntry> = (0..entries)
                                    .map(|_| {
                                        next_entry_ms += 1;
                                        StreamEntry { id: EntryId { ms: next_entry_ms, seq: 0 }, fields: vec![] }
                                    })
                                    .collect();
                                held.extend(core.handle_read(now_ms, plan, 10, batch));
                            }
                        }
                    }
                }
                Step::Settle { index, abandon } => {
                    if held.is_empty() {
                        continue;
                    }
                    let delivery = held.remove(index % held.len());
                    if abandon {
                        let _ = core.abandon(now_ms, &delivery);
                    } else if core.check_ack(now_ms, &delivery).is_ok() {
                        prop_assert!(model.lease_end_ms.is_some_and(|end| now_ms < end), "ack allowed past the lease");
                        core.acked(now_ms, &delivery);
                    }
                }
                Step::Close => {
                    core.close(now_ms);
                    model.permitted.clear();
                }
            }
            model.expire(now_ms);
            let readable: BTreeSet<ShardId> = core.readable_shards(now_ms).into_iter().collect();
            prop_assert!(readable.is_subset(&model.permitted), "readable {:?} not within permitted {:?}", readable, model.permitted);
            if readable.iter().next().is_some() {
                prop_assert!(model.lease_end_ms.is_some_and(|end| now_ms < end), "readable after the lease ended");
            }
        }
    }
}
