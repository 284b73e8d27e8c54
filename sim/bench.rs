//! `cargo sim bench`: how fast the simulator runs (simulated seconds per wall second), for this
//! binary and, with `--baseline <path>`, another build of the simulator, in one invocation.
//!
//! Both binaries run as child processes (`run <plan> --seeds S..S+1`), one seed at a time,
//! interleaved and in alternating order (ABBA), so that the load of a shared machine falls on
//! both alike. A binary that knows `run --json` reports its simulated and in-process wall time as a
//! `SIMPLAN {json}` line; an older one is timed from its summary table's `sim/wall` ratio, with the
//! simulated time recomputed from the plan (the plans are drawn here, from the same files).
//!
//! Owns: the child runs and the comparison table. Never runs a simulation itself, and measures
//! wall time only outside any simulated code.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::plan::{load_plan, PlanError, PlanSource, PlanSpec};
use crate::sweep::{PlanLine, PLAN_LINE_PREFIX};

/// One binary under test.
struct Binary {
    label: &'static str,
    path: PathBuf,
    /// Whether it understands `run --json` (learned on the first run).
    json: Option<bool>,
}

/// Totals of one plan on one binary.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    pub simulated_s: f64,
    pub wall_s: f64,
    pub failed: usize,
    /// Seeds timed from the summary text rather than `--json` (integer ratio: less precise).
    pub from_text: usize,
}

impl Timing {
    pub fn ratio(&self) -> f64 {
        self.simulated_s / self.wall_s.max(1e-9)
    }
}

/// The `sim/wall` ratio of `plan`'s row in a summary table, e.g. `standard  0..1  0  -  88x`.
pub fn ratio_from_table(stdout: &str, plan: &str) -> Option<f64> {
    stdout.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != plan {
            return None;
        }
        line.split_whitespace().last()?.strip_suffix('x')?.parse().ok()
    })
}

/// The `SIMPLAN` line of `plan` in a `run --json` output.
pub fn plan_line_from(stdout: &str, plan: &str) -> Option<PlanLine> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<PlanLine>(l.strip_prefix(PLAN_LINE_PREFIX)?).ok())
        .find(|l| l.plan == plan)
}

/// The arguments of a child that runs `seed` of the plan loaded from `source`: it loads that very
/// file (a plan given as a path, or one whose `name` is not its file name, included).
pub(crate) fn run_args(source: &PlanSource, seed: u64, json: bool) -> Vec<String> {
    let mut rest = vec!["--seeds".to_string(), format!("{seed}..{}", seed + 1)];
    if json {
        rest.push("--json".to_string());
    }
    crate::cli::child_args(source, "run", &rest)
}

fn run_child(binary: &Binary, spec: &PlanSpec, seed: u64, json: bool) -> Result<(String, String, i32), PlanError> {
    let out = Command::new(&binary.path).args(run_args(&spec.source(), seed, json)).output().map_err(|e| {
        PlanError::Invalid(format!("cannot run the {} binary {}: {e}", binary.label, binary.path.display()))
    })?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok((text(&out.stdout), text(&out.stderr), out.status.code().unwrap_or(-1)))
}

/// Times one seed of one plan on one binary.
fn time_seed(binary: &mut Binary, spec: &PlanSpec, seed: u64) -> Result<Timing, PlanError> {
    let plan = spec.name.as_str();
    if binary.json != Some(false) {
        let (stdout, stderr, _) = run_child(binary, spec, seed, true)?;
        if let Some(line) = plan_line_from(&stdout, plan) {
            binary.json = Some(true);
            return Ok(Timing {
                simulated_s: line.simulated_us as f64 / 1e6,
                wall_s: line.wall_us as f64 / 1e6,
                failed: line.failed,
                from_text: 0,
            });
        }
        if binary.json == Some(true) || !stderr.contains("--json") {
            return Err(PlanError::Invalid(format!(
                "the {} binary printed no result for {plan} seed {seed}:\n{stdout}{stderr}",
                binary.label
            )));
        }
        // An older build: its argument parser refused `--json`.
        binary.json = Some(false);
    }
    let (stdout, stderr, code) = run_child(binary, spec, seed, false)?;
    let ratio = ratio_from_table(&stdout, plan).filter(|r| *r > 0.0).ok_or_else(|| {
        PlanError::Invalid(format!(
            "no sim/wall ratio for {plan} in the {} binary's output:\n{stdout}{stderr}",
            binary.label
        ))
    })?;
    let simulated_s = spec.draw(seed)?.durations.run_ms as f64 / 1e3;
    Ok(Timing { simulated_s, wall_s: simulated_s / ratio, failed: usize::from(code != 0), from_text: 1 })
}

fn add(total: &mut Timing, t: Timing) {
    total.simulated_s += t.simulated_s;
    total.wall_s += t.wall_s;
    total.failed += t.failed;
    total.from_text += t.from_text;
}

/// `cargo sim bench`: prints per plan the simulated and wall seconds and sim/wall of each binary,
/// and current/baseline. Returns false when a binary failed a seed.
pub fn bench(dir: &Path, plans: &str, seeds: (u64, u64), baseline: Option<PathBuf>) -> Result<bool, PlanError> {
    let exe = std::env::current_exe().map_err(|e| PlanError::Invalid(format!("cannot find this executable: {e}")))?;
    let mut binaries = vec![Binary { label: "current", path: exe, json: None }];
    if let Some(path) = baseline {
        binaries.push(Binary { label: "baseline", path, json: None });
    }
    let specs = plans
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| load_plan(dir, p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut totals: BTreeMap<(usize, usize), Timing> = BTreeMap::new();
    let runs = (seeds.1 - seeds.0) as usize * specs.len();
    let mut done = 0;
    let tty = std::io::stderr().is_terminal();
    for seed in seeds.0..seeds.1 {
        for (p, spec) in specs.iter().enumerate() {
            // ABBA: alternate which binary goes first, so a load trend favours neither.
            let mut order: Vec<usize> = (0..binaries.len()).collect();
            if (seed + p as u64) % 2 == 1 {
                order.reverse();
            }
            for b in order {
                let t = time_seed(&mut binaries[b], spec, seed)?;
                add(totals.entry((p, b)).or_default(), t);
            }
            done += 1;
            if tty {
                eprint!("\rbench: {done}/{runs} (plan, seed) runs");
            }
        }
        if !tty {
            eprintln!("bench: {done}/{runs} (plan, seed) runs");
        }
    }
    if tty {
        eprintln!();
    }
    print_bench(&specs, seeds, &binaries, &totals);
    Ok(totals.values().all(|t| t.failed == 0))
}

fn print_bench(specs: &[PlanSpec], seeds: (u64, u64), binaries: &[Binary], totals: &BTreeMap<(usize, usize), Timing>) {
    println!();
    let mut header = format!("{:<24} {:>8} {:>11}", "plan", "seeds", "simulated s");
    for b in binaries {
        header.push_str(&format!(" {:>16} {:>10}", format!("{} wall s", b.label), "sim/wall"));
    }
    if binaries.len() > 1 {
        header.push_str(&format!(" {:>17}", "current/baseline"));
    }
    println!("{header}");
    let mut grand: Vec<Timing> = vec![Timing::default(); binaries.len()];
    let rows = specs
        .iter()
        .enumerate()
        .map(|(p, s)| (s.name.clone(), (0..binaries.len()).map(|b| totals[&(p, b)]).collect::<Vec<_>>()));
    let rows: Vec<(String, Vec<Timing>)> = rows.collect();
    for (_, timings) in &rows {
        for (g, t) in grand.iter_mut().zip(timings) {
            add(g, *t);
        }
    }
    let seeds = format!("{}..{}", seeds.0, seeds.1);
    for (name, timings) in rows.iter().chain(std::iter::once(&("total".to_string(), grand))) {
        let mut line = format!("{name:<24} {seeds:>8} {:>11.1}", timings[0].simulated_s);
        for t in timings {
            line.push_str(&format!(" {:>16.2} {:>9.0}x", t.wall_s, t.ratio()));
        }
        if let [current, baseline] = timings.as_slice() {
            line.push_str(&format!(" {:>16.2}x", current.ratio() / baseline.ratio().max(1e-9)));
        }
        println!("{line}");
    }
    for (b, binary) in binaries.iter().enumerate() {
        let failed: usize = rows.iter().map(|(_, t)| t[b].failed).sum();
        let text: usize = rows.iter().map(|(_, t)| t[b].from_text).sum();
        let how = if text > 0 { "timed from its summary table (no --json)" } else { "timed with --json" };
        println!("{:<9} {} — {how}; failing seeds: {failed}", binary.label, binary.path.display());
    }
    println!(
        "current/baseline > 1: the current binary simulates faster. Wall times are in-process (plan loading excluded)."
    );
}

#[cfg(test)]
mod tests {
    use super::{plan_line_from, ratio_from_table};

    #[test]
    fn reads_the_ratio_of_a_plans_row_in_todays_summary_table() {
        let table = "\nplan                                      seeds failed  violations by kind                                sim/wall\n\
                     standard                                   0..5      0  -                                                      88x\n\
                     \x20                                    stranded entries (acknowledged, never delivered, ...): 0\n";
        assert_eq!(ratio_from_table(table, "standard"), Some(88.0));
        assert_eq!(ratio_from_table(table, "swarm"), None);
    }

    #[test]
    fn reads_the_json_line_of_a_plan() {
        let out = "table...\nSIMPLAN {\"plan\":\"swarm\",\"seeds\":[0,1],\"failed\":0,\"simulated_us\":90000000,\"wall_us\":500000}\n";
        let line = plan_line_from(out, "swarm").expect("a plan line");
        assert_eq!((line.simulated_us, line.wall_us, line.failed), (90_000_000, 500_000, 0));
        assert!(plan_line_from(out, "standard").is_none());
    }
}
