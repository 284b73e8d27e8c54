//! `cargo sim shrink FILE`: reduces a failing capsule while the same violation kind still occurs.
//!
//! Each candidate is a smaller or simpler run, checked against the rules a draw enforces and then
//! run; it is accepted when its findings still include the kind being kept and no kind the
//! original run did not produce (a candidate that passes, or fails for another reason, is
//! rejected). Passes, repeated until one round accepts nothing or the run budget is spent:
//! drop faults, then actions (halves first, then smaller chunks, then one at a time:
//! delta debugging); tighten `heal_ms` and `run_ms` to what the schedule needs; remove the highest
//! consumer, producer or coordinator when nothing scheduled names it, and halve the shards; move
//! each fault earlier; halve each fault's integer parameters (durations included); simpler
//! settings (the datagram protocol, fewer keys, smaller reads, smaller `add-shards`).
//!
//! The result is a fixpoint of these passes (no candidate of a last round accepted), not a
//! minimal run; when the run budget (`--max-runs`) stops it first, it says so and the note of the
//! shrunk capsule records it.
//!
//! Owns: candidate generation and acceptance. Never changes the seed: the remaining randomness
//! (madsim's scheduler and network, each process's RNG) stays the one the capsule recorded.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{kinds_of, Capsule};
use crate::plan::node::Role;
use crate::plan::{Action, Fault, Plan, PlanError, Protocol};
use crate::runner::run_seed;

/// Shrinks the capsule at `path`; writes `<stem>-shrunk.toml` next to it. True when it wrote one.
pub fn shrink_file(path: &Path, kind: Option<String>, max_runs: usize) -> Result<bool, PlanError> {
    let capsule = Capsule::load(path)?;
    let original = run_seed(capsule.run.clone(), false);
    let kinds = kinds_of(&original.findings);
    let Some(key) = kind.or_else(|| capsule.kinds.first().cloned()).or_else(|| kinds.first().cloned()) else {
        println!("{}: the run produces no violation; nothing to shrink", path.display());
        return Ok(false);
    };
    if !kinds.contains(&key) {
        println!("{}: the run produces {kinds:?}, not {key}; nothing to shrink", path.display());
        return Ok(false);
    }
    println!("shrinking {} keeping {key} (the run produces {kinds:?}): {}", path.display(), capsule.size());
    let liveness_key = original.findings.iter().any(|f| f.kind == key && f.checker == "liveness");
    let mut shrinker = Shrinker::new(capsule.run.clone(), key.clone(), kinds, liveness_key, max_runs);
    let fixpoint = shrinker.shrink();
    let shrunk = run_seed(shrinker.best.clone(), true);
    let before = capsule.size();
    let stopped = if fixpoint { "" } else { ", stopped by the run budget" };
    let note = format!(
        "shrunk from {} keeping {key} in {} candidate runs{stopped} (was {before}): {}",
        path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        shrinker.runs,
        capsule.note
    );
    let mut out = Capsule::new(&shrinker.best, &shrunk.findings, shrunk.trace_hash, note);
    (out.found, out.fix) = (capsule.found, capsule.fix);
    let out_path = shrunk_path(path);
    out.write(&out_path)?;
    println!("before: {before}\nafter:  {} ({} candidate runs)", out.size(), shrinker.runs);
    println!("kinds {:?}; written {}", out.kinds, out_path.display());
    if !fixpoint {
        println!(
            "run budget spent (--max-runs {max_runs}): the shrinking stopped before a round accepted nothing, so a \
             smaller run may fail the same way; shrink {} again, or with a larger --max-runs",
            out_path.display()
        );
    }
    Ok(true)
}

/// `<dir>/<stem>-shrunk.toml`.
fn shrunk_path(path: &Path) -> PathBuf {
    let stem = path.file_stem().map_or_else(|| "capsule".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-shrunk.toml"))
}

/// Time steps shorter than this are not tried (each would cost a run for almost nothing).
const STEP_MS_MIN: u64 = 500;

struct Shrinker {
    best: Plan,
    key: String,
    /// Kinds a candidate may produce: the original run's.
    allowed: Vec<String>,
    /// The kept kind is a liveness kind: the liveness bound is the checker's yardstick, not a
    /// size to shrink.
    liveness_key: bool,
    runs: usize,
    max_runs: usize,
    /// A candidate was not run because the budget was spent: the result is no fixpoint.
    budget_spent: bool,
}

impl Shrinker {
    fn new(best: Plan, key: String, allowed: Vec<String>, liveness_key: bool, max_runs: usize) -> Self {
        Self { best, key, allowed, liveness_key, runs: 0, max_runs, budget_spent: false }
    }

    /// Runs rounds of every pass; true when the last one accepted nothing with no candidate left
    /// unrun for the budget (a fixpoint of the passes), false when the budget stopped it.
    fn shrink(&mut self) -> bool {
        let mut round = 0;
        loop {
            round += 1;
            let runs = self.runs;
            let mut changed = self.drop_faults();
            changed |= self.drop_actions();
            changed |= self.tighten_durations();
            changed |= self.reduce_topology();
            changed |= self.move_faults_earlier();
            changed |= self.halve_fault_params();
            changed |= self.simplify_params();
            println!("round {round}: {} candidate runs, {}", self.runs - runs, self.size());
            if !changed {
                return !self.budget_spent;
            }
            if self.runs >= self.max_runs {
                return false;
            }
        }
    }

    fn size(&self) -> super::Size {
        Capsule::new(&self.best, &[], 0, String::new()).size()
    }

    /// Runs the candidate when it is a valid plan; keeps it when it still fails as required.
    fn try_candidate(&mut self, what: &str, mut candidate: Plan) -> bool {
        candidate.faults.sort_by_key(|f| f.at_ms);
        candidate.actions.sort_by_key(|a| a.at_ms);
        if candidate == self.best || candidate.check().is_err() {
            return false;
        }
        if self.runs >= self.max_runs {
            self.budget_spent = true;
            return false;
        }
        self.runs += 1;
        let kinds = kinds_of(&run_seed(candidate.clone(), false).findings);
        let mut accepted = kinds.contains(&self.key) && kinds.iter().all(|k| self.allowed.contains(k));
        if accepted && !candidate.planted.is_empty() {
            // A planted capsule must fail for its bug: the candidate without it must be clean
            // (a run cut too short fails liveness with or without any bug).
            let mut control = candidate.clone();
            control.planted.clear();
            self.runs += 1;
            let control_kinds = kinds_of(&run_seed(control, false).findings);
            if !control_kinds.is_empty() {
                println!("  rejected: {what} (fails without the planted bug too: {control_kinds:?})");
                accepted = false;
            }
        }
        if accepted {
            self.best = candidate;
            println!("  accepted: {what} -> {} {kinds:?}", self.size());
        }
        accepted
    }

    /// Delta debugging over the faults: chunks of half the list, then smaller, then one by one.
    fn drop_faults(&mut self) -> bool {
        let mut changed = false;
        let mut chunk = self.best.faults.len().div_ceil(2);
        while chunk >= 1 && !self.best.faults.is_empty() {
            let mut start = 0;
            while start < self.best.faults.len() {
                let end = (start + chunk).min(self.best.faults.len());
                let mut candidate = self.best.clone();
                let dropped: Vec<String> =
                    candidate.faults.drain(start..end).map(|f| format!("{} {}", f.origin, f.item.kind())).collect();
                if self.try_candidate(&format!("drop faults {}", dropped.join(", ")), candidate) {
                    changed = true;
                } else {
                    start = end;
                }
            }
            chunk /= 2;
        }
        changed
    }

    fn drop_actions(&mut self) -> bool {
        let mut changed = false;
        let mut chunk = self.best.actions.len().div_ceil(2);
        while chunk >= 1 && !self.best.actions.is_empty() {
            let mut start = 0;
            while start < self.best.actions.len() {
                let end = (start + chunk).min(self.best.actions.len());
                let mut candidate = self.best.clone();
                let dropped: Vec<String> =
                    candidate.actions.drain(start..end).map(|a| format!("{} {}", a.origin, a.item)).collect();
                if self.try_candidate(&format!("drop actions {}", dropped.join(", ")), candidate) {
                    changed = true;
                } else {
                    start = end;
                }
            }
            chunk /= 2;
        }
        changed
    }

    /// `heal_ms` down to the end of the last fault or action, `run_ms` down to what the liveness
    /// window needs after it: all the way first, then halfway, a quarter of the way.
    fn tighten_durations(&mut self) -> bool {
        let changed = self.tighten_heal_and_run();
        let d = self.best.durations;
        let bound_ms = d.liveness_bound_ms / 2;
        if bound_ms == 0 || self.liveness_key {
            return changed;
        }
        // A shorter liveness bound, the run shorter by as much.
        let mut candidate = self.best.clone();
        candidate.durations.liveness_bound_ms = bound_ms;
        candidate.durations.run_ms = d.run_ms - (d.liveness_bound_ms - bound_ms);
        candidate.durations.drain_ms = d.drain_ms.min(candidate.durations.run_ms / 2);
        let what = format!(
            "liveness_bound_ms {} -> {bound_ms}, run_ms -> {}",
            d.liveness_bound_ms, candidate.durations.run_ms
        );
        self.try_candidate(&what, candidate) || changed
    }

    fn tighten_heal_and_run(&mut self) -> bool {
        let d = self.best.durations;
        let fault_end = self.best.faults.iter().map(|f| f.at_ms + f.item.healed_after_ms()).max().unwrap_or(0);
        let action_end = self.best.actions.iter().map(|a| a.at_ms + 1).max().unwrap_or(0);
        let heal_min = fault_end.max(action_end).max(1_000);
        let run_min = heal_min + d.liveness_bound_ms + 2 * self.best.group.heartbeat_interval_ms;
        if d.heal_ms.saturating_sub(heal_min) < STEP_MS_MIN && d.run_ms.saturating_sub(run_min) < STEP_MS_MIN {
            return false;
        }
        for (num, den) in [(1, 1), (1, 2), (1, 4)] {
            let heal_ms = d.heal_ms - (d.heal_ms.saturating_sub(heal_min)) * num / den;
            let run_ms = d.run_ms - (d.run_ms.saturating_sub(run_min)) * num / den;
            let mut candidate = self.best.clone();
            candidate.durations.heal_ms = heal_ms;
            candidate.durations.run_ms = run_ms;
            candidate.durations.drain_ms = d.drain_ms.min(run_ms / 2);
            if self.try_candidate(
                &format!("run_ms {} -> {run_ms}, heal_ms {} -> {heal_ms}", d.run_ms, d.heal_ms),
                candidate,
            ) {
                return true;
            }
        }
        false
    }

    /// The highest-numbered initial node of a role goes when nothing scheduled names it or any
    /// node numbered after it (a consumer-join's node would be renumbered).
    fn reduce_topology(&mut self) -> bool {
        let mut changed = false;
        for role in [Role::Consumer, Role::Producer, Role::Coordinator] {
            loop {
                let t = self.best.topology;
                let (count, min) = match role {
                    Role::Consumer => (t.consumers, 1),
                    Role::Producer => (t.producers, 0),
                    _ => (t.coordinators, 1),
                };
                let named = self.named(role);
                if count <= min || named.range(count..).next().is_some() {
                    break;
                }
                let mut candidate = self.best.clone();
                match role {
                    Role::Consumer => candidate.topology.consumers -= 1,
                    Role::Producer => candidate.topology.producers -= 1,
                    _ => candidate.topology.coordinators -= 1,
                }
                if !self.try_candidate(&format!("{}s {count} -> {}", role.name(), count - 1), candidate) {
                    break;
                }
                changed = true;
            }
        }
        let shards = self.best.topology.shards;
        if shards > 1 {
            let mut candidate = self.best.clone();
            candidate.topology.shards = shards.div_ceil(2);
            changed |= self.try_candidate(&format!("shards {shards} -> {}", shards.div_ceil(2)), candidate);
        }
        changed
    }

    /// Indices of the nodes of `role` that faults and actions name.
    fn named(&self, role: Role) -> BTreeSet<u32> {
        let faults = self.best.faults.iter().flat_map(|f| f.item.nodes());
        let actions = self.best.actions.iter().filter_map(|a| a.item.node());
        faults.chain(actions).filter(|n| n.role == role).map(|n| n.index).collect()
    }

    /// Each fault at half its start time while that is accepted, then at three quarters once.
    /// Moves shorter than [`STEP_MS_MIN`] are not worth a run.
    fn move_faults_earlier(&mut self) -> bool {
        let mut changed = false;
        let origins: Vec<_> = self.best.faults.iter().map(|f| f.origin).collect();
        for origin in origins {
            while self.move_fault(origin, 1, 2) {
                changed = true;
            }
            changed |= self.move_fault(origin, 3, 4);
        }
        changed
    }

    /// The fault from `origin` at `num / den` of its start time, if that is a move worth a run.
    fn move_fault(&mut self, origin: crate::plan::Origin, num: u64, den: u64) -> bool {
        let mut candidate = self.best.clone();
        let Some(fault) = candidate.faults.iter_mut().find(|f| f.origin == origin) else { return false };
        let at_ms = fault.at_ms;
        let at = at_ms * num / den;
        if at_ms - at < STEP_MS_MIN {
            return false;
        }
        fault.at_ms = at;
        let what = format!("{origin} {} at {at_ms} -> {at} ms", fault.item.kind());
        self.try_candidate(&what, candidate)
    }

    /// Simpler settings: the datagram protocol instead of HTTP, fewer message keys, smaller reads,
    /// fewer shards per `add-shards`.
    fn simplify_params(&mut self) -> bool {
        let mut changed = false;
        if self.best.tuning.protocol == Protocol::Http {
            let mut candidate = self.best.clone();
            candidate.tuning.protocol = Protocol::Rpc;
            changed |= self.try_candidate("protocol http -> rpc", candidate);
        }
        let w = self.best.workload;
        if w.keys > 1 {
            let mut candidate = self.best.clone();
            candidate.workload.keys = w.keys.div_ceil(2);
            changed |= self.try_candidate(&format!("keys {} -> {}", w.keys, w.keys.div_ceil(2)), candidate);
        }
        if w.read_count > 1 {
            let mut candidate = self.best.clone();
            candidate.workload.read_count = w.read_count.div_ceil(2);
            let what = format!("read_count {} -> {}", w.read_count, w.read_count.div_ceil(2));
            changed |= self.try_candidate(&what, candidate);
        }
        for i in 0..self.best.actions.len() {
            // Re-read each time: an accepted candidate re-sorted the actions.
            let Some(Action::AddShards { add }) = self.best.actions.get(i).map(|a| a.item.clone()) else { continue };
            if add > 1 {
                let mut candidate = self.best.clone();
                candidate.actions[i].item = Action::AddShards { add: add.div_ceil(2) };
                changed |= self.try_candidate(&format!("add-shards +{add} -> +{}", add.div_ceil(2)), candidate);
            }
        }
        changed
    }

    /// Each integer parameter of each fault (durations, delays, counts) halved.
    fn halve_fault_params(&mut self) -> bool {
        let mut changed = false;
        let origins: Vec<_> = self.best.faults.iter().map(|f| f.origin).collect();
        for origin in origins {
            let table = |plan: &Plan| {
                let fault = plan.faults.iter().find(|f| f.origin == origin)?;
                match toml::Value::try_from(&fault.item) {
                    Ok(toml::Value::Table(table)) => Some(table),
                    _ => None,
                }
            };
            let names: Vec<String> = table(&self.best).map(|t| t.keys().cloned().collect()).unwrap_or_default();
            for name in names {
                // Re-read: an accepted halving of another parameter changed the fault.
                let Some(mut current) = table(&self.best) else { break };
                let Some(n) = current.get(&name).and_then(toml::Value::as_integer).filter(|n| *n > 1) else {
                    continue;
                };
                current.insert(name.clone(), toml::Value::Integer(n / 2));
                let Ok(fault) = toml::Value::Table(current).try_into::<Fault>() else { continue };
                let mut candidate = self.best.clone();
                let Some(slot) = candidate.faults.iter_mut().find(|f| f.origin == origin) else { continue };
                slot.item = fault;
                let what = format!("{origin} {} {name} {n} -> {}", slot.item.kind(), n / 2);
                changed |= self.try_candidate(&what, candidate);
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests;
