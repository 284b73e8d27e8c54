//! The fault model of `DESIGN.md` as plan entries: network, process, coordinator fleet and Redis
//! faults, and the operator / workload actions a scenario schedules.
//!
//! Owns: the list of fault kinds, their parameters, defaults and how long each lasts (so the plan
//! can prove every fault heals before `heal_ms`). Never applies a fault: the runner does.

use std::fmt;

use rand::rngs::SmallRng;
use rand::Rng;
use rsc::core::model::CLOCK_RATE_MARGIN_PERCENT;
use serde::{Deserialize, Serialize};

use super::node::{resolve_target, InitialCounts, NodeRef, Role, Target};
use super::param::{Param, Params};
use super::PlanError;

/// One fault with every parameter drawn. Serialized (in capsules) as a table tagged by its plan
/// kind name: `kind = "partition"`, `target = "consumer-2"`, `duration_ms = 3000`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Fault {
    /// Every packet's one-way latency is drawn from `[min, max]` ms (madsim `update_config`).
    Delay { latency_min_ms: u64, latency_max_ms: u64, duration_ms: u64 },
    /// Each packet is dropped with `rate` (datagrams are lost; TCP segments are retried, so it
    /// shows as delay on HTTP and as loss on the Redis protocol).
    PacketLoss { rate: f64, duration_ms: u64 },
    /// The target is cut from every other node, both directions (`clog_node`).
    Partition { target: Target, duration_ms: u64 },
    /// Both directions between two nodes.
    PartitionLink { a: NodeRef, b: NodeRef, duration_ms: u64 },
    /// Nothing reaches the target (`clog_node_in`).
    ClogIn { target: Target, duration_ms: u64 },
    /// Nothing leaves the target (`clog_node_out`).
    ClogOut { target: Target, duration_ms: u64 },
    /// One direction of one link (`clog_link(from, to)`): requests arrive, responses are lost.
    ClogLink { from: NodeRef, to: NodeRef, duration_ms: u64 },
    /// The process dies and stays dead (consumers and producers only).
    Kill { target: Target },
    /// The process dies and comes back after `down_ms` (a new incarnation).
    Restart { target: Target, down_ms: u64 },
    /// The process stops being scheduled for `duration_ms` (a GC pause / SIGSTOP); its clocks run on.
    Pause { target: Target, duration_ms: u64 },
    /// The machine is suspended for `duration_ms` (VM or laptop suspend): the process is paused
    /// *and* its monotonic clock (CLOCK_MONOTONIC, tokio's timers) stops, while its suspend-aware
    /// clock (CLOCK_BOOTTIME) runs on. Consumers and producers only (the clients' clock layer).
    ClockStop { target: Target, duration_ms: u64 },
    /// The process's clocks run `drift_percent` faster (or slower, negative) than true time for
    /// `duration_ms`. At most `CLOCK_RATE_MARGIN_PERCENT / 2` each way: beyond that the group's
    /// lease margins no longer hold, so such a plan is refused. Consumers and producers only.
    ClockDrift { target: Target, drift_percent: f64, duration_ms: u64 },
    /// The client's transport drops each coordinator response with `probability` after the
    /// coordinator produced it (the request was processed; the client sees a timeout).
    ResponseLoss { target: Target, probability: f64, duration_ms: u64 },
    /// A consumer's requests to Redis leave up to `delay_max_ms` after it issued them (a congested
    /// path); its store timeout runs from the call, so a request can time out at the client, which
    /// moves on (a drain completes, the shard moves), and still execute at Redis later.
    StoreDelay { target: Target, delay_max_ms: u64, duration_ms: u64 },
    /// The client's heartbeats reach a coordinator late with `probability`: duplicated (delivered
    /// again up to `delay_max_ms` later) or deferred (delivered only then; the client times out),
    /// as behind a retrying L7 proxy or load balancer.
    /// `joins = false` spares joins (epoch 0); a late duplicate join is a repeat of the join that
    /// created the incarnation (same session, never saw it): answered from it, nothing recorded.
    StaleDelivery { target: Target, probability: f64, delay_max_ms: u64, joins: bool, duration_ms: u64 },
    /// 1 -> 2 -> 1: a new coordinator starts; after `overlap_ms` the oldest one enters terminating
    /// mode; after `propagation_ms` it leaves the Service; after `drain_ms` it is killed.
    RollingUpdate { overlap_ms: u64, propagation_ms: u64, drain_ms: u64 },
    /// 1 -> 0 -> 1: every coordinator dies; a new one starts after `down_ms`.
    CoordinatorLoss { down_ms: u64 },
    /// Every Redis command fails (`timeout_ms == 0`: refused at once; else after that long).
    RedisOutage { duration_ms: u64, timeout_ms: u64 },
    /// Every Redis command takes `[min, max]` ms more.
    RedisLatency { latency_min_ms: u64, latency_max_ms: u64, duration_ms: u64 },
    /// Failover: recent metadata writes are lost and the server identity changes.
    RedisFailover { loss: Loss },
    /// Recent metadata writes are lost without an identity change (undetectable by the server;
    /// its damage is measured, not prevented).
    RedisSilentRollback { loss: Loss },
    /// Split brain: a failover as `RedisFailover { loss }`, but the old primary lives on for
    /// `old_primary_ms` (cut off from the new one, still accepting writes) with the identity its
    /// clients knew, serving each coordinator, consumer and producer alive at the failover with
    /// probability `share` (at least one; drawn from `pick`); everyone else moves to the new
    /// primary at once. Then it goes, its writes are discarded and its clients move too.
    RedisSplitBrain {
        loss: Loss,
        old_primary_ms: u64,
        share: f64,
        /// Any u64: written as a string, TOML integers stop at `i64::MAX`.
        #[serde(with = "u64_string")]
        pick: u64,
    },
    /// The metadata key is deleted; the operator recreates the group after `recreate_after_ms`.
    RedisDeleteKey { recreate_after_ms: u64 },
    /// The aggregate becomes unparsable; the operator deletes and recreates after `repair_after_ms`.
    RedisCorrupt { repair_after_ms: u64 },
    /// `schemaVersion` is set beyond this build's; the operator repairs after `repair_after_ms`.
    RedisFutureSchema { repair_after_ms: u64 },
    /// The server rejects `command` (e.g. `EVALSHA`, `XAUTOCLAIM`) for `duration_ms`.
    RedisUnsupported { command: String, duration_ms: u64 },
    /// Metadata writes are acknowledged but dropped with `probability` for `duration_ms`.
    RedisWriteDrop { probability: f64, duration_ms: u64 },
    /// The Redis process restarts (identity change, connections reset) after `down_ms` down.
    RedisRestart { down_ms: u64, writes_lost: u64 },
    /// A malicious client with a valid client token forges a request every `interval_ms` for
    /// `duration_ms`: leaves (every shard reported REVOKED, revoke ids included), steady
    /// heartbeats and joins naming a live consumer's member id and epoch (it knows everything
    /// but the victim's session secret), and loss evidence without a token.
    ForgedRequests { interval_ms: u64, duration_ms: u64 },
}

/// Every fault kind name, as written in plans.
pub const FAULT_KINDS: &[&str] = &[
    "delay",
    "packet-loss",
    "partition",
    "partition-link",
    "clog-in",
    "clog-out",
    "clog-link",
    "kill",
    "restart",
    "pause",
    "response-loss",
    "store-delay",
    "rolling-update",
    "coordinator-loss",
    "redis-outage",
    "redis-latency",
    "redis-failover",
    "redis-silent-rollback",
    "redis-split-brain",
    "redis-delete-key",
    "redis-corrupt",
    "redis-future-schema",
    "redis-unsupported",
    "redis-write-drop",
    "redis-restart",
    "stale-delivery",
    "forged-requests",
    "clock-stop",
    "clock-drift",
];

/// The default target of a kind when a random fault (or a plan entry without `target`) needs one.
pub fn default_target(kind: &str) -> Option<&'static str> {
    match kind {
        "partition" | "clog-in" | "clog-out" | "pause" | "restart" => {
            Some("consumer-?|consumer-?|coordinator-?|producer-?")
        }
        "kill" => Some("consumer-?"),
        "response-loss" => Some("consumer-?|producer-?"),
        "stale-delivery" | "store-delay" => Some("consumer-?"),
        "clock-stop" | "clock-drift" => Some("consumer-?|consumer-?|producer-?"),
        "clog-link" | "partition-link" => Some("consumer-?|coordinator-?|producer-?"),
        _ => None,
    }
}

/// The default peer of link faults: the other end is drawn from these.
const DEFAULT_PEER: &str = "coordinator-?|redis";

impl Fault {
    /// Parses one fault entry. `duration` is the default `duration_ms` (random faults pass theirs).
    pub fn parse(
        what: &str,
        kind: &str,
        target: Option<&str>,
        table: &toml::Table,
        duration: Param<u64>,
        counts: &InitialCounts,
        rng: &mut SmallRng,
    ) -> Result<Fault, PlanError> {
        let mut p = Params::new(format!("{what} {kind}"), table);
        let d = Some(duration);
        let target = |rng: &mut SmallRng| -> Result<Target, PlanError> {
            let spec = target
                .or(default_target(kind))
                .ok_or_else(|| PlanError::Invalid(format!("{what} {kind}: needs a target")))?;
            resolve_target(spec, counts, rng)
        };
        let fault = match kind {
            "delay" => Fault::Delay {
                latency_min_ms: p.u64("latency_min_ms", Some(Param::Fixed(50)), rng)?,
                latency_max_ms: p.u64("latency_max_ms", Some(Param::Range([100, 1_500])), rng)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "packet-loss" => Fault::PacketLoss {
                rate: p.f64("rate", Some(Param::Range([0.05, 0.5])), rng)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "partition" => Fault::Partition { target: target(rng)?, duration_ms: p.u64("duration_ms", d, rng)? },
            "partition-link" | "clog-link" => {
                let a = single(what, kind, target(rng)?)?;
                let peer = p.string("peer", Some(DEFAULT_PEER), rng)?;
                // A drawn peer may hit the target itself (`coordinator-?` twice): draw again.
                let mut b = single(what, kind, resolve_target(&peer, counts, rng)?)?;
                for _ in 0..8 {
                    if a != b {
                        break;
                    }
                    b = single(what, kind, resolve_target(&peer, counts, rng)?)?;
                }
                if a == b {
                    return Err(PlanError::Invalid(format!("{what} {kind}: a link needs two different nodes")));
                }
                let duration_ms = p.u64("duration_ms", d, rng)?;
                if kind == "clog-link" {
                    Fault::ClogLink { from: a, to: b, duration_ms }
                } else {
                    Fault::PartitionLink { a, b, duration_ms }
                }
            }
            "clog-in" => Fault::ClogIn { target: target(rng)?, duration_ms: p.u64("duration_ms", d, rng)? },
            "clog-out" => Fault::ClogOut { target: target(rng)?, duration_ms: p.u64("duration_ms", d, rng)? },
            "kill" => {
                let target = target(rng)?;
                if !matches!(target, Target::Node(NodeRef { role: Role::Consumer | Role::Producer, .. })) {
                    return Err(PlanError::Invalid(format!(
                        "{what} kill: only one consumer or producer may be killed for good (use restart, \
                         coordinator-loss or redis-restart for the others)"
                    )));
                }
                Fault::Kill { target }
            }
            "restart" => Fault::Restart { target: target(rng)?, down_ms: p.u64("down_ms", d, rng)? },
            "pause" => Fault::Pause { target: target(rng)?, duration_ms: p.u64("duration_ms", d, rng)? },
            "clock-stop" => Fault::ClockStop {
                target: client_target(what, kind, target(rng)?)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "clock-drift" => Fault::ClockDrift {
                target: client_target(what, kind, target(rng)?)?,
                drift_percent: p.f64(
                    "drift_percent",
                    Some(Param::Range([-DRIFT_PERCENT_MAX, DRIFT_PERCENT_MAX])),
                    rng,
                )?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "store-delay" => Fault::StoreDelay {
                target: target(rng)?,
                delay_max_ms: p.u64("delay_max_ms", Some(Param::Range([1_000, 5_000])), rng)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "response-loss" => Fault::ResponseLoss {
                target: target(rng)?,
                probability: p.f64("probability", Some(Param::Fixed(1.0)), rng)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "stale-delivery" => Fault::StaleDelivery {
                target: target(rng)?,
                probability: p.f64("probability", Some(Param::Range([0.2, 1.0])), rng)?,
                delay_max_ms: p.u64("delay_max_ms", Some(Param::Range([200, 5_000])), rng)?,
                joins: p.u64("joins", Some(Param::Fixed(1)), rng)? != 0,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "forged-requests" => Fault::ForgedRequests {
                interval_ms: p.u64("interval_ms", Some(Param::Range([100, 1_000])), rng)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "rolling-update" => Fault::RollingUpdate {
                overlap_ms: p.u64("overlap_ms", Some(Param::Range([1_000, 10_000])), rng)?,
                propagation_ms: p.u64("propagation_ms", Some(Param::Range([0, 3_000])), rng)?,
                drain_ms: p.u64("drain_ms", Some(Param::Range([500, 5_000])), rng)?,
            },
            "coordinator-loss" => Fault::CoordinatorLoss { down_ms: p.u64("down_ms", d, rng)? },
            "redis-outage" => Fault::RedisOutage {
                duration_ms: p.u64("duration_ms", d, rng)?,
                timeout_ms: p.u64("timeout_ms", Some(Param::Fixed(0)), rng)?,
            },
            "redis-latency" => Fault::RedisLatency {
                latency_min_ms: p.u64("latency_min_ms", Some(Param::Fixed(20)), rng)?,
                latency_max_ms: p.u64("latency_max_ms", Some(Param::Range([50, 1_000])), rng)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "redis-failover" => Fault::RedisFailover { loss: Loss::parse(&mut p, rng)? },
            "redis-silent-rollback" => Fault::RedisSilentRollback { loss: Loss::parse(&mut p, rng)? },
            "redis-split-brain" => Fault::RedisSplitBrain {
                loss: Loss::parse(&mut p, rng)?,
                old_primary_ms: p.u64("old_primary_ms", d, rng)?,
                share: p.f64("share", Some(Param::Fixed(0.5)), rng)?,
                pick: rng.gen(),
            },
            "redis-delete-key" => Fault::RedisDeleteKey { recreate_after_ms: p.u64("recreate_after_ms", d, rng)? },
            "redis-corrupt" => Fault::RedisCorrupt { repair_after_ms: p.u64("repair_after_ms", d, rng)? },
            "redis-future-schema" => Fault::RedisFutureSchema { repair_after_ms: p.u64("repair_after_ms", d, rng)? },
            "redis-unsupported" => Fault::RedisUnsupported {
                command: p.string("command", Some("EVALSHA"), rng)?.to_ascii_uppercase(),
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "redis-write-drop" => Fault::RedisWriteDrop {
                probability: p.f64("probability", Some(Param::Fixed(1.0)), rng)?,
                duration_ms: p.u64("duration_ms", d, rng)?,
            },
            "redis-restart" => Fault::RedisRestart {
                down_ms: p.u64("down_ms", d, rng)?,
                writes_lost: p.u64("writes_lost", Some(Param::Fixed(0)), rng)?,
            },
            other => {
                return Err(PlanError::Invalid(format!(
                    "{what}: unknown fault kind `{other}` (see fault-plans/README.md)"
                )))
            }
        };
        p.finish()?;
        fault.check(what)?;
        Ok(fault)
    }

    pub(super) fn check(&self, what: &str) -> Result<(), PlanError> {
        let bad = |m: &str| Err(PlanError::Invalid(format!("{what} {}: {m}", self.kind())));
        match self {
            Fault::Delay { latency_min_ms: lo, latency_max_ms: hi, .. }
            | Fault::RedisLatency { latency_min_ms: lo, latency_max_ms: hi, .. }
                if lo > hi =>
            {
                bad("latency_min_ms > latency_max_ms")
            }
            Fault::PacketLoss { rate: p, .. }
            | Fault::ResponseLoss { probability: p, .. }
            | Fault::StaleDelivery { probability: p, .. }
            | Fault::RedisWriteDrop { probability: p, .. }
            | Fault::RedisSplitBrain { share: p, .. }
                if !(0.0..=1.0).contains(p) =>
            {
                bad("probabilities are in [0, 1]")
            }
            Fault::ClockDrift { drift_percent, .. }
                if !(-DRIFT_PERCENT_MAX..=DRIFT_PERCENT_MAX).contains(drift_percent) =>
            {
                bad(&format!(
                    "drift_percent = {drift_percent} is beyond ±{DRIFT_PERCENT_MAX}% (half the documented clock-rate \
                 margin CLOCK_RATE_MARGIN_PERCENT = {CLOCK_RATE_MARGIN_PERCENT}%): outside the model, leases are not \
                 safe there"
                ))
            }
            Fault::RedisFailover { loss: Loss::LastWrites(0) }
            | Fault::RedisSilentRollback { loss: Loss::LastWrites(0) } => bad("writes must be >= 1"),
            Fault::RedisSplitBrain { old_primary_ms: 0, .. } => bad("old_primary_ms must be >= 1"),
            Fault::ForgedRequests { interval_ms: 0, .. } => bad("interval_ms must be >= 1"),
            _ => Ok(()),
        }
    }

    /// The nodes this fault names (a `-*` target names a role, not a node).
    pub fn nodes(&self) -> Vec<NodeRef> {
        match self {
            Fault::Partition { target, .. }
            | Fault::ClogIn { target, .. }
            | Fault::ClogOut { target, .. }
            | Fault::Kill { target }
            | Fault::Restart { target, .. }
            | Fault::Pause { target, .. }
            | Fault::ClockStop { target, .. }
            | Fault::ClockDrift { target, .. }
            | Fault::ResponseLoss { target, .. }
            | Fault::StoreDelay { target, .. }
            | Fault::StaleDelivery { target, .. } => match target {
                Target::Node(node) => vec![*node],
                Target::All(_) => Vec::new(),
            },
            Fault::PartitionLink { a, b, .. } => vec![*a, *b],
            Fault::ClogLink { from, to, .. } => vec![*from, *to],
            Fault::Delay { .. }
            | Fault::PacketLoss { .. }
            | Fault::RollingUpdate { .. }
            | Fault::CoordinatorLoss { .. }
            | Fault::RedisOutage { .. }
            | Fault::RedisLatency { .. }
            | Fault::RedisFailover { .. }
            | Fault::RedisSilentRollback { .. }
            | Fault::RedisSplitBrain { .. }
            | Fault::RedisDeleteKey { .. }
            | Fault::RedisCorrupt { .. }
            | Fault::RedisFutureSchema { .. }
            | Fault::RedisUnsupported { .. }
            | Fault::RedisWriteDrop { .. }
            | Fault::RedisRestart { .. }
            | Fault::ForgedRequests { .. } => Vec::new(),
        }
    }

    /// The plan name of this fault's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Delay { .. } => "delay",
            Fault::PacketLoss { .. } => "packet-loss",
            Fault::Partition { .. } => "partition",
            Fault::PartitionLink { .. } => "partition-link",
            Fault::ClogIn { .. } => "clog-in",
            Fault::ClogOut { .. } => "clog-out",
            Fault::ClogLink { .. } => "clog-link",
            Fault::Kill { .. } => "kill",
            Fault::Restart { .. } => "restart",
            Fault::Pause { .. } => "pause",
            Fault::ClockStop { .. } => "clock-stop",
            Fault::ClockDrift { .. } => "clock-drift",
            Fault::ResponseLoss { .. } => "response-loss",
            Fault::StoreDelay { .. } => "store-delay",
            Fault::StaleDelivery { .. } => "stale-delivery",
            Fault::RollingUpdate { .. } => "rolling-update",
            Fault::CoordinatorLoss { .. } => "coordinator-loss",
            Fault::RedisOutage { .. } => "redis-outage",
            Fault::RedisLatency { .. } => "redis-latency",
            Fault::RedisFailover { .. } => "redis-failover",
            Fault::RedisSilentRollback { .. } => "redis-silent-rollback",
            Fault::RedisSplitBrain { .. } => "redis-split-brain",
            Fault::RedisDeleteKey { .. } => "redis-delete-key",
            Fault::RedisCorrupt { .. } => "redis-corrupt",
            Fault::RedisFutureSchema { .. } => "redis-future-schema",
            Fault::RedisUnsupported { .. } => "redis-unsupported",
            Fault::RedisWriteDrop { .. } => "redis-write-drop",
            Fault::ForgedRequests { .. } => "forged-requests",
            Fault::RedisRestart { .. } => "redis-restart",
        }
    }

    /// How long after it starts the fault (and its repair) is over. `Kill` is instantaneous and
    /// permanent by design.
    pub fn healed_after_ms(&self) -> u64 {
        match self {
            Fault::Delay { duration_ms, .. }
            | Fault::PacketLoss { duration_ms, .. }
            | Fault::Partition { duration_ms, .. }
            | Fault::PartitionLink { duration_ms, .. }
            | Fault::ClogIn { duration_ms, .. }
            | Fault::ClogOut { duration_ms, .. }
            | Fault::ClogLink { duration_ms, .. }
            | Fault::Pause { duration_ms, .. }
            | Fault::ClockStop { duration_ms, .. }
            | Fault::ClockDrift { duration_ms, .. }
            | Fault::ResponseLoss { duration_ms, .. }
            | Fault::StoreDelay { duration_ms, .. }
            | Fault::StaleDelivery { duration_ms, .. }
            | Fault::RedisOutage { duration_ms, .. }
            | Fault::RedisLatency { duration_ms, .. }
            | Fault::RedisUnsupported { duration_ms, .. }
            | Fault::RedisWriteDrop { duration_ms, .. }
            | Fault::ForgedRequests { duration_ms, .. } => *duration_ms,
            Fault::RedisSplitBrain { old_primary_ms, .. } => *old_primary_ms,
            Fault::Restart { down_ms, .. }
            | Fault::CoordinatorLoss { down_ms }
            | Fault::RedisRestart { down_ms, .. } => *down_ms,
            Fault::RollingUpdate { overlap_ms, propagation_ms, drain_ms } => overlap_ms + propagation_ms.max(drain_ms),
            Fault::RedisDeleteKey { recreate_after_ms: ms }
            | Fault::RedisCorrupt { repair_after_ms: ms }
            | Fault::RedisFutureSchema { repair_after_ms: ms } => *ms,
            Fault::Kill { .. } | Fault::RedisFailover { .. } | Fault::RedisSilentRollback { .. } => 0,
        }
    }
}

/// Which metadata writes a rollback loses (in capsules: `{ last_writes = 2 }` or
/// `{ written_since = { since_ms = 12000 } }`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// The newest `n` metadata writes (`writes = n`).
    LastWrites(u64),
    /// Every metadata write applied after `since_ms` of simulated time (`since_ms = t`): a replica
    /// that stopped replicating then.
    WrittenSince { since_ms: u64 },
}

impl Loss {
    fn parse(p: &mut Params<'_>, rng: &mut SmallRng) -> Result<Loss, PlanError> {
        let since = p.u64("since_ms", Some(Param::Fixed(u64::MAX)), rng)?;
        let writes = p.u64("writes", Some(Param::Fixed(0)), rng)?;
        match (since, writes) {
            (u64::MAX, 0) => Ok(Loss::LastWrites(p.u64("writes", Some(Param::Range([1, 3])), rng)?)),
            (u64::MAX, writes) => Ok(Loss::LastWrites(writes)),
            (since_ms, 0) => Ok(Loss::WrittenSince { since_ms }),
            _ => Err(PlanError::Invalid("a rollback takes `writes` or `since_ms`, not both".into())),
        }
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::LastWrites(writes) => write!(f, "last {writes} writes"),
            Loss::WrittenSince { since_ms } => write!(f, "every write since {since_ms}ms"),
        }
    }
}

/// The largest clock-rate drift a plan may inject, in percent each way: half the group's documented
/// margin (a consumer's clock may run slow by this much while a coordinator's runs fast by as much).
pub const DRIFT_PERCENT_MAX: f64 = CLOCK_RATE_MARGIN_PERCENT as f64 / 2.0;

/// Clock faults live in the clients' clock layer ([`rsc::client::clock::ClockFaults`]): only
/// consumers and producers have one (coordinators read tokio time directly; `DESIGN.md` §7).
fn client_target(what: &str, kind: &str, target: Target) -> Result<Target, PlanError> {
    let role = match target {
        Target::Node(node) => node.role,
        Target::All(role) => role,
    };
    if matches!(role, Role::Consumer | Role::Producer) {
        Ok(target)
    } else {
        Err(PlanError::Invalid(format!("{what} {kind}: only consumers and producers have a simulated clock")))
    }
}

fn single(what: &str, kind: &str, target: Target) -> Result<NodeRef, PlanError> {
    match target {
        Target::Node(node) => Ok(node),
        Target::All(_) => Err(PlanError::Invalid(format!("{what} {kind}: a link needs single nodes, not `-*`"))),
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<22}", self.kind())?;
        match self {
            Fault::Delay { latency_min_ms, latency_max_ms, duration_ms } => {
                write!(f, "latency={latency_min_ms}..{latency_max_ms}ms for {duration_ms}ms")
            }
            Fault::PacketLoss { rate, duration_ms } => write!(f, "rate={rate:.3} for {duration_ms}ms"),
            Fault::Partition { target, duration_ms }
            | Fault::ClogIn { target, duration_ms }
            | Fault::ClogOut { target, duration_ms }
            | Fault::Pause { target, duration_ms }
            | Fault::ClockStop { target, duration_ms } => write!(f, "{target} for {duration_ms}ms"),
            Fault::ClockDrift { target, drift_percent, duration_ms } => {
                write!(f, "{target} {drift_percent:+.3}% for {duration_ms}ms")
            }
            Fault::PartitionLink { a, b, duration_ms } => write!(f, "{a} <-> {b} for {duration_ms}ms"),
            Fault::ClogLink { from, to, duration_ms } => write!(f, "{from} -> {to} for {duration_ms}ms"),
            Fault::Kill { target } => write!(f, "{target}"),
            Fault::Restart { target, down_ms } => write!(f, "{target} down {down_ms}ms"),
            Fault::ResponseLoss { target, probability, duration_ms } => {
                write!(f, "{target} p={probability:.2} for {duration_ms}ms")
            }
            Fault::StoreDelay { target, delay_max_ms, duration_ms } => {
                write!(f, "{target} requests up to {delay_max_ms}ms late for {duration_ms}ms")
            }
            Fault::StaleDelivery { target, probability, delay_max_ms, joins, duration_ms } => {
                let joins = if *joins { "" } else { " (not joins)" };
                write!(f, "{target} p={probability:.2} up to {delay_max_ms}ms late{joins} for {duration_ms}ms")
            }
            Fault::RollingUpdate { overlap_ms, propagation_ms, drain_ms } => {
                write!(f, "overlap={overlap_ms}ms propagation={propagation_ms}ms drain={drain_ms}ms")
            }
            Fault::CoordinatorLoss { down_ms } => write!(f, "down {down_ms}ms"),
            Fault::RedisOutage { duration_ms, timeout_ms } => write!(f, "for {duration_ms}ms timeout={timeout_ms}ms"),
            Fault::RedisLatency { latency_min_ms, latency_max_ms, duration_ms } => {
                write!(f, "+{latency_min_ms}..{latency_max_ms}ms for {duration_ms}ms")
            }
            Fault::RedisFailover { loss } | Fault::RedisSilentRollback { loss } => loss.fmt(f),
            Fault::RedisSplitBrain { loss, old_primary_ms, share, pick } => {
                write!(f, "{loss}, old primary for {old_primary_ms}ms serving share={share:.2} (pick {pick:016x})")
            }
            Fault::RedisDeleteKey { recreate_after_ms } => write!(f, "recreate after {recreate_after_ms}ms"),
            Fault::RedisCorrupt { repair_after_ms } | Fault::RedisFutureSchema { repair_after_ms } => {
                write!(f, "repair after {repair_after_ms}ms")
            }
            Fault::RedisUnsupported { command, duration_ms } => write!(f, "{command} for {duration_ms}ms"),
            Fault::RedisWriteDrop { probability, duration_ms } => write!(f, "p={probability:.2} for {duration_ms}ms"),
            Fault::ForgedRequests { interval_ms, duration_ms } => {
                write!(f, "every {interval_ms}ms for {duration_ms}ms")
            }
            Fault::RedisRestart { down_ms, writes_lost } => write!(f, "down {down_ms}ms, {writes_lost} writes lost"),
        }
    }
}

/// An operator or workload step a scenario schedules (not a fault: it never needs healing).
/// Serialized like [`Fault`], tagged by `kind`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Action {
    /// A new consumer process starts and joins (`consumer-<next>`).
    ConsumerJoin,
    /// The consumer leaves cleanly: drains, reports REVOKED, sends the leave heartbeat, stops.
    ConsumerLeave { target: Target },
    /// The operator adds `add` shards (AddShards with the revision it just read).
    AddShards { add: u32 },
    /// A new producer process starts (`producer-<next>`).
    ProducerJoin,
    /// The operator deletes the group (DeleteGroup with the revision it just read, again while the
    /// group is not empty yet, for at most a minute) and then creates it again with the plan's
    /// shard count and config. Each request may reach another coordinator.
    Recreate,
}

impl Action {
    pub fn parse(
        what: &str,
        kind: &str,
        target: Option<&str>,
        table: &toml::Table,
        counts: &InitialCounts,
        rng: &mut SmallRng,
    ) -> Result<Action, PlanError> {
        let mut p = Params::new(format!("{what} {kind}"), table);
        let action = match kind {
            "consumer-join" => Action::ConsumerJoin,
            "producer-join" => Action::ProducerJoin,
            "recreate" => Action::Recreate,
            "consumer-leave" => {
                Action::ConsumerLeave { target: resolve_target(target.unwrap_or("consumer-?"), counts, rng)? }
            }
            "add-shards" => {
                let add = p.u64("add", Some(Param::Fixed(1)), rng)?;
                let add = u32::try_from(add)
                    .ok()
                    .filter(|a| *a >= 1)
                    .ok_or_else(|| PlanError::Invalid(format!("{what} add-shards: add must be in 1..=65535")))?;
                Action::AddShards { add }
            }
            other => return Err(PlanError::Invalid(format!("{what}: unknown action `{other}`"))),
        };
        p.finish()?;
        Ok(action)
    }
}

impl Action {
    /// The node this action names.
    pub fn node(&self) -> Option<NodeRef> {
        match self {
            Action::ConsumerLeave { target: Target::Node(node) } => Some(*node),
            _ => None,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::ConsumerJoin => f.write_str("consumer-join"),
            Action::ProducerJoin => f.write_str("producer-join"),
            Action::ConsumerLeave { target } => write!(f, "consumer-leave         {target}"),
            Action::AddShards { add } => write!(f, "add-shards             +{add}"),
            Action::Recreate => f.write_str("recreate"),
        }
    }
}

/// A `u64` as a decimal string (TOML integers are `i64`).
mod u64_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&value.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
