//! The `sim` command line: run plans over seed ranges, replay one seed with a full trace, show a
//! drawn plan, run the planted-bug and regression suites. Prints the summary table and, for every
//! failing seed, its drawn parameters, its findings, where its trace was written and
//! `REPRODUCE WITH: <command>` (`reproduce`: a command that runs that seed again as it ran). Draws
//! one run as an HTML timeline.

mod reproduce;

pub(crate) use reproduce::{child_args, reproduce_command};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::bench;
use crate::capsule::{self, Capsule};
use crate::checkers::{count_by_kind, Finding};
use crate::plan::{default_plan_dir, load_plan, plan_names, Plan, PlanError, PlanSource, PlanSpec};
use crate::records::{fmt_us, render_trace, Records};
use crate::regressions;
use crate::runner::{run_seed, sim_group, SeedOutcome};
use crate::sweep;
use crate::timeline::{self, TimelineInput};

#[derive(Parser)]
#[command(name = "sim", about = "Deterministic simulation of the Redis Stream Coordinator (madsim)")]
struct Cli {
    /// Directory of fault plans.
    #[arg(long, global = true, default_value_os_t = default_plan_dir())]
    plans: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a plan (or `all`: every plan but planted-*) over a range of seeds, or one capsule.
    /// Every failing seed writes a capsule to target/sim-capsules/<plan>-<seed>.toml.
    Run {
        #[arg(required_unless_present = "capsule")]
        plan: Option<String>,
        /// Run this capsule (a whole recorded run) instead of a plan's seeds. It runs once: of the
        /// flags below only `--without-planted` applies, and the others are refused.
        #[arg(long, conflicts_with_all = ["plan", "seeds", "check_determinism", "verbose", "jobs", "json"])]
        capsule: Option<PathBuf>,
        /// Seeds `A..B` (B excluded) or a single seed.
        #[arg(long, default_value = "0..10", value_parser = parse_seeds)]
        seeds: (u64, u64),
        /// Run every seed twice and compare event-trace hashes.
        #[arg(long)]
        check_determinism: bool,
        /// Print every seed's drawn parameters, not only failing ones.
        #[arg(long)]
        verbose: bool,
        /// Switch the plan's planted bugs off (the control run of a planted plan: it must pass).
        #[arg(long)]
        without_planted: bool,
        /// Run seeds in this many child processes (1: in this process, one after the other).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        jobs: u16,
        /// Also print one machine-readable `SIMPLAN {json}` line per plan (for `bench`).
        #[arg(long, hide = true)]
        json: bool,
    },
    /// A child of `run --jobs N`: run one chunk of seeds, one `SIMSEED {json}` line per seed.
    #[command(hide = true)]
    Chunk {
        plan: String,
        #[arg(long, value_parser = parse_seeds)]
        seeds: (u64, u64),
        #[arg(long)]
        check_determinism: bool,
        #[arg(long)]
        verbose: bool,
        #[arg(long)]
        without_planted: bool,
        #[arg(long)]
        capsules: bool,
    },
    /// Run one seed (or one capsule) with the full trace, written to
    /// target/sim-traces/<plan>-<seed>.log.
    Replay {
        #[arg(required_unless_present = "capsule")]
        plan: Option<String>,
        #[arg(required_unless_present = "capsule")]
        seed: Option<u64>,
        /// Replay this capsule: its recorded run, without any plan file or draw.
        #[arg(long, conflicts_with_all = ["plan", "seed"])]
        capsule: Option<PathBuf>,
        /// Switch the capsule's planted bugs off (its control run).
        #[arg(long, requires = "capsule")]
        without_planted: bool,
    },
    /// Write the capsule of one seed of a plan (whether it fails or not), e.g. to keep it as a
    /// regression.
    Capsule {
        plan: String,
        seed: u64,
        /// Where to write it (default: target/sim-capsules/<plan>-<seed>.toml).
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long, default_value = "")]
        note: String,
        /// Regression capsules: when and what the seed found, and what fixed it.
        #[arg(long)]
        found: Option<String>,
        #[arg(long)]
        fix: Option<String>,
    },
    /// Shrink a failing capsule while the same violation kind still occurs; writes
    /// <name>-shrunk.toml next to it.
    Shrink {
        file: PathBuf,
        /// The kind to keep (default: the capsule's first recorded kind).
        #[arg(long)]
        kind: Option<String>,
        /// Stop after this many candidate runs.
        #[arg(long, default_value_t = 400)]
        max_runs: usize,
    },
    /// Check capsules against the runs they record: for each seed, the capsule of (plan, seed)
    /// must replay with the trace hash and findings of (plan, seed), and still after the plan's
    /// draw order is changed (which changes the run (plan, seed) means; n/a for a plan with
    /// nothing to reorder).
    CapsuleCheck {
        plan: String,
        #[arg(long, default_value = "0..2", value_parser = parse_seeds)]
        seeds: (u64, u64),
    },
    /// Print the parameters a plan draws for a seed.
    Show { plan: String, seed: u64 },
    /// Run one seed and draw it as one HTML page: target/sim-timelines/<plan>-<seed>.html
    /// (`-without-planted.html` for a control run).
    Timeline {
        plan: String,
        seed: u64,
        /// Switch the plan's planted bugs off.
        #[arg(long)]
        without_planted: bool,
    },
    /// Run every planted-bug plan; each must be caught on at least one seed.
    Planted {
        #[arg(long, default_value = "0..20", value_parser = parse_seeds)]
        seeds: (u64, u64),
        /// Also report every caught seed and write its capsule (slower: each is re-run traced).
        #[arg(long)]
        capsules: bool,
    },
    /// Replay every capsule in fault-plans/capsules/ (each must pass) and
    /// fault-plans/capsules/planted/ (each must fail with its kind, and pass without its bug).
    Regressions,
    /// Run every plan (not planted-*) over the seeds and print what the runs reached, per plan:
    /// statuses, error codes, decision rules recorded, faults, rare situations. Fails when an item
    /// of fault-plans/must-reach.toml is never reached, or a seed found a violation.
    Coverage {
        #[arg(long, default_value = "0..5", value_parser = parse_seeds)]
        seeds: (u64, u64),
    },
    /// Time the simulator (sim/wall) on some plans, against another sim binary if given.
    Bench {
        /// Plans to time, comma-separated.
        #[arg(value_name = "PLANS", default_value = "standard,swarm")]
        which: String,
        #[arg(long, default_value = "0..10", value_parser = parse_seeds)]
        seeds: (u64, u64),
        /// Another build of this simulator (e.g. from an older commit) to compare with.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// List the plans.
    List,
}

fn parse_seeds(s: &str) -> Result<(u64, u64), String> {
    let parse = |v: &str| v.trim().parse::<u64>().map_err(|e| format!("bad seed {v:?}: {e}"));
    match s.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (parse(a)?, parse(b)?);
            if a < b {
                Ok((a, b))
            } else {
                Err(format!("empty seed range {s}"))
            }
        }
        None => {
            let a = parse(s)?;
            // The range's end is exclusive: u64::MAX has none (`a + 1` wrapped to the empty MAX..0).
            a.checked_add(1).map(|b| (a, b)).ok_or_else(|| format!("seed {a} too large (the last is {})", u64::MAX - 1))
        }
    }
}

/// Where replays and failing seeds write their traces.
fn trace_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/sim-traces"))
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { capsule: Some(path), without_planted, .. } => {
            capsule::replay::run_file(&path, without_planted, false)
        }
        Command::Run { plan, seeds, check_determinism, verbose, without_planted, jobs, json, .. } => {
            let flags = RunFlags { check_determinism, verbose, without_planted, capsules: true };
            let plan = plan.unwrap_or_default();
            run_plans(&cli.plans, &plan, seeds, flags, usize::from(jobs), json)
        }
        Command::Chunk { plan, seeds, check_determinism, verbose, without_planted, capsules } => {
            let flags = RunFlags { check_determinism, verbose, without_planted, capsules };
            load_spec(&cli.plans, &plan, flags).and_then(|spec| sweep::run_chunk(&spec, seeds, flags))
        }
        Command::Replay { capsule: Some(path), without_planted, .. } => {
            capsule::replay::run_file(&path, without_planted, true)
        }
        Command::Replay { plan, seed, .. } => replay(&cli.plans, &plan.unwrap_or_default(), seed.unwrap_or_default()),
        Command::Capsule { plan, seed, out, note, found, fix } => {
            capsule::replay::write_seed(&cli.plans, &plan, seed, out, note, found, fix)
        }
        Command::Shrink { file, kind, max_runs } => capsule::shrink::shrink_file(&file, kind, max_runs),
        Command::CapsuleCheck { plan, seeds } => capsule::replay::check_seeds(&cli.plans, &plan, seeds),
        Command::Timeline { plan, seed, without_planted } => timeline(&cli.plans, &plan, seed, without_planted),
        Command::Show { plan, seed } => load_plan(&cli.plans, &plan).and_then(|s| s.draw(seed)).map(|p| {
            print!("{}", p.describe());
            true
        }),
        Command::Planted { seeds, capsules } => planted(&cli.plans, seeds, capsules),
        Command::Regressions => regressions::run(&cli.plans),
        Command::Coverage { seeds } => coverage(&cli.plans, seeds),
        Command::Bench { which, seeds, baseline } => bench::bench(&cli.plans, &which, seeds, baseline),
        Command::List => plan_names(&cli.plans).map(|names| {
            names.iter().for_each(|n| println!("{n}"));
            true
        }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Aggregate of one plan over its seeds.
#[derive(Default)]
pub struct PlanSummary {
    pub name: String,
    pub seeds: (u64, u64),
    pub failed: Vec<u64>,
    pub kinds: BTreeMap<&'static str, usize>,
    pub simulated: Duration,
    pub wall: Duration,
    pub silent_split_max_us: Option<u64>,
    /// What split brains did (measured), and operations that ran on a fence only the other side
    /// of a split brain recorded.
    pub split_brain: (crate::checkers::SplitBrainCounts, usize),
    pub paused_overlaps: usize,
    pub backlog_max: usize,
    pub from_dropped_writes: usize,
    pub silent_loss_overlaps: usize,
    pub stranded: usize,
    pub stranded_unprovable: usize,
    pub unprovable_version_reuses: usize,
    pub lost_version_answers: usize,
    pub delivered_never_processed_max: usize,
    pub correction_rounds_by_cause: BTreeMap<&'static str, usize>,
    /// Fenced operations that ran, stale ones refused (`FENCED`), stale ones that ran after a loss.
    pub fences: (usize, u64, usize),
    /// What the seeds reached, summed (`coverage`).
    pub coverage: crate::coverage::Coverage,
    /// The first seed (in run order) that produced each violation kind.
    pub first_seed_by_kind: BTreeMap<&'static str, u64>,
    /// Capsules the failing seeds wrote (in-process runs only; the sweep reads its children's).
    pub capsules: Vec<PathBuf>,
}

impl PlanSummary {
    pub(crate) fn add(&mut self, outcome: &SeedOutcome) {
        if !outcome.findings.is_empty() {
            self.failed.push(outcome.seed);
        }
        for (kind, n) in count_by_kind(&outcome.findings) {
            *self.kinds.entry(kind).or_insert(0) += n;
            self.first_seed_by_kind.entry(kind).or_insert(outcome.seed);
        }
        self.simulated += outcome.simulated;
        self.wall += outcome.wall;
        let m = &outcome.measurements;
        self.silent_split_max_us = self.silent_split_max_us.max(m.silent_rollback_split_us);
        self.split_brain.0.add(&m.split_brain);
        self.split_brain.1 += m.fences.stale_across_split_brain;
        self.paused_overlaps += m.paused_processing_overlaps;
        self.backlog_max = self.backlog_max.max(m.backlog_entries);
        self.from_dropped_writes += m.responses_from_dropped_writes;
        self.silent_loss_overlaps += m.silent_loss_processing_overlaps;
        self.stranded += m.stranded_entries;
        self.stranded_unprovable += m.stranded_unprovable_entries;
        self.unprovable_version_reuses += m.unprovable_version_reuses;
        self.lost_version_answers += m.lost_version_answers;
        self.delivered_never_processed_max = self.delivered_never_processed_max.max(m.delivered_never_processed);
        for (item, n) in &outcome.coverage {
            *self.coverage.entry(item.clone()).or_insert(0) += n;
        }
        self.fences.0 += m.fences.fenced_ok;
        self.fences.1 += m.fences.refused;
        self.fences.2 += m.fences.stale_after_loss;
        for (cause, n) in &m.correction_rounds_by_cause {
            *self.correction_rounds_by_cause.entry(cause).or_insert(0) += n;
        }
    }
}

/// Runs seeds of one plan; prints failing seeds as they happen. `expect` is the planted plan's
/// list of kinds (failures of those kinds are expected, not reported as failures).
pub fn run_plan(
    spec: &PlanSpec,
    seeds: (u64, u64),
    check_determinism: bool,
    verbose: bool,
) -> Result<PlanSummary, PlanError> {
    let flags = RunFlags { check_determinism, verbose, ..RunFlags::default() };
    run_plan_with(spec, seeds, flags, &mut |_| {})
}

/// [`run_plan`], handing every seed's outcome to `on_seed` once it is checked and reported.
/// Every failing seed is reported (trace and capsule written) unless the plan expects failures
/// (planted bugs) and `flags.capsules` is off.
pub fn run_plan_with(
    spec: &PlanSpec,
    seeds: (u64, u64),
    flags: RunFlags,
    on_seed: &mut dyn FnMut(&SeedOutcome),
) -> Result<PlanSummary, PlanError> {
    let RunFlags { check_determinism, verbose, .. } = flags;
    let mut summary = PlanSummary { name: spec.name.clone(), seeds, ..PlanSummary::default() };
    for seed in seeds.0..seeds.1 {
        let plan = spec.draw(seed)?;
        if verbose {
            print!("{}", plan.describe());
        }
        let description = plan.describe();
        // The determinism check compares the full traces (every store call and heartbeat).
        let mut outcome = run_seed(plan.clone(), check_determinism);
        if check_determinism {
            let again = run_seed(plan.clone(), true);
            if again.trace_hash != outcome.trace_hash || again.findings != outcome.findings {
                outcome.findings.push(Finding {
                    checker: "runner",
                    kind: NONDETERMINISM,
                    at_us: 0,
                    detail: format!("trace hash {:016x} then {:016x}", outcome.trace_hash, again.trace_hash),
                });
            }
        }
        summary.add(&outcome);
        if !outcome.findings.is_empty() && (spec.expect.is_empty() || flags.capsules) {
            let failure = Failure { source: spec.source(), name: &spec.name, flags };
            summary.capsules.extend(report_failure(&failure, &plan, &description, &outcome));
        }
        on_seed(&outcome);
    }
    Ok(summary)
}

/// The finding of `--check-determinism` when two runs of a seed differ. No single run produces
/// it, so no capsule (one run, replayed once) can show it.
const NONDETERMINISM: &str = "nondeterminism";

/// Which run failed: the plan (its file and name) and the flags it ran with.
struct Failure<'a> {
    source: PlanSource,
    name: &'a str,
    flags: RunFlags,
}

/// Prints a failing seed's report and writes its trace and capsule; returns the capsule's path.
fn report_failure(failure: &Failure<'_>, plan: &Plan, description: &str, outcome: &SeedOutcome) -> Option<PathBuf> {
    let name = failure.name;
    println!("\nFAILED {name} seed {}", outcome.seed);
    print!("{description}");
    for finding in outcome.findings.iter().take(20) {
        println!("  {finding}");
    }
    if outcome.findings.len() > 20 {
        println!("  ... and {} more", outcome.findings.len() - 20);
    }
    // Re-run with the full trace (the run is deterministic) and keep it.
    let verbose = run_seed(plan.clone(), true);
    write_failure_files(failure, plan, outcome, &verbose)
}

/// Writes a failing seed's trace and capsule from `verbose`, its re-run with the full trace, and
/// prints the command that reproduces it; returns the capsule's path. A capsule that would record
/// a passing run (the failure was only that two runs differed) is not written.
fn write_failure_files(
    failure: &Failure<'_>,
    plan: &Plan,
    outcome: &SeedOutcome,
    verbose: &SeedOutcome,
) -> Option<PathBuf> {
    let name = failure.name;
    let one_run: Vec<&Finding> = outcome.findings.iter().filter(|f| f.kind != NONDETERMINISM).collect();
    let nondeterministic = one_run.len() < outcome.findings.len();
    if !verbose.findings.iter().eq(one_run.iter().copied()) {
        println!("  WARNING: the re-run with the full trace found something else (nondeterminism?)");
    }
    // A control run (planted bugs off) gets its own file names: the planted run of the same seed
    // writes its trace and capsule under the plain ones.
    let stem = reproduce::run_stem(name, outcome.seed, failure.flags.without_planted);
    match write_trace(&stem, verbose) {
        Ok(path) => println!("  trace: {}", path.display()),
        Err(e) => println!("  trace not written: {e}"),
    }
    let command = reproduce::reproduce_command(&failure.source, outcome.seed, failure.flags);
    let first = outcome.findings.first().map(ToString::to_string).unwrap_or_default();
    let note = format!("found by `{command}`: {first}");
    let capsule = Capsule::new(plan, &verbose.findings, verbose.trace_hash, note);
    let path = capsule::default_dir().join(format!("{stem}.toml"));
    if nondeterministic {
        println!(
            "  {NONDETERMINISM}: a capsule records one run and replays it once, so it cannot show that two runs \
             of this seed differ; the command below runs the seed twice and compares"
        );
    }
    let written = if verbose.findings.is_empty() {
        println!(
            "  capsule not written: the re-run with the full trace found nothing, and would read as a passing run"
        );
        None
    } else {
        match capsule.write(&path) {
            Ok(()) => {
                println!("{CAPSULE_LINE_PREFIX}{}", path.display());
                Some(path)
            }
            Err(e) => {
                println!("  capsule not written: {e}");
                None
            }
        }
    };
    println!("REPRODUCE WITH: {command}");
    written
}

/// The line a failure report names its capsule with (the sweep's summary collects them).
pub const CAPSULE_LINE_PREFIX: &str = "  capsule: ";

/// Writes a run's trace to `target/sim-traces/<stem>.log` (and its metadata history next to it).
pub(crate) fn write_trace(stem: &str, outcome: &SeedOutcome) -> std::io::Result<PathBuf> {
    let dir = trace_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{stem}.log"));
    let mut text = render_trace(&outcome.trace);
    for finding in &outcome.findings {
        text.push_str(&format!("FINDING {finding}\n"));
    }
    text.push_str(&format!("trace hash {:016x}\n", outcome.trace_hash));
    std::fs::write(&path, text)?;
    // The store's metadata history next to it: every stored state, for reading what a revision held.
    let mut history = String::new();
    for event in &outcome.history {
        history.push_str(&format!("{} {:?}\n", fmt_us(event.at_ms * 1_000), event.kind));
        for (group, record) in &event.metadata_after {
            match record {
                Some(r) => history.push_str(&format!("    {group} rev={} {}\n", r.revision, r.aggregate)),
                None => history.push_str(&format!("    {group} absent\n")),
            }
        }
    }
    std::fs::write(path.with_extension("history"), history)?;
    Ok(path)
}

pub(crate) fn print_table(summaries: &[PlanSummary]) {
    println!();
    println!("{:<36} {:>10} {:>6}  {:<48} {:>9}", "plan", "seeds", "failed", "violations by kind", "sim/wall");
    for s in summaries {
        let kinds: Vec<String> = s.kinds.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        let kinds = if kinds.is_empty() { "-".to_string() } else { kinds.join(" ") };
        let ratio = s.simulated.as_secs_f64() / s.wall.as_secs_f64().max(1e-9);
        let seeds = format!("{}..{}", s.seeds.0, s.seeds.1);
        println!("{:<36} {:>10} {:>6}  {:<48} {:>8.0}x", s.name, seeds, s.failed.len(), kinds, ratio);
        if let Some(us) = s.silent_split_max_us {
            println!("{:<36} silent-rollback split window (measured, max): {} ms", "", us / 1_000);
        }
        if s.backlog_max > 0 {
            println!("{:<36} undelivered backlog at the end (measured, max per seed): {} entries", "", s.backlog_max);
        }
        if s.from_dropped_writes > 0 {
            println!("{:<36} responses derived from dropped writes (measured): {}", "", s.from_dropped_writes);
        }
        println!(
            "{:<36} stranded entries (acknowledged, never delivered, shard beyond the recorded count after the ack): {}",
            "", s.stranded
        );
        if s.unprovable_version_reuses > 0 {
            println!(
                "{:<36} version bumps reusing a number only unprovable reports named (measured): {}",
                "", s.unprovable_version_reuses
            );
        }
        if s.stranded_unprovable > 0 {
            println!(
                "{:<36} stranded entries no process could prove the lost count of (measured): {}",
                "", s.stranded_unprovable
            );
        }
        if s.delivered_never_processed_max > 0 {
            println!(
                "{:<36} entries Redis delivered in the last 45 s that no consumer processed (measured, max per seed): {}",
                "", s.delivered_never_processed_max
            );
        }
        if s.lost_version_answers > 0 {
            println!(
                "{:<36} routing answers telling a producer its cached version was lost (measured): {}",
                "", s.lost_version_answers
            );
        }
        if !s.correction_rounds_by_cause.is_empty() {
            let causes: Vec<String> = s.correction_rounds_by_cause.iter().map(|(c, n)| format!("{c}:{n}")).collect();
            println!("{:<36} correction rounds by ground-truth cause: {}", "", causes.join(" "));
        }
        let (fenced_ok, refused, stale_after_loss) = s.fences;
        println!(
            "{:<36} fences: {fenced_ok} fenced operations ran; stale operations refused by the fence: {refused}; \
             stale successes after a store loss (measured): {stale_after_loss}",
            ""
        );
        if s.silent_loss_overlaps > 0 {
            println!("{:<36} processing overlaps after silent write loss (measured): {}", "", s.silent_loss_overlaps);
        }
        if s.paused_overlaps > 0 {
            println!("{:<36} processing overlaps caused by pauses (measured): {}", "", s.paused_overlaps);
        }
        let (split_brain, stale_fences) = &s.split_brain;
        if !split_brain.is_empty() || *stale_fences > 0 {
            let longest_ms =
                split_brain.splits.longest_us.map_or_else(|| "-".to_string(), |us| format!("{}", us / 1_000));
            println!(
                "{:<36} split brain (measured; each bounded by the old primary's switch + one lease): {} splits, \
                 longest {longest_ms} ms; {} processing overlaps; {} acknowledged publishes lost with the old \
                 primary; {} responses from the old primary's states; {stale_fences} operations on the other \
                 side's fence",
                "",
                split_brain.splits.count,
                split_brain.processing_overlaps,
                split_brain.lost_publishes,
                split_brain.responses_from_old_primary,
            );
        }
    }
}

/// Options of `run`.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunFlags {
    pub check_determinism: bool,
    pub verbose: bool,
    pub without_planted: bool,
    /// Report (trace and capsule) failing seeds of a planted plan too, though it expects them.
    pub capsules: bool,
}

/// `sim coverage`: every plan but planted-*, then the must-reach check over all of them. Fails
/// too when a seed found a violation: the runs are a sweep like `run`'s.
fn coverage(dir: &Path, seeds: (u64, u64)) -> Result<bool, PlanError> {
    let must = crate::coverage::load_must_reach(dir).map_err(PlanError::Invalid)?;
    let names: Vec<String> = plan_names(dir)?.into_iter().filter(|n| !n.starts_with("planted-")).collect();
    let mut total = crate::coverage::Coverage::new();
    let mut failing: Vec<String> = Vec::new();
    for name in &names {
        let summary = run_plan(&load_plan(dir, name)?, seeds, false, false)?;
        failing.extend(summary.failed.iter().map(|seed| format!("{name} seed {seed}")));
        println!("{name} (seeds {}..{}):", seeds.0, seeds.1);
        let mut line = String::new();
        for (item, n) in &summary.coverage {
            *total.entry(item.clone()).or_insert(0) += n;
            line.push_str(&format!(" {item}={n}"));
            if line.len() > 100 {
                println!("   {line}");
                line.clear();
            }
        }
        if !line.is_empty() {
            println!("   {line}");
        }
    }
    let unreached: Vec<&String> = must.items.iter().filter(|item| !total.contains_key(*item)).collect();
    println!("\nmust-reach (fault-plans/must-reach.toml): {} items, {} unreached", must.items.len(), unreached.len());
    for item in &must.items {
        let n = total.get(item).copied().unwrap_or(0);
        println!("  {:<44} {n}", item);
    }
    for item in &unreached {
        println!("NEVER REACHED: {item}");
    }
    if !failing.is_empty() {
        println!("FAILED: seeds that found violations: {}", failing.join(", "));
    }
    Ok(unreached.is_empty() && failing.is_empty())
}

/// Loads a plan, its planted bugs switched off under `--without-planted`.
fn load_spec(dir: &Path, name: &str, flags: RunFlags) -> Result<PlanSpec, PlanError> {
    let mut spec = load_plan(dir, name)?;
    if flags.without_planted {
        spec.planted.clear();
        spec.expect.clear();
    }
    Ok(spec)
}

fn run_plans(
    dir: &Path,
    which: &str,
    seeds: (u64, u64),
    flags: RunFlags,
    jobs: usize,
    json: bool,
) -> Result<bool, PlanError> {
    let names: Vec<String> = if which == "all" {
        plan_names(dir)?.into_iter().filter(|n| !n.starts_with("planted-")).collect()
    } else {
        vec![which.to_string()]
    };
    if names.is_empty() {
        // Nothing run would pass: a mistyped `--plans` directory is not a green sweep.
        return Err(PlanError::Invalid(format!("no plans in {} (`all` leaves out planted-*)", dir.display())));
    }
    let specs = names.iter().map(|name| load_spec(dir, name, flags)).collect::<Result<Vec<_>, _>>()?;
    if jobs > 1 {
        return sweep::run_parallel(&specs, seeds, flags, jobs);
    }
    let mut summaries = Vec::new();
    let mut progress = sweep::Progress::sequential((seeds.1 - seeds.0) * specs.len() as u64);
    for spec in &specs {
        summaries
            .push(run_plan_with(spec, seeds, flags, &mut |outcome| progress.seed_done(!outcome.findings.is_empty()))?);
    }
    progress.finish();
    print_table(&summaries);
    let capsules: Vec<&PathBuf> = summaries.iter().flat_map(|s| &s.capsules).collect();
    if !capsules.is_empty() {
        println!("\ncapsules written ({}; replay: cargo sim replay --capsule FILE):", capsules.len());
        capsules.iter().for_each(|path| println!("  {}", path.display()));
    }
    if json {
        for s in &summaries {
            println!("{}", sweep::plan_line(s));
        }
    }
    Ok(summaries.iter().all(|s| s.failed.is_empty()))
}

fn replay(dir: &Path, name: &str, seed: u64) -> Result<bool, PlanError> {
    let spec = load_plan(dir, name)?;
    let plan = spec.draw(seed)?;
    print!("{}", plan.describe());
    let outcome = run_seed(plan, true);
    for finding in &outcome.findings {
        println!("  {finding}");
    }
    match write_trace(&reproduce::run_stem(&spec.name, seed, false), &outcome) {
        Ok(path) => {
            println!("trace ({} events, hash {:016x}): {}", outcome.trace.len(), outcome.trace_hash, path.display())
        }
        Err(e) => println!("trace not written: {e}"),
    }
    let ratio = outcome.simulated.as_secs_f64() / outcome.wall.as_secs_f64().max(1e-9);
    println!(
        "simulated {:.1} s in {:.2} s wall ({ratio:.0}x)",
        outcome.simulated.as_secs_f64(),
        outcome.wall.as_secs_f64()
    );
    Ok(outcome.findings.is_empty())
}

/// Where `timeline` writes its pages.
fn timeline_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/sim-timelines"))
}

/// Runs one seed with the full trace and writes its timeline page; prints the page's path.
fn timeline(dir: &Path, name: &str, seed: u64, without_planted: bool) -> Result<bool, PlanError> {
    let spec = load_spec(dir, name, RunFlags { without_planted, ..RunFlags::default() })?;
    let plan = spec.draw(seed)?;
    let outcome = run_seed(plan.clone(), true);
    for finding in &outcome.findings {
        println!("  {finding}");
    }
    // A run that panicked has no records; its page still shows the plan and the panic.
    let empty = Records::default();
    let flags = RunFlags { without_planted, ..RunFlags::default() };
    let input = TimelineInput {
        plan: &plan,
        group: &sim_group(),
        records: outcome.records.as_ref().unwrap_or(&empty),
        findings: &outcome.findings,
        end_us: plan.durations.run_ms * 1_000,
        planted_on: !without_planted,
        reproduce: reproduce::reproduce_command(&spec.source(), seed, flags),
        this_page: reproduce::timeline_command(&spec.source(), seed, without_planted),
    };
    let html = timeline::render(&input);
    let out = timeline_dir();
    let path = out.join(format!("{}.html", reproduce::run_stem(&spec.name, seed, without_planted)));
    std::fs::create_dir_all(&out)
        .and_then(|()| std::fs::write(&path, html))
        .map_err(|e| PlanError::Io { path: path.clone(), message: e.to_string() })?;
    println!("{}", path.display());
    Ok(outcome.findings.is_empty())
}

/// Runs every planted-bug plan twice over `seeds`: with its planted bugs (all it lists) and as a
/// control run without them. A plan passes when the planted run produced every kind it expects and
/// no other, and the control run produced nothing (so the checkers fail for the bug, not for the
/// scenario). Prints planted bug -> kinds -> the first seed that produced each.
fn planted(dir: &Path, seeds: (u64, u64), capsules: bool) -> Result<bool, PlanError> {
    let mut all_ok = true;
    let mut summaries = Vec::new();
    let mut rows = Vec::new();
    for name in plan_names(dir)?.into_iter().filter(|n| n.starts_with("planted-")) {
        let spec = load_plan(dir, &name)?;
        let flags = RunFlags { capsules, ..RunFlags::default() };
        let summary = run_plan_with(&spec, seeds, flags, &mut |_| {})?;
        let mut control_spec = spec.clone();
        control_spec.planted.clear();
        control_spec.expect.clear();
        control_spec.also.clear();
        println!("--- {name}: control run (planted bugs off; must be clean)");
        let control_flags = RunFlags { without_planted: true, ..RunFlags::default() };
        let control = run_plan_with(&control_spec, seeds, control_flags, &mut |_| {})?;
        let missing: Vec<&str> =
            spec.expect.iter().map(String::as_str).filter(|k| !summary.kinds.contains_key(k)).collect();
        let allowed = |k: &str| spec.expect.iter().chain(&spec.also).any(|e| e == k);
        let unexpected: Vec<&str> = summary.kinds.keys().copied().filter(|k| !allowed(k)).collect();
        let ok = missing.is_empty() && unexpected.is_empty() && control.failed.is_empty();
        let verdict = match (missing.is_empty(), unexpected.is_empty(), control.failed.is_empty()) {
            (true, true, true) => "caught; control clean".to_string(),
            _ => format!(
                "FAILED: missing {missing:?}, unexpected {unexpected:?}, control failed on seeds {:?}",
                control.failed
            ),
        };
        println!("{name}: expected {:?} -> {verdict}", spec.expect);
        let bugs: Vec<String> = spec.planted.iter().map(|b| format!("{b:?}")).collect();
        let kinds: Vec<String> =
            summary.first_seed_by_kind.iter().map(|(k, seed)| format!("{k} (seed {seed})")).collect();
        rows.push((bugs.join("+"), kinds.join(", "), summary.failed.len(), control.failed.len()));
        all_ok &= ok;
        summaries.push(summary);
        summaries.push(control);
    }
    print_table(&summaries);
    println!();
    println!("{:<36} {:>13} {:>8}  kinds produced (first seed)", "planted bug", "failing seeds", "control");
    for (bugs, kinds, failing, control) in rows {
        println!("{bugs:<36} {failing:>13} {control:>8}  {kinds}");
    }
    let produced: std::collections::BTreeSet<&str> = summaries.iter().flat_map(|s| s.kinds.keys().copied()).collect();
    let never: Vec<&str> = crate::checkers::KINDS.iter().copied().filter(|k| !produced.contains(k)).collect();
    println!();
    println!(
        "violation kinds produced by a planted run: {} of {}; never produced: {never:?}",
        crate::checkers::KINDS.len() - never.len(),
        crate::checkers::KINDS.len()
    );
    // Every checker can fail: a kind no planted run produced over these seeds is a checker nothing
    // shows can fire, so the command fails, as it does for a planted bug that was not caught.
    if !never.is_empty() {
        println!("FAILED: violation kinds no planted run produced: {never:?}");
    }
    Ok(all_ok && never.is_empty())
}

#[cfg(test)]
mod tests;
