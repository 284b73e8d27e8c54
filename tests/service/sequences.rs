//! Property: **no sequence of data-plane and admin requests, valid or not, brings a group into a
//! state in which a well-formed join is answered 5xx** (DESIGN.md, "Client numbers are bounded at
//! the edge"). Random mixes of joins, steady heartbeats echoing the member's last answer, leaves,
//! heartbeats carrying absurd numbers, routing refreshes with any `knownVersion` (huge ones
//! included), add-shards and set-config (valid or not, with the current or any revision), ticks
//! and short sleeps, through `Coordinator` over the in-memory store on a real tokio runtime.
//!
//! Checked after every request: nothing is answered 5xx (the store is healthy and the coordinator
//! is not terminating, so not even the documented 503s are expected); a request carrying a number
//! above `CLIENT_NUMBER_MAX` is `BAD_REQUEST` and changes neither the record nor the liveness
//! hash; an echo of the coordinator's own answer is never `BAD_REQUEST`, because every number it
//! hands out stays within the bound. At the end a fresh member's join must succeed.
//!
//! Leases are a few milliseconds long so expiry, fencing and correction rounds happen within a
//! case (real time: sleeps and slow machines only change which of them happen). `PROPTEST_CASES`
//! sets the case count: 64 by default; CI's 1,000 take about 5 s on two cores. Failures are not
//! persisted: a case depends on timing, so shrinking prints the sequence to rerun by hand.
//! Validated against the fixes it guards: without the edge bounds it finds a join that overflows
//! after one heartbeat with `metadataVersion = u64::MAX`; without `CLIENT_VERSION_AHEAD_MAX` it
//! finds a join answered 500 after one routing report of `CLIENT_NUMBER_MAX`.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rsc::core::model::{CLIENT_NUMBER_MAX, SHARD_COUNT_MAX};
use rsc::core::protocol::{ApiError, RoutingReport, RoutingResponse};
use rsc::store::StoredRecord;

use super::*;

const MEMBERS: usize = 4;

/// Leases of a few milliseconds: waits end within a case.
fn tiny_config() -> GroupConfig {
    GroupConfig {
        member_lease_ttl_ms: 12,
        assignment_lease_ms: 6,
        heartbeat_interval_ms: 2,
        rebalance_timeout_ms: 15,
        routing_cache_ttl_ms: 6,
        routing_refresh_interval_ms: 3,
        ..GroupConfig::default()
    }
}

/// A number field of a heartbeat.
#[derive(Clone, Copy, Debug)]
enum Field {
    MemberEpoch,
    MetadataVersion,
    AssignmentEpoch,
}

/// A revision an admin request names.
#[derive(Clone, Copy, Debug)]
enum Revision {
    /// The stored one (the request can succeed).
    Current,
    Value(u64),
}

/// A `knownVersion` a producer reports.
#[derive(Clone, Copy, Debug)]
enum Known {
    /// The stored metadataVersion plus this much (a producer ahead of a store that lost writes).
    StoredPlus(u64),
    Value(u64),
}

#[derive(Clone, Debug)]
enum Op {
    /// Member i joins (or rejoins as a new incarnation) with epoch 0.
    Join(usize),
    /// Member i echoes its last answer (joins when it has none).
    Steady(usize),
    /// Member i reports everything REVOKED and leaves.
    Leave(usize),
    /// Member i's next heartbeat with one number replaced by `value` (above the bound or not).
    Absurd(usize, Field, u64),
    Routing(Known),
    AddShards(u32, Revision),
    SetConfig(GroupConfig, Revision),
    Tick,
    SleepMs(u64),
}

/// Numbers around the bound and the top of `u64`, and anything else.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(CLIENT_NUMBER_MAX),
        Just(CLIENT_NUMBER_MAX + 1),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        CLIENT_NUMBER_MAX..=u64::MAX,
        any::<u64>(),
        0..64u64,
    ]
}

fn revision() -> impl Strategy<Value = Revision> {
    prop_oneof![4 => Just(Revision::Current), 1 => number().prop_map(Revision::Value)]
}

fn config() -> impl Strategy<Value = GroupConfig> {
    let valid = (1u64..4, any::<bool>()).prop_map(|(scale, range)| GroupConfig {
        member_lease_ttl_ms: 12 * scale,
        assignment_lease_ms: 6 * scale,
        heartbeat_interval_ms: 2 * scale,
        rebalance_timeout_ms: 15 * scale,
        assignor: if range { rsc::core::model::AssignorKind::Range } else { Default::default() },
        ..tiny_config()
    });
    let invalid = prop_oneof![Just(0u64), Just(u64::MAX), number()]
        .prop_map(|ms| GroupConfig { assignment_lease_ms: ms, ..tiny_config() });
    prop_oneof![3 => valid, 1 => invalid]
}

fn op() -> impl Strategy<Value = Op> {
    let member = 0..MEMBERS;
    let field = prop_oneof![Just(Field::MemberEpoch), Just(Field::MetadataVersion), Just(Field::AssignmentEpoch)];
    let known = prop_oneof![(0..4u64).prop_map(Known::StoredPlus), number().prop_map(Known::Value)];
    let shards = prop_oneof![4 => 1..8u32, 1 => Just(0), 1 => Just(SHARD_COUNT_MAX + 1), 1 => Just(u32::MAX)];
    prop_oneof![
        3 => member.clone().prop_map(Op::Join),
        8 => member.clone().prop_map(Op::Steady),
        1 => member.clone().prop_map(Op::Leave),
        3 => (member, field, number()).prop_map(|(m, f, v)| Op::Absurd(m, f, v)),
        3 => known.prop_map(Op::Routing),
        1 => (shards, revision()).prop_map(|(n, r)| Op::AddShards(n, r)),
        1 => (config(), revision()).prop_map(|(c, r)| Op::SetConfig(c, r)),
        2 => Just(Op::Tick),
        1 => (1..4u64).prop_map(Op::SleepMs),
    ]
}

/// Everything a request could change.
type Touched = (Option<StoredRecord>, BTreeMap<String, u64>);

struct Run {
    store: MemoryStore,
    c: Coordinator<MemoryStore>,
    /// Each member's last successful answer (`None`: it must join).
    last: Vec<Option<HeartbeatResponse>>,
}

impl Run {
    async fn new() -> Self {
        let store = MemoryStore::new(31);
        let c = coordinator(&store, "c1", PlantedBugs::NONE);
        let req = AdminRequest::CreateGroup { group: group(), shard_count: 3, config: tiny_config() };
        c.admin(req).await.expect("create");
        Self { store, c, last: vec![None; MEMBERS] }
    }

    fn member_id(i: usize) -> String {
        format!("m{i}")
    }

    async fn touched(&self) -> Touched {
        (self.store.peek_record(&group()), self.store.liveness(&group()).await.expect("liveness"))
    }

    fn stored(&self) -> (u64, u64) {
        let record = self.store.peek_record(&group()).expect("the group is never deleted here");
        (recorded(&self.store).expect("decodes").metadata_version, record.revision)
    }

    /// Member i's next heartbeat: an echo of its last answer, or a join.
    fn heartbeat_of(&self, i: usize) -> HeartbeatRequest {
        match &self.last[i] {
            Some(r) => next(r),
            None => join(&Self::member_id(i)),
        }
    }

    /// Sends a well-formed heartbeat and applies the answer as a client would.
    async fn beat(&mut self, i: usize, req: HeartbeatRequest) -> Result<(), TestCaseError> {
        let what = format!("{req:?}");
        let result = self.c.heartbeat(req.clone()).await;
        no_server_error(&result, &what)?;
        match result {
            Ok(r) => {
                for (name, value) in [
                    ("memberEpoch", r.member_epoch),
                    ("metadataVersion", r.metadata_version),
                    ("assignmentEpoch", r.assignment_epoch),
                ] {
                    prop_assert!(value <= CLIENT_NUMBER_MAX, "{name} {value} handed out: cannot be echoed ({what})");
                }
                self.last[i] = (!req.leave).then_some(r);
            }
            Err(e) => {
                prop_assert_ne!(e.code, ErrorCode::BadRequest, "a well-formed heartbeat was refused: {}", what);
                if matches!(e.code, ErrorCode::UnknownMember | ErrorCode::FencedMemberEpoch) {
                    self.last[i] = None;
                }
            }
        }
        Ok(())
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Join(i) => self.beat(*i, join(&Self::member_id(*i))).await?,
            Op::Steady(i) => self.beat(*i, self.heartbeat_of(*i)).await?,
            Op::Leave(i) => {
                if let Some(r) = &self.last[*i] {
                    let req = HeartbeatRequest { leave: true, ..next(r) };
                    self.beat(*i, req).await?;
                }
            }
            Op::Absurd(i, field, value) => {
                let mut req = self.heartbeat_of(*i);
                match field {
                    Field::MemberEpoch => req.member_epoch = *value,
                    Field::MetadataVersion => req.metadata_version = *value,
                    Field::AssignmentEpoch => req.assignment_epoch = *value,
                }
                let before = self.touched().await;
                let result = self.c.heartbeat(req.clone()).await;
                let what = format!("{req:?}");
                no_server_error(&result, &what)?;
                if *value > CLIENT_NUMBER_MAX {
                    refused_untouched(result.map(|_| ()), before, self.touched().await, &what)?;
                } else if let Ok(r) = result {
                    // A number within the bound is an ordinary (if odd) request: keep its answer.
                    self.last[*i] = Some(r);
                }
            }
            Op::Routing(known) => {
                let known = match known {
                    Known::StoredPlus(ahead) => self.stored().0 + ahead,
                    Known::Value(v) => *v,
                };
                let before = self.touched().await;
                let result: Result<RoutingResponse, ApiError> =
                    self.c.routing(&group(), RoutingReport::version(known)).await;
                let what = format!("routing knownVersion={known}");
                no_server_error(&result, &what)?;
                if known > CLIENT_NUMBER_MAX {
                    refused_untouched(result.map(|_| ()), before, self.touched().await, &what)?;
                } else {
                    prop_assert!(result.is_ok(), "{what}: {result:?}");
                }
            }
            Op::AddShards(count, revision) => {
                let expected_revision = self.revision(*revision);
                let req = AdminRequest::AddShards { group: group(), expected_revision, new_shard_count: *count };
                self.admin(req, expected_revision).await?;
            }
            Op::SetConfig(config, revision) => {
                let expected_revision = self.revision(*revision);
                let req = AdminRequest::ChangeConfig { group: group(), expected_revision, config: config.clone() };
                self.admin(req, expected_revision).await?;
            }
            Op::Tick => self.c.tick_all().await,
            Op::SleepMs(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
        Ok(())
    }

    fn revision(&self, revision: Revision) -> u64 {
        match revision {
            Revision::Current => self.stored().1,
            Revision::Value(v) => v,
        }
    }

    async fn admin(&mut self, req: AdminRequest, expected_revision: u64) -> Result<(), TestCaseError> {
        let before = self.touched().await;
        let what = format!("{req:?}");
        let result = self.c.admin(req).await;
        no_server_error(&result, &what)?;
        if expected_revision > CLIENT_NUMBER_MAX {
            refused_untouched(result.map(|_| ()), before, self.touched().await, &what)?;
        }
        Ok(())
    }
}

/// No 5xx at all: the store is healthy and the coordinator is not terminating.
fn no_server_error<T: std::fmt::Debug>(result: &Result<T, ApiError>, what: &str) -> Result<(), TestCaseError> {
    if let Err(e) = result {
        prop_assert!(e.code.http_status() < 500, "{what} answered {} {e:?}", e.code.http_status());
    }
    Ok(())
}

fn refused_untouched(
    result: Result<(), ApiError>,
    before: Touched,
    after: Touched,
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(result.map_err(|e| e.code), Err(ErrorCode::BadRequest), "{}", what);
    prop_assert!(before == after, "{what} was refused but changed the record or the liveness hash");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_request_sequence_breaks_a_well_formed_join(ops in proptest::collection::vec(op(), 1..32)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let mut run = Run::new().await;
            for op in &ops {
                run.apply(op).await?;
            }
            let probe = run.c.heartbeat(join("probe")).await;
            prop_assert!(probe.is_ok(), "a well-formed join after the sequence: {probe:?}");
            let g = recorded(&run.store).expect("recorded");
            prop_assert!(g.metadata_version <= CLIENT_NUMBER_MAX && g.assignment_epoch <= CLIENT_NUMBER_MAX);
            Ok(())
        })?;
    }
}
