//! Running capsules: replay one (`run --capsule`, `replay --capsule`), write one from a seed
//! (`capsule`), and check that a capsule replays exactly the run it recorded (`capsule-check`).

use std::path::{Path, PathBuf};

use super::{fmt_hash, kinds_of, path_for, reordered, Capsule};
use crate::plan::{load_plan, Plan, PlanError};
use crate::runner::{run_seed, SeedOutcome};

/// Loads a capsule and runs it with the full trace; prints the findings and whether the trace is
/// the recorded one. `write_trace`: keep the trace in target/sim-traces/<file stem>.log. True when
/// the run has no finding.
pub fn run_file(path: &Path, without_planted: bool, write_trace: bool) -> Result<bool, PlanError> {
    let capsule = Capsule::load(path)?;
    let plan = if without_planted { capsule.without_planted() } else { capsule.run.clone() };
    println!("capsule {} (recorded at {}): {}", path.display(), capsule.commit, capsule.note);
    print!("{}", plan.describe());
    let outcome = run_seed(plan, true);
    for finding in &outcome.findings {
        println!("  {finding}");
    }
    if write_trace {
        let stem = path.file_stem().map_or_else(|| "capsule".into(), |s| s.to_string_lossy().into_owned());
        let control = if without_planted { "-without-planted" } else { "" };
        match crate::cli::write_trace(&format!("capsule-{stem}{control}-{}", outcome.seed), &outcome) {
            Ok(trace) => println!("trace ({} events): {}", outcome.trace.len(), trace.display()),
            Err(e) => println!("trace not written: {e}"),
        }
    }
    println!("kinds {:?} (recorded {:?})", kinds_of(&outcome.findings), capsule.kinds);
    if !without_planted {
        println!("{}", hash_verdict(&capsule, &outcome));
    }
    Ok(outcome.findings.is_empty())
}

/// Whether a replay's trace is the recorded one.
pub fn hash_verdict(capsule: &Capsule, outcome: &SeedOutcome) -> String {
    let hash = fmt_hash(outcome.trace_hash);
    if hash == capsule.trace_hash {
        format!("trace hash {hash}: the recorded run, exactly")
    } else {
        format!(
            "trace hash {hash} differs from the recorded {} (recorded at {}, this build is {})",
            capsule.trace_hash,
            capsule.commit,
            super::commit()
        )
    }
}

/// `capsule <plan> <seed>`: runs the seed with the full trace and writes its capsule.
pub fn write_seed(
    dir: &Path,
    name: &str,
    seed: u64,
    out: Option<PathBuf>,
    note: String,
    found: Option<String>,
    fix: Option<String>,
) -> Result<bool, PlanError> {
    let plan = load_plan(dir, name)?.draw(seed)?;
    let outcome = run_seed(plan.clone(), true);
    let note = if note.is_empty() { format!("`cargo sim capsule {name} {seed}`") } else { note };
    let mut capsule = Capsule::new(&plan, &outcome.findings, outcome.trace_hash, note);
    capsule.found = found;
    capsule.fix = fix;
    let path = out.unwrap_or_else(|| path_for(&super::default_dir(), name, seed));
    capsule.write(&path)?;
    println!("{} kinds {:?} trace hash {}", path.display(), capsule.kinds, capsule.trace_hash);
    Ok(true)
}

/// What changing a plan's draw order did to the run a seed means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReorderVerdict {
    /// The reordered plan drew another run, and its trace differs: the capsule, which still
    /// replays the recorded run, shows it never reads the plan.
    Differs,
    /// The reordered plan drew the same run (at most one fault and one action, no random kinds):
    /// there is nothing to reorder, and the second half of the check does not apply.
    NothingToReorder,
    /// The reordered plan drew another run with the same trace: the reordering showed nothing.
    SameRun,
}

/// The verdict of the reordering half of `capsule-check` for one seed.
pub fn reorder_verdict(plan: &Plan, redrawn: &Plan, trace_hash: u64, redrawn_trace_hash: u64) -> ReorderVerdict {
    if redrawn == plan {
        ReorderVerdict::NothingToReorder
    } else if redrawn_trace_hash != trace_hash {
        ReorderVerdict::Differs
    } else {
        ReorderVerdict::SameRun
    }
}

/// `capsule-check <plan> --seeds A..B`: for each seed, the capsule of (plan, seed), written and
/// read back, replays the trace and findings of (plan, seed); the plan with its draw order changed
/// draws another run for the seed (unless there is nothing to reorder), and the capsule still
/// replays the recorded one.
pub fn check_seeds(dir: &Path, name: &str, seeds: (u64, u64)) -> Result<bool, PlanError> {
    let spec = load_plan(dir, name)?;
    let mut ok = true;
    for seed in seeds.0..seeds.1 {
        let plan = spec.draw(seed)?;
        let direct = run_seed(plan.clone(), true);
        let path = path_for(&super::default_dir().join("check"), name, seed);
        Capsule::new(&plan, &direct.findings, direct.trace_hash, format!("capsule-check {name} {seed}"))
            .write(&path)?;
        let redrawn = reordered(&spec).draw(seed)?;
        let moved = run_seed(redrawn.clone(), true);
        let capsule = Capsule::load(&path)?;
        let replayed = run_seed(capsule.run.clone(), true);
        let same = replayed.trace_hash == direct.trace_hash && replayed.findings == direct.findings;
        let reorder = reorder_verdict(&plan, &redrawn, direct.trace_hash, moved.trace_hash);
        println!(
            "{name} seed {seed}: run {} | capsule replay {} ({}) | reordered plan {} ({})",
            fmt_hash(direct.trace_hash),
            fmt_hash(replayed.trace_hash),
            if same { "same run" } else { "DIFFERENT RUN" },
            fmt_hash(moved.trace_hash),
            match reorder {
                ReorderVerdict::Differs => "another run, as expected",
                ReorderVerdict::NothingToReorder => "n/a: nothing to reorder, the plan draws the same run",
                ReorderVerdict::SameRun => "SAME RUN: the reordering changed nothing",
            },
        );
        ok &= same && reorder != ReorderVerdict::SameRun;
    }
    Ok(ok)
}
