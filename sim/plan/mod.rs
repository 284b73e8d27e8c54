//! Fault plans: the TOML scenario format (`fault-plans/README.md` documents it) and the drawn
//! [`Plan`] a run executes.
//!
//! Owns: parsing, validation, and drawing every parameter from one seed (TigerBeetle VOPR style:
//! one plan + one seed determines the whole run, and [`Plan::describe`] prints every drawn value
//! before the run starts). Never touches the simulation: the runner applies what is drawn here.
//! Keeps: every scheduled or random fault heals by `heal_ms`, so the liveness checker has a
//! well-defined fault-free window to judge.

mod draw;
pub mod fault;
pub mod node;
pub mod param;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rsc::core::model::GroupConfig;
use rsc::core::PlantedBug;
use serde::{Deserialize, Serialize};

pub use fault::{Action, Fault};
#[cfg_attr(not(madsim), allow(unused_imports))] // Target is used by the madsim-only injector.
pub use node::{NodeRef, Role, Target};
use param::Param;

/// A plan that cannot be loaded or drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The plan file could not be read.
    #[error("cannot read {path}: {message}")]
    Io { path: PathBuf, message: String },
    /// The plan file is not valid TOML for the plan format.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// The plan (or a value drawn from it) breaks a rule of the format.
    #[error("invalid plan: {0}")]
    Invalid(String),
}

/// A plan file as written (parameters may still be ranges).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub topology: TopologySpec,
    #[serde(default)]
    pub workload: WorkloadSpec,
    pub durations: DurationsSpec,
    #[serde(default)]
    pub group: GroupSpec,
    #[serde(default)]
    pub tuning: TuningSpec,
    /// Planted bugs switched on for this plan (negative tests; kebab-case names of `PlantedBug`).
    #[serde(default)]
    pub planted: Vec<PlantedBug>,
    /// Violation kinds this plan must produce (planted-bug plans); empty: it must produce none.
    #[serde(default)]
    pub expect: Vec<String>,
    /// Kinds the planted bug may also cause on some seeds (its consequences: a response derived
    /// from unwritten state can lead to a split, …). Not required; any kind outside `expect` and
    /// `also` fails `cargo sim planted`.
    #[serde(default)]
    pub also: Vec<String>,
    #[serde(default, rename = "fault")]
    pub faults: Vec<EntrySpec>,
    #[serde(default, rename = "action")]
    pub actions: Vec<EntrySpec>,
    pub random: Option<RandomSpec>,
    /// The file this spec was loaded from ([`load_plan`]); `None` for a spec parsed from text.
    #[serde(skip)]
    pub source: Option<PlanSource>,
}

/// How a plan file was named when it was loaded, so that a child process or a printed command
/// loads exactly that file again (the `name` inside the file need not match its file name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanSource {
    /// `<dir>/<name>.toml`: a name in a plans directory (`--plans`, as given).
    Named { dir: PathBuf, name: String },
    /// A path to a `.toml` file, canonical (absolute) when it could be resolved.
    File(PathBuf),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    pub coordinators: Param<u32>,
    pub consumers: Param<u32>,
    pub producers: Param<u32>,
    pub shards: Param<u32>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadSpec {
    /// Pause between two publishes of one producer.
    pub publish_interval_ms: Param<u64>,
    /// Per-entry processing time is uniform in `[processing_min_ms, processing_max_ms]`.
    pub processing_min_ms: Param<u64>,
    pub processing_max_ms: Param<u64>,
    /// Pause between two polls of a consumer with nothing to read.
    pub poll_interval_ms: Param<u64>,
    /// XREADGROUP COUNT.
    pub read_count: Param<u32>,
    /// Number of distinct message keys producers route by.
    pub keys: Param<u32>,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        Self {
            publish_interval_ms: Param::Range([20, 200]),
            processing_min_ms: Param::Fixed(1),
            processing_max_ms: Param::Range([5, 50]),
            poll_interval_ms: Param::Range([20, 100]),
            read_count: Param::Range([5, 20]),
            keys: Param::Fixed(1_000),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurationsSpec {
    /// Simulated length of the run.
    pub run_ms: Param<u64>,
    /// Every fault (and its repair) is over by then.
    pub heal_ms: Param<u64>,
    /// After `heal_ms`, within this bound, every shard is read by a live member and nobody is
    /// stuck in REVOKE_PENDING / SYNC_METADATA.
    pub liveness_bound_ms: Param<u64>,
    /// Producers stop publishing this long before the end, so everything acknowledged can be
    /// delivered before the message checker judges.
    #[serde(default = "default_drain")]
    pub drain_ms: Param<u64>,
}

fn default_drain() -> Param<u64> {
    Param::Fixed(5_000)
}

/// The group's timing configuration (`GroupConfig`); absent fields take the library defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    pub member_lease_ttl_ms: Option<Param<u64>>,
    pub assignment_lease_ms: Option<Param<u64>>,
    pub heartbeat_interval_ms: Option<Param<u64>>,
    pub rebalance_timeout_ms: Option<Param<u64>>,
    pub routing_cache_ttl_ms: Option<Param<u64>>,
    pub routing_refresh_interval_ms: Option<Param<u64>>,
    /// `sticky-uniform` or `range`.
    pub assignor: Option<rsc::core::model::AssignorKind>,
    /// Re-add the shards of a lost `add-shards` a producer reports (default on).
    pub heal_lost_add_shards: Option<bool>,
    /// `GroupConfig::fencing` (default on). Off only in plans that measure what leases alone
    /// give, or whose planted bug fencing would hide.
    pub fencing: Option<bool>,
}

/// Timeouts and cadences of the simulated processes and network.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TuningSpec {
    /// Base one-way network latency range (madsim's default is 1..10 ms).
    pub latency_min_ms: Param<u64>,
    pub latency_max_ms: Param<u64>,
    /// Timeout of one Redis command issued over the simulated network.
    pub store_timeout_ms: Param<u64>,
    /// Timeout of one coordinator HTTP request.
    pub http_timeout_ms: Param<u64>,
    /// Coordinator tick period.
    pub tick_interval_ms: Param<u64>,
    /// Coordinator mutex TTL.
    pub mutex_ttl_ms: Param<u64>,
    /// How clients reach the coordinators: the production HTTP edge over simulated TCP, a
    /// lighter datagram protocol (faster; for very large seed sweeps), or `either`, drawn per seed.
    pub protocol: ProtocolSpec,
}

/// The protocol of a plan: one, or drawn from the seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProtocolSpec {
    #[default]
    Http,
    Rpc,
    /// HTTP or the datagram protocol, with equal probability.
    Either,
}

/// The client–coordinator protocol of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// `HttpTransport` against the axum router, over madsim TCP.
    #[default]
    Http,
    /// The simulation's datagram protocol (`sim/coord_rpc.rs`).
    Rpc,
}

impl Default for TuningSpec {
    fn default() -> Self {
        Self {
            latency_min_ms: Param::Fixed(1),
            latency_max_ms: Param::Range([2, 10]),
            store_timeout_ms: Param::Fixed(500),
            http_timeout_ms: Param::Fixed(2_000),
            tick_interval_ms: Param::Range([100, 500]),
            mutex_ttl_ms: Param::Fixed(2_000),
            protocol: ProtocolSpec::Http,
        }
    }
}

/// One `[[fault]]` or `[[action]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntrySpec {
    pub at_ms: Param<u64>,
    pub kind: String,
    pub target: Option<String>,
    #[serde(default)]
    pub params: toml::Table,
}

/// Random faults drawn from the seed (`[random]`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomSpec {
    /// Expected number of faults per simulated minute in `[start_ms, heal_ms)`.
    pub faults_per_minute: Param<f64>,
    /// First instant a random fault may start (default 5 s: let the group settle).
    #[serde(default = "default_random_start")]
    pub start_ms: Param<u64>,
    /// Default `duration_ms` / `down_ms` / repair delay of each random fault.
    pub duration_ms: Param<u64>,
    /// Fault kinds to draw from; empty with `swarm = true` means every kind.
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Relative weights, one per kind (default: all 1).
    #[serde(default)]
    pub weights: Vec<u32>,
    /// Swarm testing: each kind is enabled with probability 1/2 (at least one) and its weight is
    /// drawn from 1..=10, so different seeds explore different fault mixes.
    #[serde(default)]
    pub swarm: bool,
    /// Per-kind parameter overrides, e.g. `[random.params.redis-failover] writes = [1, 5]`.
    #[serde(default)]
    pub params: BTreeMap<String, toml::Table>,
}

fn default_random_start() -> Param<u64> {
    Param::Fixed(5_000)
}

/// How many nodes of each role exist at the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub coordinators: u32,
    pub consumers: u32,
    pub producers: u32,
    pub shards: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub publish_interval_ms: u64,
    pub processing_min_ms: u64,
    pub processing_max_ms: u64,
    pub poll_interval_ms: u64,
    pub read_count: u32,
    pub keys: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Durations {
    pub run_ms: u64,
    pub heal_ms: u64,
    pub liveness_bound_ms: u64,
    pub drain_ms: u64,
}

impl Durations {
    /// The instant by which the system must be live again.
    pub fn live_by_ms(&self) -> u64 {
        self.heal_ms + self.liveness_bound_ms
    }

    /// Producers publish until then.
    pub fn publish_until_ms(&self) -> u64 {
        self.run_ms - self.drain_ms
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    pub latency_min_ms: u64,
    pub latency_max_ms: u64,
    pub store_timeout_ms: u64,
    pub http_timeout_ms: u64,
    pub tick_interval_ms: u64,
    pub mutex_ttl_ms: u64,
    pub protocol: Protocol,
}

/// Where a scheduled item came from (for the printed schedule); `plan#0` / `rand#3` in capsules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The n-th `[[fault]]` / `[[action]]` of the plan file.
    Plan(usize),
    /// The n-th fault drawn by `[random]`.
    Random(usize),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Plan(i) => write!(f, "plan#{i}"),
            Origin::Random(i) => write!(f, "rand#{i}"),
        }
    }
}

impl std::str::FromStr for Origin {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PlanError::Invalid(format!("origin `{s}` is neither plan#N nor rand#N"));
        let (from, index) = s.split_once('#').ok_or_else(bad)?;
        let index = index.parse().map_err(|_| bad())?;
        match from {
            "plan" => Ok(Origin::Plan(index)),
            "rand" => Ok(Origin::Random(index)),
            _ => Err(bad()),
        }
    }
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Origin {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A fault or action with its start time. In a capsule the item's fields sit next to `at_ms`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scheduled<T> {
    pub at_ms: u64,
    pub origin: Origin,
    #[serde(flatten)]
    pub item: T,
}

/// A plan with every parameter drawn for one seed: everything a run needs (a capsule stores it
/// whole, so a run replays without the plan file or its draw).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub topology: Topology,
    pub workload: Workload,
    pub durations: Durations,
    pub group: GroupConfig,
    pub tuning: Tuning,
    pub planted: Vec<PlantedBug>,
    pub expect: Vec<String>,
    /// Sorted by start time.
    pub faults: Vec<Scheduled<Fault>>,
    /// Sorted by start time.
    pub actions: Vec<Scheduled<Action>>,
    /// The random fault mix actually in force (kind, weight); empty without `[random]`.
    pub random_mix: Vec<(String, u32)>,
    pub random_faults_per_minute: f64,
}

impl PlanSpec {
    /// Parses a plan file's text; `path` is only for messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, PlanError> {
        toml::from_str(text).map_err(|e| PlanError::Parse { path: path.to_path_buf(), message: e.to_string() })
    }

    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PlanError::Io { path: path.to_path_buf(), message: e.to_string() })?;
        Self::parse(&text, path)
    }

    /// The file this spec came from; a spec parsed from text counts as the shipped plan of its name.
    pub fn source(&self) -> PlanSource {
        self.source.clone().unwrap_or_else(|| PlanSource::Named { dir: default_plan_dir(), name: self.name.clone() })
    }

    /// Draws every parameter for `seed` and validates the result.
    pub fn draw(&self, seed: u64) -> Result<Plan, PlanError> {
        draw::draw(self, seed)
    }
}

impl Plan {
    /// Checks a plan that was not drawn from a spec (a capsule, a shrunk candidate).
    pub fn check(&self) -> Result<(), PlanError> {
        draw::check_concrete(self)
    }
}

/// The directory of shipped plans.
pub fn default_plan_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fault-plans"))
}

/// Files that live in the plan directory but are not plans.
const NOT_PLANS: &[&str] = &["must-reach"];

/// Every plan name in `dir`, sorted.
pub fn plan_names(dir: &Path) -> Result<Vec<String>, PlanError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| PlanError::Io { path: dir.to_path_buf(), message: e.to_string() })?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".toml")).map(str::to_string))
        .filter(|n| !NOT_PLANS.contains(&n.as_str()))
        .collect();
    names.sort();
    Ok(names)
}

/// Loads the plan `name` (a file stem in `dir`, or a path to a `.toml` file).
pub fn load_plan(dir: &Path, name: &str) -> Result<PlanSpec, PlanError> {
    let (path, source) = if name.ends_with(".toml") {
        let path = PathBuf::from(name);
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        (path, PlanSource::File(canonical))
    } else {
        (dir.join(format!("{name}.toml")), PlanSource::Named { dir: dir.to_path_buf(), name: name.to_string() })
    };
    let mut spec = PlanSpec::load(&path)?;
    spec.source = Some(source);
    Ok(spec)
}

#[cfg(test)]
mod tests;
