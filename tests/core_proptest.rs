//! Property tests of the pure core: random sequences of joins, heartbeats (sent, delivered late,
//! lost), REVOKED acks, crashes, leaves, ticks, time, store rollbacks and resharding, checked
//! against `validate()` (after every write, inside the world) and an ownership ledger built from
//! the clients' own reading sets and leases: at no instant may two clients read the same shard.
//!
//! `PROPTEST_CASES` raises the case count (CI runs 1,000 per property).

mod core_support;

use std::collections::BTreeMap;

use core_support::{group_id, Client, World};
use proptest::prelude::*;
use rsc::core::protocol::{AdminRequest, HeartbeatRequest};

#[derive(Clone, Debug)]
enum Action {
    /// Client i builds a heartbeat now (kept in flight).
    Send(usize),
    /// Its in-flight heartbeat is processed now; the response arrives.
    Deliver(usize),
    /// Processed now, response lost.
    LoseResponse(usize),
    /// The request is lost before reaching the coordinator.
    DropRequest(usize),
    /// The client process restarts: stops reading at once, rejoins as a new incarnation.
    Crash(usize),
    /// Clean leave: stop reading, report everything REVOKED, leave.
    Leave(usize),
    Tick,
    Advance(u64),
    /// The store loses its last k writes; `failover`: with an identity change the coordinator sees.
    Rollback(usize, bool),
    AddShards(u32),
}

fn action(clients: usize) -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (0..clients).prop_map(Action::Send),
        8 => (0..clients).prop_map(Action::Deliver),
        1 => (0..clients).prop_map(Action::LoseResponse),
        1 => (0..clients).prop_map(Action::DropRequest),
        1 => (0..clients).prop_map(Action::Crash),
        1 => (0..clients).prop_map(Action::Leave),
        4 => Just(Action::Tick),
        6 => (1u64..3_000).prop_map(Action::Advance),
        1 => (1usize..4, any::<bool>()).prop_map(|(k, f)| Action::Rollback(k, f)),
        1 => (1u32..3).prop_map(Action::AddShards),
    ]
}

struct Sim {
    world: World,
    clients: Vec<Client>,
    in_flight: Vec<Option<(u64, HeartbeatRequest)>>,
    /// Longest window (ms) in which two clients could read one shard (silent rollbacks only).
    split_ms_max: u64,
    split_since: BTreeMap<u32, u64>,
}

impl Sim {
    fn new(clients: usize, shards: u32) -> Self {
        Self {
            world: World::new(shards),
            clients: (0..clients).map(|i| Client::new(&format!("c{i}"))).collect(),
            in_flight: vec![None; clients],
            split_ms_max: 0,
            split_since: BTreeMap::new(),
        }
    }

    fn step(&mut self, action: &Action) {
        let now = self.world.now_ms;
        match *action {
            Action::Send(i) => {
                if self.in_flight[i].is_none() {
                    self.in_flight[i] = Some((now, self.clients[i].request()));
                }
            }
            Action::Deliver(i) => {
                if let Some((sent, req)) = self.in_flight[i].take() {
                    let result = self.world.heartbeat(&req);
                    self.clients[i].apply(self.world.now_ms, sent, &result);
                }
            }
            Action::LoseResponse(i) => {
                if let Some((_, req)) = self.in_flight[i].take() {
                    let _ = self.world.heartbeat(&req);
                }
            }
            Action::DropRequest(i) => self.in_flight[i] = None,
            Action::Crash(i) => {
                let id = self.clients[i].id.clone();
                self.clients[i] = Client::new(&id);
                self.in_flight[i] = None;
            }
            Action::Leave(i) => {
                let client = &mut self.clients[i];
                if client.epoch > 0 {
                    client.revoking.extend(std::mem::take(&mut client.reading));
                    let req = client.leave_request();
                    let _ = self.world.heartbeat(&req);
                    let id = client.id.clone();
                    *client = Client::new(&id);
                    self.in_flight[i] = None;
                }
            }
            Action::Tick => self.world.tick(),
            Action::Advance(ms) => self.world.advance(ms),
            Action::Rollback(k, failover) => self.world.rollback(k, failover),
            Action::AddShards(n) => {
                let req = AdminRequest::AddShards {
                    group: group_id(),
                    expected_revision: self.world.revision,
                    new_shard_count: self.world.g.shard_count + n,
                };
                let _ = self.world.admin(&req);
            }
        }
    }

    /// Returns the shards two clients could read at this instant.
    fn overlaps(&self) -> Vec<(u32, Vec<String>)> {
        let now = self.world.now_ms;
        let mut readers: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for c in &self.clients {
            for shard in c.reads_at(now) {
                readers.entry(shard).or_default().push(c.id.clone());
            }
        }
        readers.into_iter().filter(|(_, r)| r.len() > 1).collect()
    }

    fn track_split_windows(&mut self) {
        let now = self.world.now_ms;
        let split: Vec<u32> = self.overlaps().into_iter().map(|(s, _)| s).collect();
        self.split_since.retain(|s, _| split.contains(s));
        for s in split {
            let since = *self.split_since.entry(s).or_insert(now);
            self.split_ms_max = self.split_ms_max.max(now - since);
        }
    }
}

fn no_silent_rollbacks(actions: Vec<Action>) -> Vec<Action> {
    actions
        .into_iter()
        .map(|a| match a {
            Action::Rollback(k, _) => Action::Rollback(k, true),
            other => other,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// No split ownership and valid recorded state under every fault the coordinator can detect
    /// (lost responses, late requests, crashes, expiry, failover rollbacks, resharding).
    #[test]
    fn no_two_clients_ever_read_one_shard(
        clients in 2usize..5,
        shards in 1u32..9,
        actions in prop::collection::vec(action(4), 1..250),
    ) {
        let mut sim = Sim::new(clients, shards);
        for action in no_silent_rollbacks(actions) {
            let action = clamp(action, clients);
            sim.step(&action);
            let overlaps = sim.overlaps();
            prop_assert!(overlaps.is_empty(), "split ownership after {action:?} at {} ms: {overlaps:?}\n{:#?}",
                sim.world.now_ms, sim.world.g);
        }
    }

    /// Silent rollbacks cannot be made safe by any protocol; the damage is bounded: a split never
    /// lasts longer than one assignment lease.
    #[test]
    fn silent_rollback_split_window_stays_within_one_lease(
        clients in 2usize..5,
        shards in 1u32..9,
        actions in prop::collection::vec(action(4), 1..250),
    ) {
        let mut sim = Sim::new(clients, shards);
        for action in actions {
            sim.step(&clamp(action, clients));
            sim.track_split_windows();
        }
        prop_assert!(sim.split_ms_max <= sim.world.g.config.assignment_lease_ms,
            "split lasted {} ms", sim.split_ms_max);
    }
}

fn clamp(action: Action, clients: usize) -> Action {
    match action {
        Action::Send(i) => Action::Send(i % clients),
        Action::Deliver(i) => Action::Deliver(i % clients),
        Action::LoseResponse(i) => Action::LoseResponse(i % clients),
        Action::DropRequest(i) => Action::DropRequest(i % clients),
        Action::Crash(i) => Action::Crash(i % clients),
        Action::Leave(i) => Action::Leave(i % clients),
        other => other,
    }
}

/// The ledger can fail: with the planted "assign before release" bug it must find a split.
#[test]
fn the_ledger_catches_a_planted_assign_before_release() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let strategy = (2usize..5, 1u32..9, prop::collection::vec(action(4), 1..250));
    let mut runner = TestRunner::deterministic();
    let mut caught_after = None;
    for case in 1..=200 {
        let (clients, shards, actions) = strategy.new_tree(&mut runner).expect("strategy").current();
        let mut sim = Sim::new(clients, shards);
        sim.world.planted = rsc::core::PlantedBugs::only(rsc::core::PlantedBug::AssignBeforeRelease);
        let split = no_silent_rollbacks(actions).into_iter().any(|a| {
            sim.step(&clamp(a, clients));
            !sim.overlaps().is_empty()
        });
        if split {
            caught_after = Some(case);
            break;
        }
    }
    let caught_after = caught_after.expect("a planted bug must be caught within 200 random cases");
    println!("planted assign-before-release caught after {caught_after} cases");
}
