//! Failure capsules: one run written down whole, so it replays without its plan file.
//!
//! A capsule is a TOML file holding the fully drawn [`Plan`] (topology, workload, durations, group
//! config, tuning, planted bugs, every fault and action with its time and target, and the seed of
//! the run's remaining randomness: madsim's scheduler and network, the store and each process's
//! RNG), the commit it was recorded at, the violation kinds the run produced, the hash of its full
//! trace and a free-text note. A (plan, seed) pair changes meaning when the plan file or its draw
//! order changes; a capsule does not: replaying one never reads a plan file or draws anything.
//!
//! Owns: the file format, writing capsules of failing runs to `target/sim-capsules/`, loading and
//! checking them. Never decides whether a run failed: the checkers do.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use rsc::core::model::GroupConfig;

use crate::checkers::Finding;
use crate::plan::{Plan, PlanError, PlanSpec};

#[cfg(madsim)]
pub mod replay;
#[cfg(madsim)]
pub mod shrink;

/// The capsule format this build writes and reads.
pub const FORMAT: u32 = 1;

/// One recorded run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capsule {
    /// [`FORMAT`].
    pub format: u32,
    /// What this run is (how it was found, what it shows).
    pub note: String,
    /// `git rev-parse HEAD` of the build that recorded it (`+dirty`: with uncommitted changes).
    pub commit: String,
    /// Violation kinds the recorded run produced, in order of first occurrence.
    pub kinds: Vec<String>,
    /// FNV-1a hash of the recorded run's full trace (16 hex digits). The same build replays the
    /// same hash; a build with other product or trace code may not (the kinds are what must hold).
    pub trace_hash: String,
    /// Regression capsules: when and what the run found, and what fixed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The run itself.
    pub run: Plan,
}

/// `[run.group]` as a capsule must hold it: every field of the product's `GroupConfig` and no
/// other. The product's type reads its own records leniently (three fields default when absent,
/// unknown keys are ignored), so a capsule read through it alone would run a misspelt or missing
/// setting at its default, silently.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GroupRecord {
    member_lease_ttl_ms: u64,
    assignment_lease_ms: u64,
    heartbeat_interval_ms: u64,
    rebalance_timeout_ms: u64,
    routing_cache_ttl_ms: u64,
    routing_refresh_interval_ms: u64,
    assignor: rsc::core::model::AssignorKind,
    heal_lost_add_shards: bool,
    fencing: bool,
}

/// The group config of a capsule's text, read strictly as a [`GroupRecord`]. Every field is
/// named: one added to `GroupConfig` is a compile error here until the record has it too.
fn group_config(text: &str) -> Result<GroupConfig, String> {
    let value: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    let group = value.get("run").and_then(|run| run.get("group")).ok_or("no [run.group]")?;
    let r = GroupRecord::deserialize(group.clone()).map_err(|e| format!("[run.group]: {e}"))?;
    Ok(GroupConfig {
        member_lease_ttl_ms: r.member_lease_ttl_ms,
        assignment_lease_ms: r.assignment_lease_ms,
        heartbeat_interval_ms: r.heartbeat_interval_ms,
        rebalance_timeout_ms: r.rebalance_timeout_ms,
        routing_cache_ttl_ms: r.routing_cache_ttl_ms,
        routing_refresh_interval_ms: r.routing_refresh_interval_ms,
        assignor: r.assignor,
        heal_lost_add_shards: r.heal_lost_add_shards,
        fencing: r.fencing,
    })
}

/// Where failing runs write their capsules.
pub fn default_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/sim-capsules"))
}

/// The commit of the source tree this binary runs from, read once (outside any simulation).
pub fn commit() -> &'static str {
    static COMMIT: OnceLock<String> = OnceLock::new();
    COMMIT.get_or_init(|| {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        match git(&["rev-parse", "HEAD"]) {
            Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
                Some(changes) if changes.is_empty() => head,
                _ => format!("{head}+dirty"),
            },
            None => "unknown".to_string(),
        }
    })
}

/// The distinct kinds of `findings`, in order of first occurrence.
pub fn kinds_of(findings: &[Finding]) -> Vec<String> {
    let mut kinds: Vec<String> = Vec::new();
    for f in findings {
        if !kinds.iter().any(|k| k == f.kind) {
            kinds.push(f.kind.to_string());
        }
    }
    kinds
}

/// A trace hash as capsules write it.
pub fn fmt_hash(hash: u64) -> String {
    format!("{hash:016x}")
}

impl Capsule {
    /// The capsule of a run of `plan` that produced `findings` and a full trace hashing to
    /// `trace_hash`.
    pub fn new(plan: &Plan, findings: &[Finding], trace_hash: u64, note: String) -> Self {
        Self {
            format: FORMAT,
            note,
            commit: commit().to_string(),
            kinds: kinds_of(findings),
            trace_hash: fmt_hash(trace_hash),
            found: None,
            fix: None,
            run: plan.clone(),
        }
    }

    /// Parses a capsule's text and checks its run against the rules a draw enforces.
    pub fn parse(text: &str, path: &Path) -> Result<Self, PlanError> {
        let parse = |message: String| PlanError::Parse { path: path.to_path_buf(), message };
        let mut capsule: Capsule = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
        capsule.run.group = group_config(text).map_err(parse)?;
        if capsule.format != FORMAT {
            return Err(parse(format!("capsule format {} (this build reads {FORMAT})", capsule.format)));
        }
        capsule.run.check().map_err(|e| parse(e.to_string()))?;
        Ok(capsule)
    }

    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PlanError::Io { path: path.to_path_buf(), message: e.to_string() })?;
        Self::parse(&text, path)
    }

    /// The file's text: a comment saying how to replay it, then the fields.
    pub fn to_toml(&self) -> Result<String, PlanError> {
        let body = toml::to_string(self).map_err(|e| PlanError::Invalid(format!("capsule: {e}")))?;
        Ok(format!(
            "# Failure capsule (sim/capsule.rs, fault-plans/README.md): a whole run, drawn once.\n\
             # Replay: cargo sim replay --capsule <this file>   Shrink: cargo sim shrink <this file>\n{body}"
        ))
    }

    /// Writes the capsule to `path` (creating its directory).
    pub fn write(&self, path: &Path) -> Result<(), PlanError> {
        let io = |e: std::io::Error| PlanError::Io { path: path.to_path_buf(), message: e.to_string() };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(path, self.to_toml()?).map_err(io)
    }

    /// The run without its planted bugs (the control run of a planted capsule).
    pub fn without_planted(&self) -> Plan {
        let mut run = self.run.clone();
        run.planted.clear();
        run.expect.clear();
        run
    }

    /// How big the run is.
    pub fn size(&self) -> Size {
        let t = &self.run.topology;
        let joins = self
            .run
            .actions
            .iter()
            .filter(|a| matches!(a.item, crate::plan::Action::ConsumerJoin | crate::plan::Action::ProducerJoin))
            .count();
        Size {
            faults: self.run.faults.len(),
            actions: self.run.actions.len(),
            nodes: (t.coordinators + t.consumers + t.producers) as usize + joins,
            shards: t.shards,
            run_ms: self.run.durations.run_ms,
        }
    }
}

/// How big a capsule's run is (what shrinking reduces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    pub faults: usize,
    pub actions: usize,
    /// Coordinators, consumers and producers at the start, plus consumer and producer joins.
    pub nodes: usize,
    pub shards: u32,
    pub run_ms: u64,
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} faults, {} actions, {} nodes, {} shards, {:.1} simulated s",
            self.faults,
            self.actions,
            self.nodes,
            self.shards,
            self.run_ms as f64 / 1_000.0
        )
    }
}

/// The path of the capsule of `plan` and `seed` under `dir`.
pub fn path_for(dir: &Path, plan: &str, seed: u64) -> PathBuf {
    dir.join(format!("{plan}-{seed}.toml"))
}

/// The same plan with another draw order: scheduled entries and random kinds reversed. What a
/// (plan, seed) pair means changes with it; what a capsule replays must not (`capsule-check`).
pub fn reordered(spec: &PlanSpec) -> PlanSpec {
    let mut spec = spec.clone();
    spec.faults.reverse();
    spec.actions.reverse();
    if let Some(random) = spec.random.as_mut() {
        random.kinds.reverse();
        random.weights.reverse();
    }
    spec
}

/// Every `*.toml` file directly in `dir`, sorted (none when it does not exist).
pub fn files_in(dir: &Path) -> Result<Vec<PathBuf>, PlanError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| PlanError::Io { path: dir.to_path_buf(), message: e.to_string() })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests;
