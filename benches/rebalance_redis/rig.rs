//! [`Rig`]: one coordinator process (planted bug on or off) over the spawned Redis, one group, and
//! a fleet of consumers built from the consumer library, all on the caller's tokio runtime.
//!
//! Owns: the coordinator (with its ticker, and its HTTP server when the transport is HTTP), the
//! consumers by member id, the [`Board`] they report to, and the measurement window of one
//! rebalance ([`Window`] in, [`Outcome`] out). Never: waits without a deadline, or leaves a task
//! running after [`Rig::teardown`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::board::{record_agrees, Board, BoardCounts, Settled};
use super::instrumented::{Instrumented, StoreTrace, TraceCounts};
use super::transport::Link;
use crate::support::cpu::process_cpu;
use crate::support::RedisServer;
use rsc::client::consumer::NoopListener;
use rsc::client::{ClientEnv, Clock, Consumer, ConsumerConfig};
use rsc::core::model::{GroupConfig, GroupId, MemberId};
use rsc::core::protocol::AdminRequest;
use rsc::core::{PlantedBug, PlantedBugs};
use rsc::service::{Coordinator, CoordinatorOptions, GroupDescription};
use rsc::store::redis::{RedisStore, RedisStoreOptions};

pub type BenchCoordinator = Coordinator<Instrumented<RedisStore>>;

/// How often the coordinator's record is read again while the consumers' views stay settled.
const RECHECK: Duration = Duration::from_millis(250);

/// The coordinator's behaviour under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Variant {
    /// The planted bug `ProcessWideRevisionMark`: the behaviour before the fix.
    Before,
    /// No planted bug: the fixed behaviour.
    After,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Before => "before",
            Variant::After => "after",
        }
    }

    fn planted(self) -> PlantedBugs {
        match self {
            Variant::Before => PlantedBugs::only(PlantedBug::ProcessWideRevisionMark),
            Variant::After => PlantedBugs::NONE,
        }
    }
}

/// How every rig of a run is built.
#[derive(Clone, Copy, Debug)]
pub struct RigSettings {
    pub http: bool,
    /// Longest wait for one rebalance (or one clean close) to finish.
    pub deadline: Duration,
    /// Print every timed rebalance's timeline (`REB_TIMELINE=1`).
    pub timeline: bool,
    /// The consumers' `heartbeat_timeout_ms` when not the library's default (`REB_HB_TIMEOUT_MS`).
    pub heartbeat_timeout_ms: Option<u64>,
}

/// The start of one timed rebalance.
pub struct Window {
    started: Instant,
    started_ms: u64,
    regressions: f64,
    cpu: CpuTimes,
}

/// One timed rebalance.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// From the window's start to the moment the last member applied its final `OK` (the deadline
    /// when it did not finish: a lower bound).
    pub seconds: f64,
    /// False when the deadline passed first.
    pub finished: bool,
    /// `rsc_metadata_version_regressions_total` (+ identity changes + client-version-ahead reports)
    /// counted by the coordinator during the window.
    pub evidence: u64,
    /// Correction rounds started by aggregates written to Redis during the window.
    pub rounds: u64,
    pub board: BoardCounts,
    pub store: TraceCounts,
    /// Wall time to confirmation, and CPU seconds of this process and of redis-server meanwhile.
    pub wall_s: f64,
    pub process_cpu_s: f64,
    pub redis_cpu_s: f64,
    pub final_aggregate_bytes: usize,
    /// Encode and decode ms of the settled aggregate (measured for big groups only).
    pub codec_ms: Option<(f64, f64)>,
}

/// A rebalance that did not finish by the deadline: what was counted until then, and why.
pub struct Unfinished {
    pub outcome: Outcome,
    pub why: String,
}

#[derive(Clone, Copy, Debug)]
struct CpuTimes {
    process_s: f64,
    redis_s: f64,
}

pub struct Rig {
    pub variant: Variant,
    pub group: GroupId,
    pub shard_count: u32,
    coordinator: BenchCoordinator,
    trace: Arc<StoreTrace>,
    board: Arc<Board>,
    clock: Clock,
    link: Link,
    consumer_store: RedisStore,
    consumers: BTreeMap<MemberId, Consumer<Link, RedisStore>>,
    tasks: Vec<JoinHandle<()>>,
    settings: RigSettings,
    redis: Arc<RedisServer>,
}

impl Rig {
    /// A fresh coordinator process and a fresh group of `shard_count` shards (default config).
    pub async fn start(
        redis: &Arc<RedisServer>,
        settings: RigSettings,
        variant: Variant,
        group: GroupId,
        shard_count: u32,
        seed: u64,
    ) -> Result<Rig, String> {
        let store = RedisStore::connect(&redis.url(), RedisStoreOptions::default()).await.map_err(|e| e.to_string())?;
        let instrumented = Instrumented::new(store);
        let trace = instrumented.trace();
        let options = CoordinatorOptions {
            instance_id: format!("bench-{}", variant.name()),
            rng_seed: seed,
            planted: variant.planted(),
            ..CoordinatorOptions::default()
        };
        let coordinator = Coordinator::new(instrumented, options);
        coordinator.start().await.map_err(|e| format!("probe: {e}"))?;
        let create = AdminRequest::CreateGroup { group: group.clone(), shard_count, config: GroupConfig::default() };
        coordinator.admin(create).await.map_err(|e| format!("create group: {e}"))?;
        let mut tasks = vec![tokio::spawn({
            let coordinator = coordinator.clone();
            async move { coordinator.run_ticker().await }
        })];
        let link = if settings.http {
            let (link, server) = Link::http(coordinator.clone()).await?;
            tasks.push(server);
            link
        } else {
            Link::in_process(coordinator.clone())
        };
        let consumer_store =
            RedisStore::connect(&redis.url(), RedisStoreOptions::default()).await.map_err(|e| e.to_string())?;
        Ok(Rig {
            variant,
            group,
            shard_count,
            coordinator,
            trace,
            board: Arc::new(Board::default()),
            clock: Clock::new(),
            link,
            consumer_store,
            consumers: BTreeMap::new(),
            tasks,
            settings,
            redis: Arc::clone(redis),
        })
    }

    /// Joins a consumer (default consumer config: its first heartbeat goes out at once).
    pub fn join(&mut self, member: &str) {
        let mut config = ConsumerConfig::new(self.group.clone(), member);
        if let Some(timeout_ms) = self.settings.heartbeat_timeout_ms {
            config.heartbeat_timeout_ms = timeout_ms;
        }
        let env = ClientEnv::new(self.clock.clone(), self.board.clone());
        let consumer =
            Consumer::join_with(config, self.link.clone(), self.consumer_store.clone(), env, Arc::new(NoopListener));
        self.consumers.insert(member.to_string(), consumer);
    }

    /// A clean leave: drain, REVOKED reports and the leave heartbeat, within the deadline.
    pub async fn close(&mut self, member: &str) -> Result<(), String> {
        let consumer = self.consumers.remove(member).ok_or_else(|| format!("no consumer {member}"))?;
        match tokio::time::timeout(self.settings.deadline, consumer.close()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("close {member}: {e}")),
            Err(_) => Err(format!("close {member}: no leave within {:?}", self.settings.deadline)),
        }
    }

    /// Opens a measurement window: from now on, counts are this window's.
    pub fn window(&self) -> Window {
        let _ = self.board.take_counts();
        let _ = self.trace.take();
        Window {
            started: Instant::now(),
            started_ms: self.clock.now_ms(),
            regressions: self.evidence_total(),
            cpu: self.cpu_times(),
        }
    }

    /// Waits until every current consumer applied `OK` with nothing pending or revoking and the
    /// coordinator's record agrees (every shard owned by its target); times it from `window`.
    /// At the deadline, the outcome so far comes back as [`Unfinished`], timed at the deadline.
    pub async fn wait_all_ok(&self, window: Window) -> Result<Outcome, Unfinished> {
        let expected: BTreeSet<MemberId> = self.consumers.keys().cloned().collect();
        let deadline = window.started + self.settings.deadline;
        let mut checked: Option<(u64, Instant)> = None;
        loop {
            let settled = self.board.settled(&expected, self.shard_count);
            // The record is read when the consumers' view changed since the last look, else at
            // most every RECHECK (a record-only change, such as a round ending, changes no view).
            let due = |s: &Settled| checked.is_none_or(|(at_ms, when)| at_ms != s.at_ms || when.elapsed() >= RECHECK);
            if let Some(settled) = settled.filter(due) {
                checked = Some((settled.at_ms, Instant::now()));
                if let Some(description) = self.agreeing_record(&settled).await {
                    return Ok(self.outcome(window, Some((&settled, &description))));
                }
            }
            if Instant::now() >= deadline {
                let why = format!(
                    "{} {}: not all OK within {:?}; {}",
                    self.variant.name(),
                    self.group,
                    self.settings.deadline,
                    self.board.explain(&expected)
                );
                return Err(Unfinished { outcome: self.outcome(window, None), why });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn agreeing_record(&self, settled: &Settled) -> Option<GroupDescription> {
        let description = self.coordinator.describe(&self.group).await.ok()?;
        record_agrees(&description, settled).then_some(description)
    }

    /// The window's outcome; `done` is `None` when the deadline passed first.
    fn outcome(&self, window: Window, done: Option<(&Settled, &GroupDescription)>) -> Outcome {
        let cpu = self.cpu_times();
        let store = self.trace.take();
        let board = self.board.take_counts();
        let (seconds, aggregate) = match done {
            Some((settled, description)) => {
                if self.settings.timeline {
                    let title = format!("{} {}", self.variant.name(), self.group);
                    let ms_at = |at: Instant| self.clock.ms_at(tokio::time::Instant::from_std(at));
                    super::timeline::print(&title, window.started_ms, &board, &store, settled, ms_at);
                }
                let aggregate = serde_json::to_string(&description.metadata).map_or(0, |s| s.len());
                (settled.at_ms.saturating_sub(window.started_ms) as f64 / 1000.0, aggregate)
            }
            None => (self.settings.deadline.as_secs_f64(), 0),
        };
        Outcome {
            seconds,
            finished: done.is_some(),
            evidence: (self.evidence_total() - window.regressions).round() as u64,
            rounds: store.correction_rounds,
            board,
            store,
            wall_s: window.started.elapsed().as_secs_f64(),
            process_cpu_s: cpu.process_s - window.cpu.process_s,
            redis_cpu_s: cpu.redis_s - window.cpu.redis_s,
            final_aggregate_bytes: aggregate,
            codec_ms: None,
        }
    }

    /// Every kind of loss evidence this coordinator detected itself or was told about.
    fn evidence_total(&self) -> f64 {
        let metrics = self.coordinator.metrics();
        [
            "rsc_metadata_version_regressions_total",
            "rsc_store_identity_changes_total",
            "rsc_client_metadata_version_ahead_total",
        ]
        .iter()
        .map(|name| metrics.total(name))
        .sum()
    }

    fn cpu_times(&self) -> CpuTimes {
        CpuTimes { process_s: process_cpu().as_secs_f64(), redis_s: redis_cpu_s(&self.redis) }
    }

    pub fn coordinator(&self) -> &BenchCoordinator {
        &self.coordinator
    }

    /// Stops every consumer (no leave: the group is deleted next), the ticker and the server, then
    /// deletes everything the rig wrote to Redis.
    pub async fn teardown(mut self) {
        self.consumers.clear();
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
        // Aborted heartbeats may still have a command on the wire; give them a moment, then wipe
        // the database (the rig's coordinator and consumers were its only users).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = self.redis.try_cmd(&["FLUSHALL"]);
    }
}

/// `used_cpu_user + used_cpu_sys` of the server (`INFO cpu`).
fn redis_cpu_s(redis: &RedisServer) -> f64 {
    let text: String =
        redis.try_cmd(&["INFO", "cpu"]).ok().and_then(|v| redis::from_redis_value(v).ok()).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(key, _)| *key == "used_cpu_user" || *key == "used_cpu_sys")
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}
