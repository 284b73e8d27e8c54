//! Sweeps people can leave running: `cargo sim run <plan|all> --seeds A..B --jobs N` runs the
//! seeds in N child processes of this same binary, each running one (plan, seed chunk) through the
//! hidden `chunk` command, which prints one machine-readable [`SeedLine`] per seed. The parent
//! shows progress on stderr (done/total, failures so far, ETA) and, at the end, the children's
//! failure reports, the summary table the sequential run prints and every failing (plan, seed)
//! with its REPRODUCE line.
//!
//! Owns: the seed-line format, the chunk queue and the child processes. Never runs a simulation
//! in the parent (threads here only read pipes); each child is an ordinary sequential run, so a
//! seed's outcome does not depend on `--jobs`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checkers::{Finding, Measurements, KINDS};
use crate::cli::{
    child_args, print_table, reproduce_command, run_plan_with, PlanSummary, RunFlags, CAPSULE_LINE_PREFIX,
};
use crate::plan::{PlanError, PlanSource, PlanSpec};
use crate::runner::SeedOutcome;

/// Prefix of a seed line on a child's stdout (every other line is free text: failure reports).
pub const SEED_LINE_PREFIX: &str = "SIMSEED ";
/// At most this many seeds per child process (smaller chunks balance the load better).
const CHUNK_SEEDS_MAX: u64 = 25;

/// One seed's outcome as a child prints it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedLine {
    pub plan: String,
    pub seed: u64,
    pub findings: Vec<FindingLine>,
    pub simulated_us: u64,
    pub wall_us: u64,
    pub measurements: MeasurementsLine,
    /// What the seed reached (`coverage`).
    #[serde(default)]
    pub coverage: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FindingLine {
    pub checker: String,
    pub kind: String,
    pub at_us: u64,
    pub detail: String,
}

/// [`Measurements`] with owned names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasurementsLine {
    pub silent_rollback_split_us: Option<u64>,
    pub paused_processing_overlaps: usize,
    pub backlog_entries: usize,
    pub stranded_entries: usize,
    #[serde(default)]
    pub stranded_unprovable_entries: usize,
    #[serde(default)]
    pub unprovable_version_reuses: usize,
    pub silent_loss_processing_overlaps: usize,
    pub responses_from_dropped_writes: usize,
    pub lost_version_answers: usize,
    pub delivered_never_processed: usize,
    pub correction_rounds_by_cause: BTreeMap<String, usize>,
    /// `FenceCounts`: fenced operations that ran, refused, stale after a loss.
    #[serde(default)]
    pub fences: (usize, u64, usize),
    /// `SplitBrainCounts`, and the fence count `stale_across_split_brain`.
    #[serde(default)]
    pub split_brain: (crate::checkers::SplitBrainCounts, usize),
}

/// Names read back from a child become `&'static str` again (the summary keys by them); each
/// distinct name is leaked once.
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    if let Some(kind) = KINDS.iter().copied().find(|k| *k == name) {
        return kind;
    }
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(leaked);
    leaked
}

impl SeedLine {
    pub fn from_outcome(plan: &str, outcome: &SeedOutcome) -> Self {
        let m = &outcome.measurements;
        let findings = outcome
            .findings
            .iter()
            .map(|f| FindingLine {
                checker: f.checker.to_string(),
                kind: f.kind.to_string(),
                at_us: f.at_us,
                detail: f.detail.clone(),
            })
            .collect();
        let measurements = MeasurementsLine {
            silent_rollback_split_us: m.silent_rollback_split_us,
            paused_processing_overlaps: m.paused_processing_overlaps,
            backlog_entries: m.backlog_entries,
            stranded_entries: m.stranded_entries,
            stranded_unprovable_entries: m.stranded_unprovable_entries,
            unprovable_version_reuses: m.unprovable_version_reuses,
            silent_loss_processing_overlaps: m.silent_loss_processing_overlaps,
            responses_from_dropped_writes: m.responses_from_dropped_writes,
            lost_version_answers: m.lost_version_answers,
            delivered_never_processed: m.delivered_never_processed,
            correction_rounds_by_cause: m.correction_rounds_by_cause.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            fences: (m.fences.fenced_ok, m.fences.refused, m.fences.stale_after_loss),
            split_brain: (m.split_brain.clone(), m.fences.stale_across_split_brain),
        };
        Self {
            plan: plan.to_string(),
            seed: outcome.seed,
            findings,
            simulated_us: u64::try_from(outcome.simulated.as_micros()).unwrap_or(u64::MAX),
            wall_us: u64::try_from(outcome.wall.as_micros()).unwrap_or(u64::MAX),
            measurements,
            coverage: outcome.coverage.clone(),
        }
    }

    /// The outcome the summary adds up (no trace: the child wrote it for a failing seed).
    pub fn to_outcome(&self) -> SeedOutcome {
        let l = &self.measurements;
        // Every field by name, no `..default()`: a measurement added to the checkers is a compile
        // error here until this line format carries it (else `--jobs N` would print it as zero).
        let m = Measurements {
            silent_rollback_split_us: l.silent_rollback_split_us,
            paused_processing_overlaps: l.paused_processing_overlaps,
            backlog_entries: l.backlog_entries,
            stranded_entries: l.stranded_entries,
            stranded_unprovable_entries: l.stranded_unprovable_entries,
            unprovable_version_reuses: l.unprovable_version_reuses,
            silent_loss_processing_overlaps: l.silent_loss_processing_overlaps,
            responses_from_dropped_writes: l.responses_from_dropped_writes,
            lost_version_answers: l.lost_version_answers,
            delivered_never_processed: l.delivered_never_processed,
            correction_rounds_by_cause: l.correction_rounds_by_cause.iter().map(|(k, n)| (intern(k), *n)).collect(),
            fences: crate::checkers::fences::FenceCounts {
                fenced_ok: l.fences.0,
                refused: l.fences.1,
                stale_after_loss: l.fences.2,
                stale_across_split_brain: l.split_brain.1,
            },
            split_brain: l.split_brain.0.clone(),
        };
        let findings = self
            .findings
            .iter()
            .map(|f| Finding {
                checker: intern(&f.checker),
                kind: intern(&f.kind),
                at_us: f.at_us,
                detail: f.detail.clone(),
            })
            .collect();
        SeedOutcome {
            seed: self.seed,
            coverage: self.coverage.clone(),
            findings,
            measurements: m,
            trace_hash: 0,
            trace: Vec::new(),
            history: Vec::new(),
            records: None,
            simulated: Duration::from_micros(self.simulated_us),
            wall: Duration::from_micros(self.wall_us),
        }
    }

    /// The line a child prints.
    pub fn to_line(&self) -> String {
        // safe: a struct of strings, numbers and string-keyed maps always serializes.
        format!("{SEED_LINE_PREFIX}{}", serde_json::to_string(self).unwrap_or_default())
    }

    pub fn parse(line: &str) -> Option<Self> {
        serde_json::from_str(line.strip_prefix(SEED_LINE_PREFIX)?).ok()
    }
}

/// Prefix of the per-plan line `run --json` prints after its table.
pub const PLAN_LINE_PREFIX: &str = "SIMPLAN ";

/// One plan's totals as `run --json` prints them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanLine {
    pub plan: String,
    pub seeds: (u64, u64),
    pub failed: usize,
    pub simulated_us: u64,
    pub wall_us: u64,
}

/// The `SIMPLAN {json}` line of a plan's summary.
pub fn plan_line(s: &PlanSummary) -> String {
    let line = PlanLine {
        plan: s.name.clone(),
        seeds: s.seeds,
        failed: s.failed.len(),
        simulated_us: u64::try_from(s.simulated.as_micros()).unwrap_or(u64::MAX),
        wall_us: u64::try_from(s.wall.as_micros()).unwrap_or(u64::MAX),
    };
    format!("{PLAN_LINE_PREFIX}{}", serde_json::to_string(&line).unwrap_or_default())
}

/// The hidden `chunk` command (a child's side): runs seeds of one plan sequentially, printing
/// one seed line per seed as it finishes.
pub fn run_chunk(spec: &PlanSpec, seeds: (u64, u64), flags: RunFlags) -> Result<bool, PlanError> {
    let mut stdout = std::io::stdout();
    run_plan_with(spec, seeds, flags, &mut |outcome| {
        let _ = writeln!(stdout, "{}", SeedLine::from_outcome(&spec.name, outcome).to_line());
        let _ = stdout.flush();
    })?;
    Ok(true)
}

/// One child's work.
#[derive(Clone, Debug)]
struct Chunk {
    plan: usize,
    seeds: (u64, u64),
}

/// What the pipe readers tell the parent.
enum Event {
    Line(usize, String),
    /// The chunk's child exited: its stderr and exit status.
    Done(usize, String, Option<i32>),
}

/// Splits the seeds so that every job gets several chunks (load balance), plan-interleaved.
fn chunks(plans: usize, seeds: (u64, u64), jobs: usize) -> Vec<Chunk> {
    let total = seeds.1 - seeds.0;
    let per = total.div_ceil(jobs as u64 * 4).clamp(1, CHUNK_SEEDS_MAX);
    let mut out = Vec::new();
    let mut start = seeds.0;
    while start < seeds.1 {
        let end = (start + per).min(seeds.1);
        out.extend((0..plans).map(|plan| Chunk { plan, seeds: (start, end) }));
        start = end;
    }
    out
}

/// The arguments of the child that runs `seeds` of the plan loaded from `source`: it loads that
/// very file (a plan given as a path, or one whose `name` is not its file name, included).
pub(crate) fn chunk_args(source: &PlanSource, seeds: (u64, u64), flags: RunFlags) -> Vec<String> {
    let mut rest = vec!["--seeds".to_string(), format!("{}..{}", seeds.0, seeds.1)];
    for (on, flag) in [
        (flags.without_planted, "--without-planted"),
        (flags.check_determinism, "--check-determinism"),
        (flags.verbose, "--verbose"),
        (flags.capsules, "--capsules"),
    ] {
        if on {
            rest.push(flag.to_string());
        }
    }
    child_args(source, "chunk", &rest)
}

fn spawn(
    exe: &Path,
    source: &PlanSource,
    chunk: &Chunk,
    flags: RunFlags,
    id: usize,
    tx: &mpsc::Sender<Event>,
) -> std::io::Result<()> {
    let mut cmd = Command::new(exe);
    cmd.args(chunk_args(source, chunk.seeds, flags));
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let tx = tx.clone();
    // OS threads are fine here: this is the sweep's parent process, outside any simulated runtime
    // (each seed runs deterministically in its child); the threads only drain the child's pipes.
    std::thread::spawn(move || {
        let err_reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(e) = stderr.as_mut() {
                let _ = e.read_to_string(&mut text);
            }
            text
        });
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(Event::Line(id, line));
            }
        }
        let err = err_reader.join().unwrap_or_default();
        let status = child.wait().ok().and_then(|s| s.code());
        let _ = tx.send(Event::Done(id, err, status));
    });
    Ok(())
}

fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// Progress on stderr: rewritten in place on a terminal, one line every 10 s otherwise.
pub(crate) struct Progress {
    total: u64,
    done: u64,
    failing: usize,
    jobs: usize,
    started: Instant,
    last: Option<Instant>,
    tty: bool,
}

impl Progress {
    /// Progress of `total` seeds run in this process, one after another (`--jobs 1`): its first
    /// line comes after one interval, so a run shorter than that prints none.
    pub(crate) fn sequential(total: u64) -> Self {
        let now = Instant::now();
        Self {
            total,
            done: 0,
            failing: 0,
            jobs: 1,
            started: now,
            last: Some(now),
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// One more seed done (`failed`: it found something).
    pub(crate) fn seed_done(&mut self, failed: bool) {
        self.done += 1;
        self.failing += usize::from(failed);
        self.show(false);
    }

    /// The last line, if any was shown: the final count (a terminal's line is then ended).
    pub(crate) fn finish(&mut self) {
        if self.last.is_some_and(|last| last > self.started) {
            self.show(true);
            if self.tty {
                eprintln!();
            }
        }
    }

    fn show(&mut self, force: bool) {
        let every = if self.tty { Duration::from_millis(200) } else { Duration::from_secs(10) };
        if !force && self.last.is_some_and(|l| l.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        let elapsed = self.started.elapsed();
        let eta = if self.done == 0 {
            "?".to_string()
        } else {
            fmt_duration(elapsed.mul_f64((self.total - self.done) as f64 / self.done as f64))
        };
        let pct = self.done * 100 / self.total.max(1);
        let text = format!(
            "sweep: {}/{} seeds ({pct}%), {} failing, {} jobs, elapsed {}, ETA {eta}",
            self.done,
            self.total,
            self.failing,
            self.jobs,
            fmt_duration(elapsed)
        );
        if self.tty {
            eprint!("\r{text}\x1b[K");
        } else {
            eprintln!("{text}");
        }
    }
}

/// The parent of a `--jobs N` run. `specs` are the plans in table order.
pub fn run_parallel(specs: &[PlanSpec], seeds: (u64, u64), flags: RunFlags, jobs: usize) -> Result<bool, PlanError> {
    let exe = std::env::current_exe().map_err(|e| PlanError::Invalid(format!("cannot find this executable: {e}")))?;
    let queue = chunks(specs.len(), seeds, jobs);
    let mut summaries: Vec<PlanSummary> =
        specs.iter().map(|s| PlanSummary { name: s.name.clone(), seeds, ..PlanSummary::default() }).collect();
    let mut texts: Vec<String> = vec![String::new(); queue.len()];
    let mut seen: Vec<u64> = vec![0; queue.len()];
    let mut failing: Vec<(usize, u64, Vec<&'static str>)> = Vec::new();
    let mut progress = Progress {
        total: (seeds.1 - seeds.0) * specs.len() as u64,
        done: 0,
        failing: 0,
        jobs,
        started: Instant::now(),
        last: None,
        tty: std::io::stderr().is_terminal(),
    };
    let (tx, rx) = mpsc::channel();
    let (mut next, mut running) = (0, 0);
    let mut broken = Vec::new();
    while next < queue.len() || running > 0 {
        while running < jobs && next < queue.len() {
            let chunk = &queue[next];
            spawn(&exe, &specs[chunk.plan].source(), chunk, flags, next, &tx)
                .map_err(|e| PlanError::Invalid(format!("cannot start {}: {e}", exe.display())))?;
            next += 1;
            running += 1;
        }
        let Ok(event) = rx.recv() else { break };
        match event {
            Event::Line(id, line) => match SeedLine::parse(&line) {
                Some(seed) => {
                    let outcome = seed.to_outcome();
                    let plan = queue[id].plan;
                    summaries[plan].add(&outcome);
                    if !outcome.findings.is_empty() {
                        let kinds = crate::checkers::count_by_kind(&outcome.findings).into_keys().collect();
                        failing.push((plan, outcome.seed, kinds));
                        progress.failing += 1;
                    }
                    seen[id] += 1;
                    progress.done += 1;
                    progress.show(false);
                }
                None => {
                    texts[id].push_str(&line);
                    texts[id].push('\n');
                }
            },
            Event::Done(id, err, status) => {
                running -= 1;
                let chunk = &queue[id];
                if seen[id] < chunk.seeds.1 - chunk.seeds.0 {
                    broken.push(format!(
                        "{} seeds {}..{}: the child exited ({status:?}) after {} of its seeds\n{err}",
                        specs[chunk.plan].name, chunk.seeds.0, chunk.seeds.1, seen[id]
                    ));
                }
            }
        }
    }
    progress.show(true);
    if progress.tty {
        eprintln!();
    }
    // Children finish in any order; the table and the list are in plan and seed order.
    summaries.iter_mut().for_each(|s| s.failed.sort_unstable());
    report(specs, &summaries, &texts, &mut failing, &broken, flags, &progress);
    Ok(broken.is_empty() && summaries.iter().all(|s| s.failed.is_empty()))
}

fn report(
    specs: &[PlanSpec],
    summaries: &[PlanSummary],
    texts: &[String],
    failing: &mut [(usize, u64, Vec<&'static str>)],
    broken: &[String],
    flags: RunFlags,
    progress: &Progress,
) {
    for text in texts.iter().filter(|t| !t.is_empty()) {
        print!("{text}");
    }
    for b in broken {
        println!("\nBROKEN CHUNK: {b}");
    }
    print_table(summaries);
    println!(
        "\n{} seeds in {} wall with {} jobs",
        progress.done,
        fmt_duration(progress.started.elapsed()),
        progress.jobs
    );
    let capsules: Vec<&str> =
        texts.iter().flat_map(|t| t.lines()).filter_map(|l| l.strip_prefix(CAPSULE_LINE_PREFIX)).collect();
    if !capsules.is_empty() {
        println!("\ncapsules written ({}; replay: cargo sim replay --capsule FILE):", capsules.len());
        capsules.iter().for_each(|path| println!("  {path}"));
    }
    if failing.is_empty() {
        return;
    }
    failing.sort();
    println!("\nfailing seeds ({}):", failing.len());
    for (plan, seed, kinds) in failing.iter() {
        let name = &specs[*plan].name;
        let reproduce = reproduce_command(&specs[*plan].source(), *seed, flags);
        println!("  {name:<36} seed {seed:<8} {:<40} REPRODUCE WITH: {reproduce}", kinds.join(","));
    }
}

#[cfg(test)]
mod tests;
