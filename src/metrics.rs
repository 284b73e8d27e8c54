//! A small, dependency-free metrics registry rendered in the Prometheus text exposition format.
//!
//! Counters, gauges and histograms keyed by name and sorted labels, stored in `BTreeMap`s so the
//! rendering is deterministic (the simulation hashes traces). Shared by the coordinator service and
//! the client libraries; names follow Prometheus conventions (`_total`, `_seconds`, base units).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio::time::Instant;

/// Label pairs, sorted by name.
pub type Labels = Vec<(&'static str, String)>;

/// Bucket bounds (seconds) of every histogram: 100 µs to 10 s. Steps of 2.5 and 2 per decade up to
/// 10 s: a mutex give-up takes 0.2–0.4 s and clients time out at 2 s, which one bucket from 0.1 s
/// to 1 s and one to 10 s could not tell apart.
const BUCKETS_S: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Clone, Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS_S.len()],
    sum: f64,
    count: u64,
}

/// A gauge whose value is a distance in time, computed when read (so a scrape always sees the
/// current value, not the one at the last update).
#[derive(Clone, Copy, Debug)]
enum ClockGauge {
    /// Seconds left until the instant; 0 once it passed.
    Until(Instant),
    /// Seconds elapsed since the instant.
    Since(Instant),
}

impl ClockGauge {
    fn seconds_at(self, now: Instant) -> f64 {
        match self {
            ClockGauge::Until(deadline) => deadline.saturating_duration_since(now).as_secs_f64(),
            ClockGauge::Since(since) => now.saturating_duration_since(since).as_secs_f64(),
        }
    }
}

#[derive(Debug, Default)]
struct Families {
    help: BTreeMap<&'static str, (&'static str, &'static str)>,
    values: BTreeMap<(&'static str, Labels), f64>,
    clocks: BTreeMap<(&'static str, Labels), ClockGauge>,
    histograms: BTreeMap<(&'static str, Labels), Histogram>,
}

/// A counter's name and help, declared once so that its increments and its registration at 0
/// ([`Metrics::declare`]) cannot disagree.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    pub name: &'static str,
    pub help: &'static str,
}

/// A registry of metric values.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Families>,
    /// Whether producers of per-member series (a `member` label) should record them. Off by
    /// default: member ids are identifiers an unauthenticated scraper should not learn, and one
    /// series per member is unbounded in cardinality. A policy the producers read
    /// ([`Self::member_series`]); the registry itself records whatever it is given.
    member_series: AtomicBool,
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Families) -> R) -> R {
        // A poisoned lock only means another thread panicked mid-update; the map is still usable.
        let mut guard = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }

    /// Opts in to (or out of) per-member series; see [`Self::member_series`].
    pub fn set_member_series(&self, enabled: bool) {
        self.member_series.store(enabled, Ordering::Relaxed);
    }

    /// True when per-member series (`member` label) should be recorded.
    pub fn member_series(&self) -> bool {
        self.member_series.load(Ordering::Relaxed)
    }

    /// Adds `by` to a counter.
    pub fn inc_by(&self, name: &'static str, help: &'static str, labels: Labels, by: f64) {
        self.with(|f| {
            f.help.insert(name, ("counter", help));
            *f.values.entry((name, labels)).or_default() += by;
        });
    }

    /// Adds one to a counter.
    pub fn inc(&self, name: &'static str, help: &'static str, labels: Labels) {
        self.inc_by(name, help, labels, 1.0);
    }

    /// Adds one to a declared counter.
    pub fn count(&self, counter: &Counter, labels: Labels) {
        self.inc_by(counter.name, counter.help, labels, 1.0);
    }

    /// Adds `by` to a declared counter.
    pub fn count_by(&self, counter: &Counter, labels: Labels, by: f64) {
        self.inc_by(counter.name, counter.help, labels, by);
    }

    /// Registers a counter's series at 0 unless it exists (then nothing changes). Prometheus sees
    /// a series from its first sample: one that first appears at 1 reads as no increase, so an
    /// `increase(...) > 0` alert would miss the first event of each series.
    pub fn declare(&self, counter: &Counter, labels: Labels) {
        self.with(|f| {
            f.help.insert(counter.name, ("counter", counter.help));
            f.values.entry((counter.name, labels)).or_insert(0.0);
        });
    }

    /// Sets a gauge.
    pub fn set(&self, name: &'static str, help: &'static str, labels: Labels, value: f64) {
        self.with(|f| {
            f.help.insert(name, ("gauge", help));
            f.values.insert((name, labels), value);
        });
    }

    /// Sets a gauge that reads as the seconds left until `deadline` (0 once it passed), measured on
    /// the `tokio::time` clock whenever the registry is rendered or read.
    pub fn set_until(&self, name: &'static str, help: &'static str, labels: Labels, deadline: Instant) {
        self.with(|f| {
            f.help.insert(name, ("gauge", help));
            f.clocks.insert((name, labels), ClockGauge::Until(deadline));
        });
    }

    /// Sets a gauge that reads as the seconds elapsed since `since`, measured when read.
    pub fn set_since(&self, name: &'static str, help: &'static str, labels: Labels, since: Instant) {
        self.with(|f| {
            f.help.insert(name, ("gauge", help));
            f.clocks.insert((name, labels), ClockGauge::Since(since));
        });
    }

    /// Removes every series of a gauge whose labels contain `(key, value)` (e.g. a removed member).
    pub fn forget(&self, name: &'static str, key: &'static str, value: &str) {
        self.forget_matching(name, &[(key, value)]);
    }

    /// Removes every series of a gauge whose labels contain all of `pairs` (e.g. a member of one
    /// group: member ids are the clients' own and repeat across groups).
    pub fn forget_matching(&self, name: &'static str, pairs: &[(&str, &str)]) {
        let matches =
            |labels: &Labels| pairs.iter().all(|(key, value)| labels.iter().any(|(k, v)| k == key && v == value));
        let other = |n: &&'static str, labels: &Labels| *n != name || !matches(labels);
        self.with(|f| {
            f.values.retain(|(n, labels), _| other(n, labels));
            f.clocks.retain(|(n, labels), _| other(n, labels));
        });
    }

    /// Removes the series of the gauges `names` of the `members` of `group` (labels `group` and
    /// `member`), in one pass over the registry: a write that removed ten thousand members (a mass
    /// expiry) scanned the whole registry twice per member under the lock every request's metrics
    /// take, seconds with many groups (a scale review).
    pub fn forget_members(&self, names: &[&'static str], group: &str, members: &[String]) {
        if members.is_empty() {
            return;
        }
        let members: std::collections::BTreeSet<&str> = members.iter().map(String::as_str).collect();
        fn label<'l>(labels: &'l Labels, key: &str) -> Option<&'l str> {
            labels.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str())
        }
        let other = |n: &&'static str, labels: &Labels| {
            !names.contains(n)
                || label(labels, "group") != Some(group)
                || !label(labels, "member").is_some_and(|member| members.contains(member))
        };
        self.with(|f| {
            f.values.retain(|(n, labels), _| other(n, labels));
            f.clocks.retain(|(n, labels), _| other(n, labels));
        });
    }

    /// Removes every series of every metric (counters, gauges, histograms) whose labels contain
    /// `(key, value)`, except the metrics named in `except`: a deleted group's or member's series
    /// must not outlive it, or the registry grows with every id that ever came and went.
    pub fn forget_labelled(&self, key: &'static str, value: &str, except: &[&str]) {
        let other = |n: &&'static str, labels: &Labels| {
            except.contains(n) || !labels.iter().any(|(k, v)| *k == key && v == value)
        };
        self.with(|f| {
            f.values.retain(|(n, labels), _| other(n, labels));
            f.clocks.retain(|(n, labels), _| other(n, labels));
            f.histograms.retain(|(n, labels), _| other(n, labels));
        });
    }

    /// Removes the series named in `names` whose label `key` is `value` (a group's tick gauges on
    /// an instance that no longer ticks the group).
    pub fn forget_named(&self, names: &[&str], key: &'static str, value: &str) {
        let ours = |n: &&'static str, labels: &Labels| {
            names.contains(n) && labels.iter().any(|(k, v)| *k == key && v == value)
        };
        self.with(|f| {
            f.values.retain(|(n, labels), _| !ours(n, labels));
            f.clocks.retain(|(n, labels), _| !ours(n, labels));
            f.histograms.retain(|(n, labels), _| !ours(n, labels));
        });
    }

    /// Every value the label `key` has in some series (of any kind), leaving out the metrics
    /// named in `except`.
    pub fn label_values(&self, key: &str, except: &[&str]) -> BTreeSet<String> {
        let mut values = BTreeSet::new();
        let mut add = |name: &'static str, labels: &Labels| {
            if !except.contains(&name) {
                values.extend(labels.iter().filter(|(k, _)| *k == key).map(|(_, v)| v.clone()));
            }
        };
        self.with(|f| {
            f.values.keys().for_each(|(n, l)| add(n, l));
            f.clocks.keys().for_each(|(n, l)| add(n, l));
            f.histograms.keys().for_each(|(n, l)| add(n, l));
        });
        values
    }

    /// How many series (of any kind) carry a label named `key`.
    pub fn labelled_series(&self, key: &str) -> usize {
        let has = |labels: &Labels| labels.iter().any(|(k, _)| *k == key);
        self.with(|f| {
            f.values.keys().filter(|(_, l)| has(l)).count()
                + f.clocks.keys().filter(|(_, l)| has(l)).count()
                + f.histograms.keys().filter(|(_, l)| has(l)).count()
        })
    }

    /// Records one observation (seconds) in a histogram.
    pub fn observe(&self, name: &'static str, help: &'static str, labels: Labels, seconds: f64) {
        self.with(|f| {
            f.help.insert(name, ("histogram", help));
            let h = f.histograms.entry((name, labels)).or_default();
            for (i, bound) in BUCKETS_S.iter().enumerate() {
                if seconds <= *bound {
                    h.counts[i] += 1;
                }
            }
            h.sum += seconds;
            h.count += 1;
        });
    }

    /// The current value of a counter or gauge series (tests and checkers).
    pub fn value(&self, name: &'static str, labels: &Labels) -> f64 {
        let key = (name, labels.clone());
        let now = Instant::now();
        self.with(|f| match f.clocks.get(&key) {
            Some(clock) => clock.seconds_at(now),
            None => f.values.get(&key).copied().unwrap_or(0.0),
        })
    }

    /// The sum of every series of a counter or gauge, across labels.
    pub fn total(&self, name: &str) -> f64 {
        self.with(|f| f.values.iter().filter(|((n, _), _)| *n == name).map(|(_, v)| v).sum())
    }

    /// Renders every metric in the Prometheus text format, sorted by name and labels.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let now = Instant::now();
        // Formatted from a copy: every request's counters wait for this lock, and formatting tens
        // of thousands of series under it stalled them (and the probes) for each scrape.
        let snapshot = self.with(|f| Families {
            help: f.help.clone(),
            values: f.values.clone(),
            clocks: f.clocks.clone(),
            histograms: f.histograms.clone(),
        });
        {
            let f = &snapshot;
            let mut out = String::new();
            for (name, (kind, help)) in &f.help {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for ((_, labels), value) in f.values.range((*name, Vec::new())..).take_while(|((n, _), _)| n == name) {
                    let _ = writeln!(out, "{name}{} {value}", render_labels(labels, None));
                }
                for ((_, labels), clock) in f.clocks.range((*name, Vec::new())..).take_while(|((n, _), _)| n == name) {
                    let _ = writeln!(out, "{name}{} {}", render_labels(labels, None), clock.seconds_at(now));
                }
                for ((_, labels), h) in f.histograms.range((*name, Vec::new())..).take_while(|((n, _), _)| n == name) {
                    for (i, bound) in BUCKETS_S.iter().enumerate() {
                        let _ = writeln!(out, "{name}_bucket{} {}", render_labels(labels, Some(*bound)), h.counts[i]);
                    }
                    let inf = render_labels(labels, Some(f64::INFINITY));
                    let _ = writeln!(out, "{name}_bucket{inf} {}", h.count);
                    let _ = writeln!(out, "{name}_sum{} {}", render_labels(labels, None), h.sum);
                    let _ = writeln!(out, "{name}_count{} {}", render_labels(labels, None), h.count);
                }
            }
            out
        }
    }
}

fn render_labels(labels: &Labels, le: Option<f64>) -> String {
    let mut parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    if let Some(le) = le {
        parts.push(if le.is_infinite() { "le=\"+Inf\"".into() } else { format!("le=\"{le}\"") });
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_histograms_in_order() {
        let m = Metrics::new();
        m.inc("b_total", "b help", vec![("status", "OK".into())]);
        m.inc("b_total", "b help", vec![("status", "OK".into())]);
        m.set("a_gauge", "a help", vec![], 3.0);
        m.observe("c_seconds", "c help", vec![], 0.002);
        let text = m.render();
        let a = text.find("a_gauge 3").expect("gauge rendered");
        let b = text.find("b_total{status=\"OK\"} 2").expect("counter rendered");
        assert!(a < b, "sorted by name:\n{text}");
        assert!(text.contains("c_seconds_bucket{le=\"0.001\"} 0"));
        assert!(text.contains("c_seconds_bucket{le=\"0.0025\"} 1"));
        assert!(text.contains("c_seconds_count 1"));
        assert_eq!(m.total("b_total"), 2.0);
        m.forget("b_total", "status", "OK");
        assert_eq!(m.total("b_total"), 0.0);
    }

    #[test]
    fn forget_members_removes_the_named_gauges_of_those_members_of_that_group_only() {
        let m = Metrics::new();
        let of = |g: &str, member: &str| vec![("group", g.to_string()), ("member", member.to_string())];
        for member in ["a", "b", "c"] {
            m.set("age_seconds", "h", of("g1", member), 1.0);
            m.set_since("revoking", "h", of("g1", member), Instant::now());
            // The same member ids in another group, and another gauge of the group's members.
            m.set("age_seconds", "h", of("g2", member), 1.0);
            m.set("other_gauge", "h", of("g1", member), 1.0);
        }
        m.forget_members(&["age_seconds", "revoking"], "g1", &["a".to_string(), "c".to_string()]);
        let text = m.render();
        for gone in ["age_seconds{group=\"g1\",member=\"a\"}", "revoking{group=\"g1\",member=\"c\"}"] {
            assert!(!text.contains(gone), "{gone} still there:\n{text}");
        }
        assert_eq!(m.value("age_seconds", &of("g1", "b")), 1.0);
        assert!(text.contains("revoking{group=\"g1\",member=\"b\"}"), "{text}");
        for member in ["a", "b", "c"] {
            assert_eq!(m.value("age_seconds", &of("g2", member)), 1.0, "another group's {member}");
            assert_eq!(m.value("other_gauge", &of("g1", member)), 1.0, "another gauge of {member}");
        }
    }

    #[test]
    fn forget_labelled_removes_every_kind_of_series_of_that_label_value_except_the_named_ones() {
        let m = Metrics::new();
        let of = |g: &str| vec![("group", g.to_string())];
        m.inc("a_total", "h", of("gone"));
        m.inc("kept_total", "h", of("gone"));
        m.set("b_gauge", "h", vec![("group", "gone".into()), ("member", "x".into())], 1.0);
        m.set_since("c_seconds", "h", of("gone"), Instant::now());
        m.observe("d_seconds", "h", of("gone"), 0.1);
        m.inc("a_total", "h", of("stays"));
        m.inc("e_total", "h", vec![]);
        assert_eq!(m.labelled_series("group"), 6);
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(m.label_values("group", &[]), names(&["gone", "stays"]));
        assert_eq!(m.label_values("member", &[]), names(&["x"]));
        m.forget_labelled("group", "gone", &["kept_total"]);
        assert_eq!(m.labelled_series("group"), 2);
        assert_eq!(m.label_values("group", &["kept_total"]), names(&["stays"]));
        let text = m.render();
        assert!(
            !text.contains("a_total{group=\"gone\"}") && !text.contains("d_seconds_count{group=\"gone\"}"),
            "{text}"
        );
        assert!(text.contains("kept_total{group=\"gone\"} 1"), "{text}");
        assert!(text.contains("a_total{group=\"stays\"} 1") && text.contains("e_total 1"), "{text}");
    }

    #[test]
    fn clock_gauges_read_the_time_left_or_elapsed_when_rendered() {
        use std::time::Duration;
        let m = Metrics::new();
        let now = Instant::now();
        let labels = |who: &str| vec![("member", who.to_string())];
        m.set_until("lease_remaining_seconds", "h", labels("a"), now + Duration::from_secs(60));
        m.set_until(
            "lease_remaining_seconds",
            "h",
            labels("b"),
            now.checked_sub(Duration::from_secs(1)).unwrap_or(now),
        );
        m.set_since("cache_age_seconds", "h", vec![], now.checked_sub(Duration::from_secs(5)).unwrap_or(now));
        let left = m.value("lease_remaining_seconds", &labels("a"));
        assert!(left > 59.0 && left <= 60.0, "{left}");
        assert_eq!(m.value("lease_remaining_seconds", &labels("b")), 0.0, "a passed deadline reads 0");
        assert!(m.value("cache_age_seconds", &vec![]) >= 5.0);
        let text = m.render();
        assert!(text.contains("# TYPE lease_remaining_seconds gauge"), "{text}");
        assert!(text.contains("lease_remaining_seconds{member=\"b\"} 0\n"), "{text}");
        m.forget("lease_remaining_seconds", "member", "a");
        assert!(!m.render().contains("member=\"a\""));
    }

    /// Every metric name the code emits is documented in `docs/metrics.md`, and every metric name
    /// the docs, runbooks, tests, benches and examples mention is one the code emits (a runbook once pointed at a counter
    /// that never existed, and one counter was missing from the table that claims to list them).
    #[test]
    fn the_metric_docs_name_exactly_the_metrics_the_code_emits() {
        fn files(dir: &std::path::Path, ext: &str, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("read dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    files(&path, ext, out);
                } else if path.extension().is_some_and(|e| e == ext) {
                    out.push(path);
                }
            }
        }
        /// The `rsc_...` names in `text`; `quoted`: only string literals (the code's names).
        fn names(text: &str, quoted: bool) -> BTreeSet<String> {
            let mut found = BTreeSet::new();
            for (at, _) in text.match_indices("rsc_") {
                if quoted && !text[..at].ends_with('"') {
                    continue;
                }
                let rest = &text[at..];
                let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c == '_')).unwrap_or(rest.len());
                if quoted && !rest[end..].starts_with('"') {
                    continue;
                }
                let name = &rest[..end];
                // `rsc_group_*` in prose names a family; histogram series carry suffixes.
                if !name.ends_with('_') {
                    let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s));
                    found.insert(base.unwrap_or(name).to_string());
                }
            }
            found
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let (mut sources, mut docs) = (Vec::new(), Vec::new());
        files(&root.join("src"), "rs", &mut sources);
        files(&root.join("docs"), "md", &mut docs);
        docs.push(root.join("README.md"));
        let read = |p: &std::path::PathBuf| std::fs::read_to_string(p).expect("read");
        let emitted: BTreeSet<String> = sources.iter().flat_map(|p| names(&read(p), true)).collect();
        let table = names(&std::fs::read_to_string(root.join("docs/metrics.md")).expect("metrics.md"), false);
        let mentioned: BTreeSet<String> = docs.iter().flat_map(|p| names(&read(p), false)).collect();
        assert!(emitted.len() > 30, "the scan found the code's metrics: {emitted:?}");
        let undocumented: Vec<_> = emitted.difference(&table).collect();
        assert!(undocumented.is_empty(), "emitted but not in docs/metrics.md: {undocumented:?}");
        let unknown: Vec<_> = mentioned.difference(&emitted).collect();
        assert!(unknown.is_empty(), "named in docs but never emitted: {unknown:?}");
        // Tests read series by name, and reading an absent series gives 0: an assertion of a
        // zero on a name nothing emits passes whatever happens (one did).
        let mut others = Vec::new();
        for dir in ["tests", "benches", "examples"] {
            files(&root.join(dir), "rs", &mut others);
        }
        let asserted: BTreeSet<String> = others.iter().flat_map(|p| names(&read(p), true)).collect();
        let stray: Vec<_> = asserted.difference(&emitted).collect();
        assert!(stray.is_empty(), "named in tests, benches or examples but never emitted: {stray:?}");
    }
}
