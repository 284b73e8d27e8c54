//! What the data-path bench prints: a line per run, then per row the medians and their ratios to
//! `raw`, round trips and Redis commands per message, what an idle wait costs, and the issue's
//! goals with met / NOT met. Never measures anything itself; it only summarizes [`Sample`]s.

use std::collections::BTreeMap;

use crate::bench::Row;
use crate::counted::Trips;
use crate::library::Fencing;
use crate::workload::{Sample, Workload};

/// Every sample of one row, one per round, in round order.
pub struct RowSamples {
    pub row: Row,
    pub samples: Vec<Sample>,
}

/// Data-path commands, shown first; everything else is summed as `other`: the coordinator's
/// heartbeat and ticker commands, the doorbell's XREAD, and the commands scripts run (INFO
/// commandstats counts those too: the fence check's HMGET, the gate's EXISTS).
const DATA_COMMANDS: [&str; 8] =
    ["xadd", "xreadgroup", "xack", "evalsha", "eval", "xautoclaim", "xgroup|create", "xgroup"];

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// How sure a median is: the distribution-free (sign test) interval around the median of `n`
/// rounds, `[x_(k), x_(n+1-k)]` of the sorted values, whose coverage is
/// `1 - 2 P(Binomial(n, 1/2) <= k - 1)`. The largest `k` with coverage at least `level`, and that
/// coverage; `None` when even `k = 1` (the smallest and largest value) covers less: fewer than six
/// rounds for 95%.
fn median_interval_rank(n: usize, level: f64) -> Option<(usize, f64)> {
    let n = i32::try_from(n).ok()?;
    // P(B <= j) for B ~ Binomial(n, 1/2), summed term by term.
    let mut term = 0.5f64.powi(n);
    let mut below = 0.0;
    let mut best = None;
    for k in 1..=(n / 2) {
        below += term;
        term *= f64::from(n - (k - 1)) / f64::from(k);
        let coverage = 1.0 - 2.0 * below;
        if coverage < level {
            break;
        }
        best = Some((k as usize, coverage));
    }
    best
}

/// The median of `values` and its interval at `level` (see [`median_interval_rank`]), if the
/// values are enough for one.
pub fn median_interval(values: &[f64], level: f64) -> (f64, Option<(f64, f64, f64)>) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let interval = median_interval_rank(sorted.len(), level)
        .map(|(k, coverage)| (sorted[k - 1], sorted[sorted.len() - k], coverage));
    (median(sorted), interval)
}

/// Whether the median of `ratios` is at least `goal`, as far as these rounds can tell: `met` when
/// its 95% interval lies at or above it, `NOT met` when below, `undecided` when the interval
/// holds it (more rounds would tell). With fewer than six rounds, the median alone, said so.
pub fn verdict(ratios: &[f64], goal: f64) -> String {
    verdict_as(ratios, goal, ["met", "NOT met"])
}

/// [`verdict`], naming the outcomes at or above `goal` and below it `said`.
pub fn verdict_as(ratios: &[f64], goal: f64, said: [&str; 2]) -> String {
    let [above, below] = said;
    let (median, interval) = median_interval(ratios, 0.95);
    let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let spread = format!("rounds {lowest:.2}..{highest:.2}");
    match interval {
        Some((low, high, coverage)) => {
            let said = if low >= goal {
                above
            } else if high < goal {
                below
            } else {
                "undecided: more rounds would tell"
            };
            format!(
                "{median:.2}x, {:.0}% interval {low:.2}..{high:.2} over {} rounds, {spread} ({said})",
                coverage * 100.0,
                ratios.len()
            )
        }
        None => {
            let said = if median >= goal { above } else { below };
            format!(
                "{median:.2}x, {spread} ({said} by the median of {} rounds; 6 or more give a 95% interval)",
                ratios.len()
            )
        }
    }
}

/// Checks [`median_interval_rank`] and [`verdict`] against values worked out by hand (the smoke
/// run calls it: this bench has no test harness).
pub fn check_statistics() -> Result<(), String> {
    let ranks: Vec<Option<usize>> =
        [5, 6, 8, 9, 12, 16].iter().map(|&n| median_interval_rank(n, 0.95).map(|r| r.0)).collect();
    // n = 6: 1 - 2/64 = 0.969 (k = 1); n = 8: k = 2 gives 1 - 2 * 9/256 = 0.930, so k = 1;
    // n = 9: 1 - 2 * 10/512 = 0.961 (k = 2); n = 12: 1 - 2 * 79/4096 = 0.961 (k = 3);
    // n = 16: 1 - 2 * 697/65536 = 0.979 (k = 4), k = 5 gives 0.923.
    if ranks != [None, Some(1), Some(1), Some(2), Some(3), Some(4)] {
        return Err(format!("median interval ranks for 5, 6, 8, 9, 12, 16 rounds: {ranks:?}"));
    }
    let cases: [(&[f64], &str); 4] = [
        (&[0.9, 0.85, 0.82, 0.95, 0.88, 0.81], "(met)"),
        (&[0.7, 0.75, 0.72, 0.79, 0.6, 0.71], "(NOT met)"),
        (&[0.7, 0.85, 0.9, 0.75, 0.82, 0.84], "(undecided: more rounds would tell)"),
        (&[0.9, 0.7], "(met by the median of 2 rounds; 6 or more give a 95% interval)"),
    ];
    for (ratios, said) in cases {
        let line = verdict(ratios, 0.8);
        if !line.ends_with(said) {
            return Err(format!("verdict of {ratios:?}: {line:?}, expected it to end {said:?}"));
        }
    }
    Ok(())
}

impl RowSamples {
    fn median_of(&self, f: impl Fn(&Sample) -> f64) -> f64 {
        median(self.samples.iter().map(f).collect())
    }

    /// Median over rounds of this row's value divided by `raw`'s value of the same round.
    fn paired_ratio(&self, raw: &RowSamples, f: impl Fn(&Sample) -> f64) -> f64 {
        median(self.paired_ratios(raw, f))
    }

    /// This row's value divided by `raw`'s value of the same round, per round.
    fn paired_ratios(&self, raw: &RowSamples, f: impl Fn(&Sample) -> f64) -> Vec<f64> {
        self.samples.iter().zip(&raw.samples).map(|(a, b)| f(a) / f(b).max(f64::MIN_POSITIVE)).collect()
    }

    fn messages(&self) -> f64 {
        self.samples.iter().map(|s| s.messages as f64).sum::<f64>().max(1.0)
    }

    fn trips(&self) -> Trips {
        self.samples.iter().fold(Trips::default(), |a, s| add(&a, &s.trips))
    }

    fn idle_trips_per_wait(&self) -> f64 {
        let trips = self.samples.iter().fold(Trips::default(), |a, s| add(&a, &s.idle_trips));
        let waits: usize = self.samples.iter().map(|s| s.idle_waits).sum();
        trips.total() as f64 / waits.max(1) as f64
    }

    /// XREADGROUP round trips per read that acked something, and messages per such read. An
    /// empty read that starts a doorbell wait (`poll_wait` polls once, finds nothing, then waits
    /// on the doorbell) belongs to that wait, not to a busy read: at most one empty read per
    /// doorbell wait is set aside; any further empty read counts against the busy reads.
    fn per_busy_read(&self) -> (f64, f64) {
        let trips = self.trips();
        let busy: usize = self.samples.iter().map(|s| s.busy_reads).sum();
        let busy = busy.max(1) as f64;
        let empty = trips.read_empty.saturating_sub(trips.doorbell);
        ((trips.read_busy + empty) as f64 / busy, self.messages() / busy)
    }

    /// During the timed runs: round trips per doorbell wait (the wait, plus the empty read that
    /// started it, at most one per wait), and the number of waits.
    fn timed_wait_trips(&self) -> (f64, u64) {
        let trips = self.trips();
        let waits = trips.doorbell;
        ((waits + trips.read_empty.min(waits)) as f64 / waits.max(1) as f64, waits)
    }

    fn commands(&self) -> BTreeMap<String, u64> {
        let mut total = BTreeMap::new();
        for sample in &self.samples {
            for (name, calls) in &sample.commands {
                *total.entry(name.clone()).or_insert(0) += calls;
            }
        }
        total
    }
}

fn add(a: &Trips, b: &Trips) -> Trips {
    Trips {
        xadd: a.xadd + b.xadd,
        read_busy: a.read_busy + b.read_busy,
        read_empty: a.read_empty + b.read_empty,
        xack: a.xack + b.xack,
        setup: a.setup + b.setup,
        doorbell: a.doorbell + b.doorbell,
    }
}

pub fn print_run(round: usize, row: Row, s: &Sample) {
    let per = |n: u64| n as f64 / s.messages.max(1) as f64;
    println!(
        "round {round} {:<40} publish {:>7.0}/s consume {:>7.0}/s drain {:>7.0}/s  pub p99 {:>6} us  e2e p99 {:>7.1} ms  round \
         trips/msg {:.3}  idle wait {:.1} trips{}",
        row.title(),
        s.publish_per_s,
        s.consume_per_s,
        s.drain_per_s,
        s.publish_p99_us,
        f64::from(s.e2e_p99_us) / 1e3,
        per(s.trips.total()),
        s.idle_trips.total() as f64 / s.idle_waits.max(1) as f64,
        if s.errors + s.missing + s.duplicates > 0 {
            format!(
                "  ({} errors, first: {}; {} missing, {} duplicates)",
                s.errors,
                s.first_error.as_deref().unwrap_or("-"),
                s.missing,
                s.duplicates
            )
        } else {
            String::new()
        }
    );
}

pub fn print_tables(rows: &[RowSamples], workload: &Workload) {
    let Some(raw) = rows.iter().find(|r| r.row == Row::Raw) else {
        println!("\n(no raw row: no ratios)");
        return;
    };
    println!("\nmedians over {} rounds; ratios are medians of same-round ratios to raw:", raw.samples.len());
    println!(
        "{:<40} {:>10} {:>6} {:>10} {:>6} {:>8} {:>8} {:>9} {:>9} {:>6} {:>9} {:>6}",
        "row",
        "publish/s",
        "x raw",
        "consume/s",
        "x raw",
        "pub p50",
        "pub p99",
        "e2e p50",
        "e2e p99",
        "x raw",
        "drain/s",
        "x raw"
    );
    println!(
        "{:<40} {:>10} {:>6} {:>10} {:>6} {:>8} {:>8} {:>9} {:>9} {:>6} {:>9} {:>6}",
        "", "", "", "", "", "us", "us", "ms", "ms", "p99", "", ""
    );
    for r in rows {
        println!(
            "{:<40} {:>10.0} {:>6.2} {:>10.0} {:>6.2} {:>8.0} {:>8.0} {:>9.1} {:>9.1} {:>6.2} {:>9.0} {:>6.2}",
            r.row.title(),
            r.median_of(|s| s.publish_per_s),
            r.paired_ratio(raw, |s| s.publish_per_s),
            r.median_of(|s| s.consume_per_s),
            r.paired_ratio(raw, |s| s.consume_per_s),
            r.median_of(|s| f64::from(s.publish_p50_us)),
            r.median_of(|s| f64::from(s.publish_p99_us)),
            r.median_of(|s| f64::from(s.e2e_p50_us)) / 1e3,
            r.median_of(|s| f64::from(s.e2e_p99_us)) / 1e3,
            r.paired_ratio(raw, |s| f64::from(s.e2e_p99_us)),
            r.median_of(|s| s.drain_per_s),
            r.paired_ratio(raw, |s| s.drain_per_s),
        );
    }

    println!(
        "\nclient round trips per message during the timed runs (all rounds; heartbeats and routing not counted):"
    );
    println!(
        "{:<40} {:>7} {:>10} {:>10} {:>7} {:>7} {:>7} {:>6} | {:>14} {:>12}",
        "row", "xadd", "read busy", "read empty", "xack", "setup", "total", "x raw", "reads/busy rd", "msgs/busy rd"
    );
    let raw_total = raw.trips().total() as f64 / raw.messages();
    for r in rows {
        let (t, m) = (r.trips(), r.messages());
        let (reads, msgs) = r.per_busy_read();
        println!(
            "{:<40} {:>7.3} {:>10.4} {:>10.4} {:>7.3} {:>7.4} {:>7.3} {:>6.2} | {:>14.2} {:>12.1}",
            r.row.title(),
            t.xadd as f64 / m,
            t.read_busy as f64 / m,
            t.read_empty as f64 / m,
            t.xack as f64 / m,
            t.setup as f64 / m,
            t.total() as f64 / m,
            (t.total() as f64 / m) / raw_total.max(f64::MIN_POSITIVE),
            reads,
            msgs,
        );
    }

    println!(
        "\nRedis commands per message (INFO commandstats, all rounds; `other` = the coordinator's heartbeat and ticker \
         commands, the doorbell's XREAD, and the commands scripts ran, which commandstats counts beside their EVALSHA):"
    );
    for r in rows {
        let m = r.messages();
        let commands = r.commands();
        let data: Vec<String> = DATA_COMMANDS
            .iter()
            .filter_map(|name| commands.get(*name).map(|calls| format!("{name} {:.3}", *calls as f64 / m)))
            .collect();
        let other: Vec<(&String, &u64)> =
            commands.iter().filter(|(name, _)| !DATA_COMMANDS.contains(&name.as_str())).collect();
        let other_total: u64 = other.iter().map(|(_, c)| **c).sum();
        let all: u64 = commands.values().sum();
        println!(
            "  {:<40} {:.3} = {} + other {:.4} ({})",
            r.row.title(),
            all as f64 / m,
            data.join(" + "),
            other_total as f64 / m,
            other.iter().map(|(n, c)| format!("{n} {c}")).collect::<Vec<_>>().join(", ")
        );
    }

    println!(
        "\nCPU per message, medians (us; redis-server from INFO cpu, this process from /proc/self/stat in 10 ms ticks, \
         so the client column is coarse):"
    );
    println!(
        "{:<40} {:>11} {:>6} {:>11} {:>6} {:>13} {:>6}",
        "row", "redis busy", "x raw", "redis drain", "x raw", "bench process", "x raw"
    );
    for r in rows {
        println!(
            "{:<40} {:>11.2} {:>6.2} {:>11.2} {:>6.2} {:>13.1} {:>6.2}",
            r.row.title(),
            r.median_of(|s| s.redis_cpu_us_per_msg),
            r.paired_ratio(raw, |s| s.redis_cpu_us_per_msg),
            r.median_of(|s| s.drain_redis_cpu_us_per_msg),
            r.paired_ratio(raw, |s| s.drain_redis_cpu_us_per_msg),
            r.median_of(|s| s.client_cpu_us_per_msg),
            r.paired_ratio(raw, |s| s.client_cpu_us_per_msg),
        );
    }

    println!("\nidle waits ({} ms each, nothing published): client round trips per wait", workload.idle_wait_ms);
    let raw_idle = raw.idle_trips_per_wait();
    for r in rows {
        let per = r.idle_trips_per_wait();
        println!("  {:<40} {:>6.2}  ({:+.2} vs raw)", r.row.title(), per, per - raw_idle);
    }
}

/// The goals, for the fencing=on row (fencing=off when that row was left out): against
/// `raw` (what the libraries cost) and against fencing=off (what fencing adds), side by side.
pub fn print_goals(rows: &[RowSamples], workload: &Workload) {
    let Some(raw) = rows.iter().find(|r| r.row == Row::Raw) else { return };
    let pick = |fencing| rows.iter().find(|r| r.row == Row::Library { fencing, poll_idle_ms: None });
    let Some(lib) = pick(Fencing::On).or_else(|| pick(Fencing::Off)) else { return };
    let off = pick(Fencing::Off).filter(|off| off.row != lib.row);
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("\ngoals ({}):", lib.row.title());
    // Same-round ratios: the machine's load moves both rows of a round alike. The verdict asks
    // whether their median is at the goal with 95% confidence (one run of the same build printed
    // 0.64x and the next 0.85x: a median of a few rounds alone decides by chance).
    println!("  consume throughput >= 0.8x raw (the median of the same-round ratios):");
    println!("    while publishing: {}", verdict(&lib.paired_ratios(raw, |s| s.consume_per_s), 0.8));
    println!("    draining a backlog: {}", verdict(&lib.paired_ratios(raw, |s| s.drain_per_s), 0.8));
    if let Some(script) =
        pick(Fencing::OnScripted).filter(|_| lib.row == Row::Library { fencing: Fencing::On, poll_idle_ms: None })
    {
        println!(
            "    gated reads vs script reads (fencing=on both, paired rounds): {:.2}x while publishing, {:.2}x draining",
            lib.paired_ratio(script, |s| s.consume_per_s),
            lib.paired_ratio(script, |s| s.drain_per_s)
        );
    }
    if let Some(script) =
        pick(Fencing::OnScriptedAcks).filter(|_| lib.row == Row::Library { fencing: Fencing::On, poll_idle_ms: None })
    {
        println!(
            "    watched acks vs script acks (fencing=on both, paired rounds): {} while publishing; {} draining",
            verdict_as(&lib.paired_ratios(script, |s| s.consume_per_s), 1.0, ["faster", "slower"]),
            verdict_as(&lib.paired_ratios(script, |s| s.drain_per_s), 1.0, ["faster", "slower"])
        );
    }
    let per_msg = |r: &RowSamples| {
        let t = r.trips();
        ((t.read_busy + t.read_empty) as f64 / r.messages(), t.xack as f64 / r.messages())
    };
    let (lib_reads, lib_msgs) = lib.per_busy_read();
    let (raw_reads, raw_msgs) = raw.per_busy_read();
    let ((lib_rpm, lib_apm), (raw_rpm, raw_apm)) = (per_msg(lib), per_msg(raw));
    println!(
        "  no extra round trip per busy read: {lib_reads:.2} read round trips per read that delivered ({lib_msgs:.1} \
         msgs), {lib_rpm:.4} per message, {lib_apm:.3} ack round trips per message; raw {raw_reads:.2} ({raw_msgs:.1} \
         msgs), {raw_rpm:.4}, {raw_apm:.3}: vs raw {}",
        met(lib_reads <= raw_reads + 1e-9)
    );
    if let Some(off) = off {
        let (off_reads, off_msgs) = off.per_busy_read();
        let (off_rpm, off_apm) = per_msg(off);
        println!(
            "    fencing=off: {off_reads:.2} ({off_msgs:.1} msgs), {off_rpm:.4}, {off_apm:.3}: what fencing adds per busy \
             read {:+.2} ({}), per message {:+.4} reads {:+.3} acks",
            lib_reads - off_reads,
            met(lib_reads <= off_reads + 0.05),
            lib_rpm - off_rpm,
            lib_apm - off_apm
        );
    }
    let (wait_trips, waits) = lib.timed_wait_trips();
    println!(
        "    while publishing, {waits} doorbell waits cost {wait_trips:.2} round trips each (the empty read that \
         started the wait, then the wait), against one blocking XREADGROUP for raw"
    );
    let extra = lib.idle_trips_per_wait() - raw.idle_trips_per_wait();
    print!(
        "  at most one extra round trip per idle wait ({} ms): {:.2} per wait, {extra:+.2} vs raw ({})",
        workload.idle_wait_ms,
        lib.idle_trips_per_wait(),
        met(extra <= 1.0 + 1e-9)
    );
    match off {
        Some(off) => println!(", {:+.2} vs fencing=off", lib.idle_trips_per_wait() - off.idle_trips_per_wait()),
        None => println!(),
    }
}

/// Acks that ride on the next read (`raw-piggy`, `lib-on-overlap`, when run): each against the
/// same row with acks before the next read, in the same rounds.
pub fn print_piggyback(rows: &[RowSamples], workload: &Workload) {
    let find = |row: Row| rows.iter().find(|r| r.row == row);
    let pairs = [
        (find(Row::RawPiggyback), find(Row::Raw)),
        (find(Row::LibOverlap), find(Row::Library { fencing: Fencing::On, poll_idle_ms: None })),
    ];
    let mut header = false;
    for (riding, before) in pairs {
        let (Some(riding), Some(before)) = (riding, before) else { continue };
        if !header {
            println!("\nacks riding on the next read (holding {:?}), paired rounds:", workload.hold);
            header = true;
        }
        println!(
            "  {:<40} {:.2}x of {} while publishing, {:.2}x draining",
            riding.row.title(),
            riding.paired_ratio(before, |s| s.consume_per_s),
            before.row.key(),
            riding.paired_ratio(before, |s| s.drain_per_s)
        );
    }
}
