//! The bench's printed output: a progress line per run, then the results table (min / median /
//! max seconds to all-OK and correction rounds per scenario and variant), the after/before ratios,
//! the goals, and where the time went (store calls, mutex, CPU) per scenario and variant.
//! Never measures anything itself: it only summarizes [`Outcome`]s.

use super::instrumented::TraceCounts;
use super::rig::{Outcome, Variant};
use super::scenarios::{RunResult, Scenario};
use rsc::core::protocol::HeartbeatStatus;

/// Every outcome of one scenario under one variant.
pub struct Row {
    pub scenario: usize,
    pub variant: Variant,
    pub outcomes: Vec<Outcome>,
    pub errors: Vec<String>,
}

impl Row {
    fn samples(&self) -> Vec<Value> {
        self.outcomes.iter().map(|o| Value { s: o.seconds, lower_bound: !o.finished }).collect()
    }

    fn unfinished(&self) -> usize {
        self.outcomes.iter().filter(|o| !o.finished).count()
    }

    fn rounds(&self) -> u64 {
        self.outcomes.iter().map(|o| o.rounds).sum()
    }

    fn samples_with_round(&self) -> usize {
        self.outcomes.iter().filter(|o| o.rounds > 0).count()
    }

    fn evidence(&self) -> u64 {
        self.outcomes.iter().map(|o| o.evidence).sum()
    }

    fn syncs(&self) -> u64 {
        self.outcomes.iter().map(|o| o.board.status(HeartbeatStatus::SyncMetadata)).sum()
    }
}

/// Seconds to all-OK; a rebalance that hit its deadline gives only a lower bound.
#[derive(Clone, Copy, Debug)]
struct Value {
    s: f64,
    lower_bound: bool,
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:.3}", if self.lower_bound { ">= " } else { "" }, self.s)
    }
}

/// `after / before`, marked as a bound when either side is one.
fn ratio(after: Value, before: Value) -> String {
    let r = after.s / before.s.max(1e-9);
    match (after.lower_bound, before.lower_bound) {
        (false, false) => format!("{r:.2}x"),
        (false, true) => format!("<= {r:.2}x"),
        (true, false) => format!(">= {r:.2}x"),
        (true, true) => "?".into(),
    }
}

#[derive(Clone, Copy, Debug)]
struct Stats {
    min: Value,
    median: Value,
    p90: Value,
    max: Value,
}

/// Order statistics (nearest rank; the median of an even count is the lower middle sample).
fn stats(values: &[Value]) -> Option<Stats> {
    let mut v = values.to_vec();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.s.total_cmp(&b.s));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).floor() as usize];
    Some(Stats { min: v[0], median: at(0.5), p90: at(0.9), max: v[v.len() - 1] })
}

pub fn print_run(scenario: &Scenario, variant: Variant, rep: usize, run: &RunResult) {
    let seconds: Vec<String> =
        run.outcomes.iter().map(|o| Value { s: o.seconds, lower_bound: !o.finished }.to_string()).collect();
    let rounds: u64 = run.outcomes.iter().map(|o| o.rounds).sum();
    let evidence: u64 = run.outcomes.iter().map(|o| o.evidence).sum();
    let syncs: u64 = run.outcomes.iter().map(|o| o.board.status(HeartbeatStatus::SyncMetadata)).sum();
    let mut failures: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for o in &run.outcomes {
        for (kind, n) in &o.board.failure_kinds {
            *failures.entry(kind).or_default() += n;
        }
    }
    let busy: u64 = run.outcomes.iter().map(|o| o.store.mutex_busy).sum();
    let abandoned: u64 = run.outcomes.iter().map(|o| o.store.mutex_abandoned).sum();
    println!(
        "  {:<9} {:<6} rep {rep:>2}: s to all-OK [{}]  rounds {rounds} evidence {evidence} SYNC_METADATA {syncs} \
         heartbeat failures {failures:?} mutex busy {busy} abandoned {abandoned}{}",
        scenario.key,
        variant.name(),
        seconds.join(" "),
        run.error.as_ref().map(|e| format!("  ERROR: {e}")).unwrap_or_default()
    );
}

fn find(rows: &[Row], scenario: usize, variant: Variant) -> Option<&Row> {
    rows.iter().find(|r| r.scenario == scenario && r.variant == variant)
}

/// The results table, ratios and goals. `interval_s` is the group's heartbeat interval.
pub fn print_results(scenarios: &[Scenario], rows: &[Row], interval_s: f64) {
    println!("\n## Seconds from the start of the rebalance to all-OK (every member OK, every shard owned)\n");
    println!(
        "| scenario | variant | samples | min s | median s | p90 s | max s | goal for max | max met | correction \
         rounds (samples with one) | loss evidence | SYNC_METADATA applied | unfinished / errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (index, scenario) in scenarios.iter().enumerate() {
        let goal = scenario.goal_intervals * interval_s;
        for variant in [Variant::Before, Variant::After] {
            let Some(row) = find(rows, index, variant) else { continue };
            let (min, median, p90, max, met) = match stats(&row.samples()) {
                Some(s) => (
                    s.min.to_string(),
                    s.median.to_string(),
                    s.p90.to_string(),
                    s.max.to_string(),
                    if s.max.s <= goal && !s.max.lower_bound && row.errors.is_empty() { "yes" } else { "no" },
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into(), "no"),
            };
            println!(
                "| {} | {} | {} | {min} | {median} | {p90} | {max} | <= {goal:.1} s | {met} | {} ({}) | {} | {} | {} / {} |",
                scenario.title(),
                variant.name(),
                row.outcomes.len(),
                row.rounds(),
                row.samples_with_round(),
                row.evidence(),
                row.syncs(),
                row.unfinished(),
                row.errors.len() - row.unfinished().min(row.errors.len()),
            );
        }
    }
    print_ratios(scenarios, rows);
    print_goals(scenarios, rows, interval_s);
    for row in rows {
        for error in row.errors.iter().take(3) {
            println!("error ({} {}): {error}", scenarios[row.scenario].key, row.variant.name());
        }
    }
}

fn print_ratios(scenarios: &[Scenario], rows: &[Row]) {
    println!("\n## After / before (same run)\n");
    println!(
        "| scenario | min after/before | median after/before | max after/before | correction rounds before -> after |"
    );
    println!("|---|---|---|---|---|");
    for (index, scenario) in scenarios.iter().enumerate() {
        let (Some(before), Some(after)) = (find(rows, index, Variant::Before), find(rows, index, Variant::After))
        else {
            continue;
        };
        let (Some(b), Some(a)) = (stats(&before.samples()), stats(&after.samples())) else { continue };
        println!(
            "| {} | {} | {} | {} | {} -> {} |",
            scenario.title(),
            ratio(a.min, b.min),
            ratio(a.median, b.median),
            ratio(a.max, b.max),
            before.rounds(),
            after.rounds()
        );
    }
}

fn print_goals(scenarios: &[Scenario], rows: &[Row], interval_s: f64) {
    println!("\n## Goals (after the fix)\n");
    for (index, scenario) in scenarios.iter().enumerate() {
        let Some(after) = find(rows, index, Variant::After) else { continue };
        let goal = scenario.goal_intervals * interval_s;
        let line = match stats(&after.samples()) {
            Some(s) if after.errors.is_empty() => {
                format!("max {} s: {}", s.max, if s.max.s <= goal { "met" } else { "NOT met" })
            }
            _ => format!("{} errors: NOT met", after.errors.len()),
        };
        println!(
            "- {}: max <= {} heartbeat intervals ({goal:.1} s): {line}",
            scenario.title(),
            scenario.goal_intervals
        );
    }
    let after: Vec<&Row> = rows.iter().filter(|r| r.variant == Variant::After).collect();
    if !after.is_empty() {
        let rounds: u64 = after.iter().map(|r| r.rounds()).sum();
        let evidence: u64 = after.iter().map(|r| r.evidence()).sum();
        println!(
            "- zero correction rounds after the fix: {rounds} rounds, {evidence} loss evidence: {}",
            if rounds == 0 && evidence == 0 { "met" } else { "NOT met" }
        );
    }
}

/// Per timed rebalance (means): coordinator writes and their cost, full-aggregate reads, how much
/// of the wall time the group mutex was held, and CPU of this process and of redis-server.
pub fn print_where_time_goes(scenarios: &[Scenario], rows: &[Row]) {
    println!("\n## Where the time goes (means per timed rebalance, coordinator's store calls)\n");
    println!(
        "| scenario | variant | wall s | writes | ms per write | aggregate KB | full reads (load + changed touch) | \
         MB read | critical sections | mutex held % of wall | bench process CPU s | redis CPU s | CPU % of 2 cores |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let n = row.outcomes.len();
        if n == 0 {
            continue;
        }
        let mut store = TraceCounts::default();
        for o in &row.outcomes {
            store.absorb(&o.store);
        }
        let per = |x: f64| x / n as f64;
        let wall = per(row.outcomes.iter().map(|o| o.wall_s).sum());
        let cpu = per(row.outcomes.iter().map(|o| o.process_cpu_s).sum());
        let redis = per(row.outcomes.iter().map(|o| o.redis_cpu_s).sum());
        let write = store.get("write");
        let (load, touch) = (store.get("load"), store.get("touch_and_check"));
        let bytes = store.get("touch_and_load").bytes + load.bytes + touch.bytes;
        let aggregate_kb = per(row.outcomes.iter().map(|o| o.final_aggregate_bytes as f64).sum()) / 1024.0;
        println!(
            "| {} | {} | {wall:.3} | {:.0} | {:.2} | {aggregate_kb:.0} | {:.0} | {:.1} | {:.0} | {:.0} % | {cpu:.2} | \
             {redis:.2} | {:.0} % |",
            scenarios[row.scenario].key,
            row.variant.name(),
            per(write.calls as f64),
            write.busy.as_secs_f64() * 1e3 / write.calls.max(1) as f64,
            per((load.calls + store.touch_changed + store.get("touch_and_load").calls) as f64),
            per(bytes as f64) / 1e6,
            per(store.get("acquire_mutex").calls.saturating_sub(store.mutex_busy) as f64),
            100.0 * per(store.mutex_held.as_secs_f64()) / wall.max(1e-9),
            100.0 * (cpu + redis) / (2.0 * wall.max(1e-9)),
        );
    }
    println!("\nCritical sections with a write, mean ms per phase (acquire -> load -> compute: cache check, observe, decide, validate, encode -> write -> cache put -> release):");
    for row in rows {
        let mut store = TraceCounts::default();
        for o in &row.outcomes {
            store.absorb(&o.store);
        }
        let n = store.sections.max(1) as f64;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3 / n;
        let p = &store.section_phases;
        println!(
            "- {} {}: {} sections; before load {:.2}, load {:.2}, compute {:.2}, write {:.2}, after write {:.2}, \
             release {:.2}; mutex abandoned {} times, busy {} attempts",
            scenarios[row.scenario].key,
            row.variant.name(),
            store.sections,
            ms(p.before_load),
            ms(p.load),
            ms(p.compute),
            ms(p.write),
            ms(p.after_write),
            ms(p.release),
            store.mutex_abandoned,
            store.mutex_busy,
        );
    }
    for row in rows {
        let codec: Vec<(f64, f64)> = row.outcomes.iter().filter_map(|o| o.codec_ms).collect();
        if let Some((encode, decode)) = codec.last() {
            println!(
                "{} {}: settled aggregate encode {encode:.1} ms, decode (with validation) {decode:.1} ms",
                scenarios[row.scenario].key,
                row.variant.name()
            );
        }
    }
}
