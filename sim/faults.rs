//! The fault injector: turns the drawn plan's faults and actions into timed steps on the
//! [`World`] (madsim kill/restart/pause, `NetSim` clogs and config, the Redis knobs, the
//! coordinator fleet, the operator).
//!
//! Owns: the schedule of steps, including the heal step of every fault, and the bookkeeping that
//! makes overlapping faults compose: clogs are reference-counted per node/direction and per link,
//! network latency and loss take the strongest active setting, and a kill of a dead node or a
//! pause of a paused one is a no-op. A split brain's old primary is a node of its own that the
//! injector starts, routes clients to, and kills at the switch. Never judges the run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use madsim::net::NetSim;
use rsc::client::clock::RATE_NOMINAL_PPM;
use rsc::core::model::SCHEMA_VERSION;
use rsc::service::codec::decode;
use rsc::store::memory::{HistoryKind, OutageMode, RollbackMode};

use crate::plan::fault::Loss;
use crate::plan::{Action, Fault, NodeRef, Role, Scheduled, Target};
use crate::programs::OperatorCommand;
use crate::records::{Mark, Us};
use crate::world::{SplitBrainRun, World};

/// One timed step.
#[derive(Clone, Debug)]
enum Step {
    Fault(Fault),
    Action(Action),
    Unclog(Clog),
    Restart(NodeRef),
    Resume(NodeRef),
    /// The end of a `clock-stop`: the machine wakes up.
    Wake(NodeRef),
    /// The end of one `clock-drift` (its id).
    EndDrift(NodeRef, u64),
    Kill(NodeRef),
    StartCoordinator,
    BeginShutdown(NodeRef),
    RemoveFromService(NodeRef),
    EndDelay(u64),
    EndLoss(u64),
    ResponseLoss(NodeRef, f64),
    StoreDelay(NodeRef, u64),
    StaleDelivery(NodeRef, f64, u64, bool),
    RedisOutageEnd,
    RedisLatencyEnd,
    RedisSupported(String),
    RedisWriteDropEnd,
    /// The end of the `n`-th split brain (index into `World::split_brains`).
    SplitBrainEnd(usize),
    RedisUp {
        writes_lost: u64,
    },
    Recreate {
        delete_first: bool,
    },
    /// The operator's monitoring: see [`RUNBOOK_REACTION_MS`].
    Runbook,
    /// The forger sends its `n`-th forged request.
    Forge(u64),
}

/// The operator's runbook for a group whose metadata is missing or unreadable (alerted by
/// `rsc_metadata_missing_total` / schema errors): once it has been so for this long, recreate the
/// group (deleting the unreadable key first). Longer than every scheduled repair in the shipped
/// plans, so it only acts on damage nobody scheduled a repair for (a failover that lost the
/// group's creation, overlapping random faults).
const RUNBOOK_REACTION_MS: u64 = 20_000;
const RUNBOOK_PERIOD_MS: u64 = 1_000;

/// What a clog blocks (reference-counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Clog {
    In(NodeRef),
    Out(NodeRef),
    Link(NodeRef, NodeRef),
}

/// The schedule and the state of active faults.
pub struct Injector {
    queue: BTreeMap<(Us, u64), Step>,
    seq: u64,
    clogs: BTreeMap<Clog, u32>,
    delays: BTreeMap<u64, (u64, u64)>,
    losses: BTreeMap<u64, f64>,
    /// Active `clock-drift` faults per node, by id: the newest one sets the node's rate.
    drifts: BTreeMap<NodeRef, BTreeMap<u64, u64>>,
    base_latency_ms: (u64, u64),
    /// Since when the group's metadata has been missing or unreadable (and whether unreadable).
    unhealthy_since: Option<(Us, bool)>,
    /// Forged requests scheduled so far (numbers them: the forger varies its attack by number).
    forged: u64,
}

impl Injector {
    pub fn new(faults: &[Scheduled<Fault>], actions: &[Scheduled<Action>], base_latency_ms: (u64, u64)) -> Self {
        let mut injector = Injector {
            queue: BTreeMap::new(),
            seq: 0,
            clogs: BTreeMap::new(),
            delays: BTreeMap::new(),
            losses: BTreeMap::new(),
            drifts: BTreeMap::new(),
            base_latency_ms,
            unhealthy_since: None,
            forged: 0,
        };
        injector.at(RUNBOOK_PERIOD_MS * 1_000, Step::Runbook);
        for f in faults {
            injector.at(f.at_ms * 1_000, Step::Fault(f.item.clone()));
        }
        for a in actions {
            injector.at(a.at_ms * 1_000, Step::Action(a.item.clone()));
        }
        injector
    }

    fn at(&mut self, at_us: Us, step: Step) {
        self.seq += 1;
        self.queue.insert((at_us, self.seq), step);
    }

    /// When the next step is due.
    pub fn next_due_us(&self) -> Option<Us> {
        self.queue.keys().next().map(|(at, _)| *at)
    }

    /// Applies every step due at or before `now_us`.
    pub fn apply_due(&mut self, world: &mut World, now_us: Us) {
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > now_us {
                break;
            }
            let step = entry.remove();
            self.apply(world, now_us, step);
        }
    }

    fn nodes(world: &World, target: Target) -> Vec<NodeRef> {
        match target {
            Target::Node(node) => vec![node],
            Target::All(role) => world.alive(role),
        }
    }

    fn clog(&mut self, world: &World, clog: Clog) {
        let count = self.clogs.entry(clog).or_insert(0);
        *count += 1;
        if *count == 1 {
            set_clog(&world.net, world, clog, true);
        }
    }

    fn unclog(&mut self, world: &World, clog: Clog) {
        if let Some(count) = self.clogs.get_mut(&clog) {
            *count -= 1;
            if *count == 0 {
                self.clogs.remove(&clog);
                set_clog(&world.net, world, clog, false);
            }
        }
    }

    /// Sets the network config to the strongest active delay and loss.
    fn update_net(&self, world: &World) {
        let (mut lo, mut hi) = self.base_latency_ms;
        for (min, max) in self.delays.values() {
            lo = lo.max(*min);
            hi = hi.max(*max);
        }
        let loss = self.losses.values().copied().fold(0.0, f64::max);
        world.net.update_config(|c| {
            c.send_latency = Duration::from_millis(lo)..Duration::from_millis(hi.max(lo + 1));
            c.packet_loss_rate = loss;
        });
    }

    fn apply(&mut self, world: &mut World, now: Us, step: Step) {
        match step {
            Step::Fault(fault) => {
                world.env.recorder.trace("faults", format!("{fault}"));
                self.start_fault(world, now, fault);
            }
            Step::Action(action) => {
                world.env.recorder.trace("faults", format!("action {action}"));
                match action {
                    Action::ConsumerJoin => {
                        world.spawn(Role::Consumer);
                    }
                    Action::ProducerJoin => {
                        world.spawn(Role::Producer);
                    }
                    Action::ConsumerLeave { target } => {
                        for node in Self::nodes(world, target) {
                            world.leave(node);
                        }
                    }
                    Action::AddShards { add } => world.command(OperatorCommand::AddShards(add)),
                    Action::Recreate => world.command(OperatorCommand::Recreate),
                }
            }
            Step::Unclog(clog) => self.unclog(world, clog),
            Step::Restart(node) => world.restart(node),
            Step::Resume(node) => world.resume(node),
            Step::Wake(node) => world.wake(node),
            Step::EndDrift(node, id) => {
                if let Some(active) = self.drifts.get_mut(&node) {
                    active.remove(&id);
                }
                self.set_rate(world, now, node);
            }
            Step::Kill(node) => world.kill(node),
            Step::StartCoordinator => {
                let node = world.spawn(Role::Coordinator);
                world.env.recorder.trace("faults", format!("new coordinator instance {node}"));
            }
            Step::BeginShutdown(node) => world.begin_shutdown(node),
            Step::RemoveFromService(node) => world.remove_from_service(node),
            Step::EndDelay(id) => {
                self.delays.remove(&id);
                self.update_net(world);
            }
            Step::EndLoss(id) => {
                self.losses.remove(&id);
                self.update_net(world);
            }
            Step::ResponseLoss(node, p) => {
                if let Some(knob) = world.loss.get(&node) {
                    knob.set_loss(p);
                }
            }
            Step::StoreDelay(node, delay_max_ms) => {
                if let Some(knob) = world.loss.get(&node) {
                    knob.set_store_delay(delay_max_ms);
                }
            }
            Step::StaleDelivery(node, p, delay_max_ms, joins) => {
                if let Some(knob) = world.loss.get(&node) {
                    knob.set_stale(p, delay_max_ms, joins);
                }
            }
            Step::RedisOutageEnd => world.store.set_outage(None),
            Step::RedisLatencyEnd => {
                world.store.set_latency_ms(0);
                world.store.set_latency_jitter_ms(0);
            }
            Step::RedisSupported(command) => world.store.set_supported(&command),
            Step::Forge(n) => world.command(OperatorCommand::Forge(n)),
            Step::RedisWriteDropEnd => world.store.set_write_drop_probability(0.0),
            Step::SplitBrainEnd(n) => end_split_brain(world, now, n),
            Step::RedisUp { writes_lost } => {
                let lost = rollback_metadata_writes(world, writes_lost);
                world.store.restart();
                world.restart(NodeRef::REDIS);
                world.env.recorder.trace("faults", format!("redis back, {lost} metadata writes lost"));
            }
            Step::Runbook => {
                self.runbook(world, now);
                self.at(now + RUNBOOK_PERIOD_MS * 1_000, Step::Runbook);
            }
            Step::Recreate { delete_first } => {
                if delete_first && world.store.delete_metadata_key(&world.env.group) {
                    world.env.recorder.lock().marks.push(Mark::KeyDeleted { at_us: now });
                }
                world.command(OperatorCommand::CreateGroup);
            }
        }
    }

    /// One look of the operator at the group's metadata (ground truth, not through a coordinator).
    fn runbook(&mut self, world: &mut World, now: Us) {
        let group = &world.env.group;
        let unreadable = match world.store.peek_record(group) {
            None => Some(false),
            Some(record) => decode(group, &record).is_err().then_some(true),
        };
        let Some(incompatible) = unreadable else {
            self.unhealthy_since = None;
            return;
        };
        let (since, _) = *self.unhealthy_since.get_or_insert((now, incompatible));
        if now >= since + RUNBOOK_REACTION_MS * 1_000 {
            let what = if incompatible { "unreadable" } else { "missing" };
            world.env.recorder.trace("operator", format!("runbook: metadata {what} for 20 s, recreating the group"));
            self.unhealthy_since = None;
            self.apply(world, now, Step::Recreate { delete_first: incompatible });
        }
    }

    fn start_fault(&mut self, world: &mut World, now: Us, fault: Fault) {
        let later = |ms: u64| now + ms * 1_000;
        match fault {
            Fault::Delay { latency_min_ms, latency_max_ms, duration_ms } => {
                self.seq += 1;
                self.delays.insert(self.seq, (latency_min_ms, latency_max_ms));
                self.update_net(world);
                let id = self.seq;
                self.at(later(duration_ms), Step::EndDelay(id));
            }
            Fault::PacketLoss { rate, duration_ms } => {
                self.seq += 1;
                self.losses.insert(self.seq, rate);
                self.update_net(world);
                let id = self.seq;
                self.at(later(duration_ms), Step::EndLoss(id));
            }
            Fault::Partition { target, duration_ms } => {
                for node in Self::nodes(world, target) {
                    for clog in [Clog::In(node), Clog::Out(node)] {
                        self.clog(world, clog);
                        self.at(later(duration_ms), Step::Unclog(clog));
                    }
                }
            }
            Fault::PartitionLink { a, b, duration_ms } => {
                for clog in [Clog::Link(a, b), Clog::Link(b, a)] {
                    self.clog(world, clog);
                    self.at(later(duration_ms), Step::Unclog(clog));
                }
            }
            Fault::ClogIn { target, duration_ms } | Fault::ClogOut { target, duration_ms } => {
                let inbound = matches!(fault, Fault::ClogIn { .. });
                for node in Self::nodes(world, target) {
                    let clog = if inbound { Clog::In(node) } else { Clog::Out(node) };
                    self.clog(world, clog);
                    self.at(later(duration_ms), Step::Unclog(clog));
                }
            }
            Fault::ClogLink { from, to, duration_ms } => {
                self.clog(world, Clog::Link(from, to));
                self.at(later(duration_ms), Step::Unclog(Clog::Link(from, to)));
            }
            Fault::Kill { target } => {
                for node in Self::nodes(world, target) {
                    world.kill(node);
                }
            }
            Fault::Restart { target, down_ms } => {
                for node in Self::nodes(world, target) {
                    world.kill(node);
                    self.at(later(down_ms), Step::Restart(node));
                }
            }
            Fault::Pause { target, duration_ms } => {
                for node in Self::nodes(world, target) {
                    world.pause(node);
                    self.at(later(duration_ms), Step::Resume(node));
                }
            }
            Fault::ClockStop { target, duration_ms } => {
                for node in Self::nodes(world, target) {
                    if world.suspend(node) {
                        self.at(later(duration_ms), Step::Wake(node));
                    }
                }
            }
            Fault::ClockDrift { target, drift_percent, duration_ms } => {
                // ±1% is ±10,000 ppm: rounding to whole ppm is far below any lease's margin.
                let rate_ppm = (RATE_NOMINAL_PPM as f64 * (1.0 + drift_percent / 100.0)).round() as u64;
                for node in Self::nodes(world, target) {
                    self.seq += 1;
                    self.drifts.entry(node).or_default().insert(self.seq, rate_ppm);
                    self.set_rate(world, now, node);
                    self.at(later(duration_ms), Step::EndDrift(node, self.seq));
                }
            }
            Fault::ResponseLoss { target, probability, duration_ms } => {
                for node in Self::nodes(world, target) {
                    self.at(now, Step::ResponseLoss(node, probability));
                    self.at(later(duration_ms), Step::ResponseLoss(node, 0.0));
                }
            }
            Fault::StoreDelay { target, delay_max_ms, duration_ms } => {
                for node in Self::nodes(world, target) {
                    self.at(now, Step::StoreDelay(node, delay_max_ms));
                    self.at(later(duration_ms), Step::StoreDelay(node, 0));
                }
            }
            Fault::StaleDelivery { target, probability, delay_max_ms, joins, duration_ms } => {
                for node in Self::nodes(world, target) {
                    self.at(now, Step::StaleDelivery(node, probability, delay_max_ms, joins));
                    self.at(later(duration_ms), Step::StaleDelivery(node, 0.0, delay_max_ms, joins));
                }
            }
            Fault::RollingUpdate { overlap_ms, propagation_ms, drain_ms } => {
                let old = world.alive(Role::Coordinator).into_iter().find(|n| {
                    let registry = world.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    registry.iter().any(|(p, c)| p.node == *n && !c.is_terminating())
                });
                self.at(now, Step::StartCoordinator);
                if let Some(old) = old {
                    self.at(later(overlap_ms), Step::BeginShutdown(old));
                    self.at(later(overlap_ms + propagation_ms), Step::RemoveFromService(old));
                    self.at(later(overlap_ms + drain_ms), Step::Kill(old));
                }
            }
            Fault::CoordinatorLoss { down_ms } => {
                for node in world.alive(Role::Coordinator) {
                    world.kill(node);
                }
                self.at(later(down_ms), Step::StartCoordinator);
            }
            Fault::RedisOutage { duration_ms, timeout_ms } => {
                let mode =
                    if timeout_ms == 0 { OutageMode::Errors } else { OutageMode::Timeouts { after_ms: timeout_ms } };
                world.store.set_outage(Some(mode));
                self.at(later(duration_ms), Step::RedisOutageEnd);
            }
            Fault::RedisLatency { latency_min_ms, latency_max_ms, duration_ms } => {
                world.store.set_latency_ms(latency_min_ms);
                world.store.set_latency_jitter_ms(latency_max_ms - latency_min_ms);
                self.at(later(duration_ms), Step::RedisLatencyEnd);
            }
            Fault::RedisFailover { loss } => {
                let lost = rollback(world, loss);
                world.store.failover();
                world.env.recorder.trace("faults", format!("failover lost {lost} metadata writes"));
            }
            Fault::RedisSplitBrain { loss, old_primary_ms, share, pick } => {
                let n = start_split_brain(world, now, loss, share, pick);
                self.at(later(old_primary_ms), Step::SplitBrainEnd(n));
            }
            Fault::RedisSilentRollback { loss } => {
                let lost = rollback(world, loss);
                world.env.recorder.lock().marks.push(Mark::SilentRollback { at_us: now });
                world.env.recorder.trace("faults", format!("silent rollback lost {lost} metadata writes"));
            }
            Fault::RedisDeleteKey { recreate_after_ms } => {
                if world.store.delete_metadata_key(&world.env.group) {
                    world.env.recorder.lock().marks.push(Mark::KeyDeleted { at_us: now });
                }
                self.at(later(recreate_after_ms), Step::Recreate { delete_first: false });
            }
            Fault::RedisCorrupt { repair_after_ms } => {
                world.store.corrupt_aggregate(&world.env.group);
                self.at(later(repair_after_ms), Step::Recreate { delete_first: true });
            }
            Fault::RedisFutureSchema { repair_after_ms } => {
                world.store.set_future_schema(&world.env.group, SCHEMA_VERSION + 1);
                self.at(later(repair_after_ms), Step::Recreate { delete_first: true });
            }
            Fault::RedisUnsupported { command, duration_ms } => {
                world.store.set_unsupported(&command);
                self.at(later(duration_ms), Step::RedisSupported(command));
            }
            Fault::RedisWriteDrop { probability, duration_ms } => {
                world.store.set_write_drop_probability(probability);
                let to_us = later(duration_ms);
                world.env.recorder.lock().marks.push(Mark::WriteDrop { from_us: now, to_us });
                self.at(later(duration_ms), Step::RedisWriteDropEnd);
            }
            Fault::RedisRestart { down_ms, writes_lost } => {
                world.kill(NodeRef::REDIS);
                self.at(later(down_ms), Step::RedisUp { writes_lost });
            }
            Fault::ForgedRequests { interval_ms, duration_ms } => {
                for k in 0..duration_ms / interval_ms.max(1) {
                    self.forged += 1;
                    self.at(later(k * interval_ms), Step::Forge(self.forged));
                }
            }
        }
    }
}

impl Injector {
    /// Sets `node`'s clock rate to its newest active drift (nominal when none) and records the
    /// change for the lease checkers.
    fn set_rate(&self, world: &World, now: Us, node: NodeRef) {
        let rate_ppm = self
            .drifts
            .get(&node)
            .and_then(|active| active.last_key_value())
            .map_or(RATE_NOMINAL_PPM, |(_, rate)| *rate);
        if let Some(clock) = world.clocks.get(&node) {
            clock.set_rate_ppm(rate_ppm);
            world.env.recorder.lock().marks.push(Mark::ClockRate { node, at_us: now, rate_ppm });
            world.env.recorder.trace("faults", format!("{node}: clock rate {rate_ppm} ppm"));
        }
    }
}

fn set_clog(net: &NetSim, world: &World, clog: Clog, on: bool) {
    let id = |n: NodeRef| world.node_id(n);
    match clog {
        Clog::In(n) => {
            if let Some(n) = id(n) {
                if on {
                    net.clog_node_in(n)
                } else {
                    net.unclog_node_in(n)
                }
            }
        }
        Clog::Out(n) => {
            if let Some(n) = id(n) {
                if on {
                    net.clog_node_out(n)
                } else {
                    net.unclog_node_out(n)
                }
            }
        }
        Clog::Link(a, b) => {
            if let (Some(a), Some(b)) = (id(a), id(b)) {
                if on {
                    net.clog_link(a, b)
                } else {
                    net.unclog_link(a, b)
                }
            }
        }
    }
}

/// Forks the primary into an old primary (before the failover: it has every write the new
/// primary loses), fails the primary over with `loss`, and routes a drawn subset of the processes
/// alive now to the old primary. Returns the split brain's index in `World::split_brains`.
fn start_split_brain(world: &mut World, now: Us, loss: Loss, share: f64, pick: u64) -> usize {
    let n = world.split_brains.len();
    let server = NodeRef::old_primary(u32::try_from(n + 1).unwrap_or(u32::MAX));
    let fork_len = world.store.history().len();
    let old = world.store.fork(pick);
    let lost = rollback(world, loss);
    world.store.failover();
    let mut rng = SmallRng::seed_from_u64(pick);
    let alive: Vec<NodeRef> =
        [Role::Coordinator, Role::Consumer, Role::Producer].into_iter().flat_map(|role| world.alive(role)).collect();
    let mut clients: BTreeSet<NodeRef> = alive.iter().copied().filter(|_| rng.gen_bool(share)).collect();
    if clients.is_empty() && !alive.is_empty() {
        clients.insert(alive[rng.gen_range(0..alive.len())]);
    }
    let addr = world.start_old_primary(server, old.clone());
    for node in &clients {
        world.env.redis.to_old_primary(*node, addr);
    }
    let names: Vec<String> = clients.iter().map(ToString::to_string).collect();
    world.env.recorder.trace(
        "faults",
        format!("split brain: failover lost {lost} metadata writes; {server} keeps serving {}", names.join(", ")),
    );
    world.split_brains.push(SplitBrainRun { server, store: old, fork_us: now, switch_us: None, clients, fork_len });
    n
}

/// Ends the `n`-th split brain: the old primary goes (its writes are discarded with it; requests
/// in flight to it are lost) and its clients are routed to the primary, where their connections
/// from before the failover break once.
fn end_split_brain(world: &mut World, now: Us, n: usize) {
    let Some(split) = world.split_brains.get_mut(n) else { return };
    split.switch_us = Some(now);
    let (server, clients) = (split.server, split.clients.clone());
    world.kill(server);
    for node in &clients {
        world.env.redis.to_primary(*node);
    }
    world.env.recorder.trace("faults", format!("split brain over: {server} gone, its clients use the primary"));
}

/// Undoes the metadata writes `loss` names (see [`rollback_metadata_writes`], [`rollback_since`]).
fn rollback(world: &World, loss: Loss) -> u64 {
    match loss {
        Loss::LastWrites(writes) => rollback_metadata_writes(world, writes),
        Loss::WrittenSince { since_ms } => rollback_since(world, since_ms),
    }
}

/// Undoes journaled store writes, newest first, until the group's stored metadata was written at
/// or before `since_ms` (or is absent). Returns how many metadata writes were undone.
fn rollback_since(world: &World, since_ms: u64) -> u64 {
    let group = &world.env.group;
    let mut undone = 0;
    for _ in 0..rsc::store::memory::JOURNAL_LEN_MAX {
        let Some(current) = world.store.peek_record(group) else { break };
        // When the current state was written (rollbacks that restored it do not count).
        let history = world.store.history();
        let stored_at_ms =
            history.iter().rev().filter(|e| matches!(e.kind, HistoryKind::Written { .. })).find_map(|e| {
                e.metadata_after.iter().find(|(g, r)| g == group && r.as_ref() == Some(&current)).map(|_| e.at_ms)
            });
        if stored_at_ms.is_none_or(|at| at <= since_ms) {
            break;
        }
        if world.store.rollback(1, RollbackMode::Silent) == 0 {
            break;
        }
        if world.store.peek_record(group).as_ref() != Some(&current) {
            undone += 1;
        }
    }
    undone
}

/// Undoes journaled store writes, newest first, until `writes` of them changed the group's
/// metadata key (liveness touches and mutex operations in between are undone too, as a replica
/// that lags loses everything after some point). Returns how many metadata writes were undone.
fn rollback_metadata_writes(world: &World, writes: u64) -> u64 {
    let group = &world.env.group;
    let mut undone = 0;
    for _ in 0..rsc::store::memory::JOURNAL_LEN_MAX {
        if undone >= writes {
            break;
        }
        let before = world.store.peek_record(group);
        if world.store.rollback(1, RollbackMode::Silent) == 0 {
            break;
        }
        if world.store.peek_record(group) != before {
            undone += 1;
        }
    }
    undone
}
