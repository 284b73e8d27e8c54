//! The data path against a real `redis-server` (not a test: it prints numbers): publish and
//! consume throughput, publish and end-to-end latency, and Redis round trips and commands per
//! message, for the producer and consumer libraries next to raw `redis` crate loops doing the
//! same work (issue #10).
//!
//! Starts its own `redis-server` on a free loopback port (the integration-test harness in
//! `tests/support`) and a coordinator in this process (`Coordinator<RedisStore>`, ticker
//! running). Rows:
//! - `raw`: the `redis` crate directly — one XADD per message; per consumer one `XREADGROUP
//!   COUNT n BLOCK w` over its shards and one pipelined XACK per read (the physical limit);
//! - `library fencing=on` / `library fencing=off`: `Producer::publish`, `Consumer::poll_wait` +
//!   `Consumer::ack_all` per polled batch (fenced: one read script and one ack script per batch;
//!   unfenced: one XACK per shard, concurrently), on a group created with the
//!   default config and `GroupConfig::fencing` set (on: reads, acks and claims go through the
//!   fence scripts);
//! - `library fencing=on, script reads`: fencing on with every fenced read through the read
//!   script (`RedisStoreOptions::fenced_read_gates` off), as before reads went through gates:
//!   the side by side of what gates save;
//! - `library fencing=on, script acks`: fencing on with every fenced batch ack through the ack
//!   script (`RedisStoreOptions::watched_acks` off), as before watched acks: the side by side of
//!   what acking by transaction saves;
//! - `library fencing=on, per-entry events`: fencing on, with the consumers' event sink asking
//!   for `EntryDelivered` and `EntryAcked` (`EventSink::wants_entry_events`), which the other
//!   library rows' sink (like the library's `NoopSink` and `MetricsSink`) does not: what building
//!   one event per delivery and per ack costs;
//! - `library fencing=on poll_idle=5ms`: the consumers' `poll_idle_ms` at 5 instead of the
//!   library's 50 (set in the `ConsumerConfig` this bench builds), to separate the cost of
//!   polling from the rest (`lib-off-idle5` on request);
//! - on request, acks that ride on the next read: `raw-piggy` (a held batch's XACKs pipelined
//!   with the next, non-blocking, XREADGROUP) and `lib-on-overlap` (fencing on, a held batch's
//!   `Consumer::ack_all` sent together with the next `Consumer::poll`, each still returning only
//!   after Redis answered). Which batches are held: `DP_HOLD=full` (default: only full ones, a
//!   backlog) or `DP_HOLD=every`. A held batch counts as consumed when its ack returned.
//!
//! One run of a row: `P` producer tasks publish `M` messages (a 100-byte payload carrying the
//! publish time) in a closed loop while `C` consumer tasks read and ack until all `M` were acked;
//! then every consumer waits idle a few times (nothing published) to count what an idle wait
//! costs. Measured per run: publish msgs/s (first publish to last publish), consume msgs/s (first
//! publish to last ack), publish latency p50/p99, end-to-end latency (publish start to ack)
//! p50/p99, client round trips by command (counted at the store boundary for the libraries, by the
//! raw loops themselves), and Redis commands (`INFO commandstats` deltas: these include the
//! coordinator's heartbeat and ticker commands and any command a Lua script runs). Rows are
//! interleaved round by round (the order rotates) and reported as medians and ratios to `raw`,
//! because the machine is shared and noisy.
//!
//! Run: `cargo bench --bench data_path`; `RSC_BENCH_QUICK=1 cargo bench --bench data_path` for a
//! short run. Knobs (environment): `DP_MESSAGES` per run (20000; quick 5000), `DP_ROUNDS` (5;
//! quick 2), `DP_PRODUCERS` (4), `DP_CONSUMERS` (4), `DP_SHARDS` (8), `DP_BATCH` entries per read
//! (100), `DP_IDLE_WAITS` per consumer (5; quick 2) of `DP_IDLE_WAIT_MS` (200), `DP_ROWS`
//! (comma-separated keys; default `raw,lib-on,lib-on-events,lib-on-script,lib-on-script-acks,lib-off,lib-on-idle5`; also
//! `lib-off-idle5`, `raw-piggy`, `lib-on-overlap`; `DP_HOLD` above).
//! A library row whose clients cannot start (e.g. a store without the fence scripts) is left out
//! with its error printed; the smoke run fails instead.
//! Without `--bench` (how `cargo test --all-targets` runs it) a small smoke run checks that every
//! row starts and acks every message without errors, and exactly once unless a rebalance or a
//! failed heartbeat disturbed the run; it exits non-zero otherwise. (`.ci/test-all` runs neither.)
//! The throughput goal's verdict is the median of the same-round ratios with its 95%
//! distribution-free interval (`met`, `NOT met`, or `undecided` when the interval holds 0.8x):
//! `DP_ROUNDS=12` or more gives one that a noisy machine does not flip from run to run.

// The consumer's future nests the in-process coordinator's heartbeat future, deeper than the
// compiler's default query depth allows when it computes their layout.
#![recursion_limit = "256"]

// The integration-test harness; this binary uses only `RedisServer`.
#[cfg(not(madsim))]
#[allow(unused_imports)]
#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(not(madsim))]
#[path = "data_path/counted.rs"]
mod counted;
#[cfg(not(madsim))]
#[path = "data_path/library.rs"]
mod library;
#[cfg(not(madsim))]
#[path = "data_path/raw.rs"]
mod raw;
#[cfg(not(madsim))]
#[path = "data_path/report.rs"]
mod report;
#[cfg(not(madsim))]
#[path = "data_path/workload.rs"]
mod workload;

#[cfg(madsim)]
fn main() {
    eprintln!("data_path needs a real redis-server; build it without --cfg madsim");
}

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    bench::main()
}

#[cfg(not(madsim))]
mod bench {
    use std::process::ExitCode;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::counted::TripCounters;
    use crate::library::{Fencing, LibOptions, LibRig};
    use crate::raw::{RawGroup, RawPublisher, RawSubscriber};
    use crate::report::{print_goals, print_piggyback, print_run, print_tables, RowSamples};
    use crate::support::RedisServer;
    use crate::workload::{run, HoldAcks, Sample, Workload};
    use rsc::core::model::GroupId;
    use rsc::service::{Coordinator, CoordinatorOptions};
    use rsc::store::redis::{RedisStore, RedisStoreOptions};

    /// One row of the table.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Row {
        Raw,
        /// Raw loops whose held batches' XACKs ride on the next read (pipelined with it).
        RawPiggyback,
        Library {
            fencing: Fencing,
            poll_idle_ms: Option<u64>,
        },
        /// Fencing on, a held batch's `ack_all` sent together with the next `poll`.
        LibOverlap,
        /// Fencing on, the consumers' sink asking for the per-entry events.
        LibEntryEvents,
    }

    impl Row {
        /// Every row, in table order (`DP_ROWS` selects by key).
        fn all() -> Vec<Row> {
            vec![
                Row::Raw,
                Row::Library { fencing: Fencing::On, poll_idle_ms: None },
                Row::LibEntryEvents,
                Row::Library { fencing: Fencing::OnScripted, poll_idle_ms: None },
                Row::Library { fencing: Fencing::OnScriptedAcks, poll_idle_ms: None },
                Row::Library { fencing: Fencing::Off, poll_idle_ms: None },
                Row::Library { fencing: Fencing::On, poll_idle_ms: Some(5) },
                Row::Library { fencing: Fencing::Off, poll_idle_ms: Some(5) },
                Row::RawPiggyback,
                Row::LibOverlap,
            ]
        }

        /// Rows run when `DP_ROWS` is not set.
        fn default_keys() -> Vec<&'static str> {
            vec!["raw", "lib-on", "lib-on-events", "lib-on-script", "lib-on-script-acks", "lib-off", "lib-on-idle5"]
        }

        pub fn key(self) -> String {
            match self {
                Row::Raw => "raw".into(),
                Row::RawPiggyback => "raw-piggy".into(),
                Row::LibOverlap => "lib-on-overlap".into(),
                Row::LibEntryEvents => "lib-on-events".into(),
                Row::Library { fencing, poll_idle_ms } => {
                    let fencing = match fencing {
                        Fencing::On => "-on",
                        Fencing::OnScripted => "-on-script",
                        Fencing::OnScriptedAcks => "-on-script-acks",
                        Fencing::Off => "-off",
                    };
                    let idle = poll_idle_ms.map_or(String::new(), |ms| format!("-idle{ms}"));
                    format!("lib{fencing}{idle}")
                }
            }
        }

        pub fn title(self) -> String {
            match self {
                Row::Raw => "raw redis XADD / XREADGROUP+XACK".into(),
                Row::RawPiggyback => "raw, XACK pipelined with next read".into(),
                Row::LibOverlap => "library fencing=on, ack beside next poll".into(),
                Row::LibEntryEvents => "library fencing=on, per-entry events".into(),
                Row::Library { fencing, poll_idle_ms } => {
                    let mut title = String::from(match fencing {
                        Fencing::On => "library fencing=on",
                        Fencing::OnScripted => "library fencing=on, script reads",
                        Fencing::OnScriptedAcks => "library fencing=on, script acks",
                        Fencing::Off => "library fencing=off",
                    });
                    if let Some(ms) = poll_idle_ms {
                        title.push_str(&format!(" poll_idle={ms}ms"));
                    }
                    title
                }
            }
        }
    }

    struct Settings {
        workload: Workload,
        rounds: usize,
        rows: Vec<Row>,
        smoke: bool,
        quick: bool,
    }

    fn env_number(name: &str, default: usize) -> usize {
        std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
    }

    fn settings() -> Result<Settings, String> {
        let smoke = !std::env::args().any(|a| a == "--bench");
        let quick = !smoke && std::env::var("RSC_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let (messages, rounds, idle_waits) = match (smoke, quick) {
            (true, _) => (2_000, 1, 1),
            (false, true) => (5_000, 2, 2),
            (false, false) => (20_000, 5, 5),
        };
        let workload = Workload {
            messages: env_number("DP_MESSAGES", messages).max(1),
            producers: env_number("DP_PRODUCERS", 4).max(1),
            consumers: env_number("DP_CONSUMERS", 4).max(1),
            shards: u32::try_from(env_number("DP_SHARDS", 8).max(1)).map_err(|e| e.to_string())?,
            batch: env_number("DP_BATCH", 100).max(1),
            wait_ms: 100,
            idle_waits: env_number("DP_IDLE_WAITS", idle_waits),
            idle_wait_ms: env_number("DP_IDLE_WAIT_MS", 200).max(1) as u64,
            deadline: Duration::from_secs(60),
            hold: match std::env::var("DP_HOLD").as_deref().map(str::trim) {
                Err(_) | Ok("" | "full") => HoldAcks::FullBatches,
                Ok("every") => HoldAcks::Every,
                Ok(other) => return Err(format!("DP_HOLD: {other:?} is neither `full` nor `every`")),
            },
        };
        let keys: Vec<String> = match std::env::var("DP_ROWS") {
            Ok(v) if !v.trim().is_empty() => v.split(',').map(|k| k.trim().to_ascii_lowercase()).collect(),
            _ => Row::default_keys().into_iter().map(String::from).collect(),
        };
        let all = Row::all();
        let mut rows = Vec::new();
        for key in keys {
            let row = all.iter().find(|r| r.key() == key).ok_or_else(|| {
                let known: Vec<String> = all.iter().map(|r| r.key()).collect();
                format!("DP_ROWS: unknown row {key:?} ({})", known.join(", "))
            })?;
            rows.push(*row);
        }
        Ok(Settings { workload, rounds: env_number("DP_ROUNDS", rounds).max(1), rows, smoke, quick })
    }

    pub fn main() -> ExitCode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.iter().any(|a| a == "--list") {
            // `cargo nextest`'s listing protocol: the smoke run is the only test.
            if !args.iter().any(|a| a == "--ignored") {
                println!("smoke: test");
            }
            return ExitCode::SUCCESS;
        }
        let settings = match settings() {
            Ok(settings) => settings,
            Err(error) => {
                eprintln!("data_path: {error}");
                return ExitCode::from(2);
            }
        };
        // The goal verdict's statistics, checked against hand-worked values before they judge.
        if let Err(error) = crate::report::check_statistics() {
            eprintln!("data_path: {error}");
            return ExitCode::FAILURE;
        }
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
        let result = runtime.block_on(run_all(&server, &settings));
        drop(runtime);
        drop(server);
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("data_path FAILED: {error}");
                ExitCode::FAILURE
            }
        }
    }

    /// A row's clients, built once and kept across rounds.
    enum Rig {
        Raw { publishers: Vec<Arc<RawPublisher>>, subscribers: Vec<Arc<RawSubscriber>>, trips: Arc<TripCounters> },
        Library(LibRig),
    }

    async fn build(
        server: &RedisServer,
        coordinator: &Coordinator<RedisStore>,
        row: Row,
        workload: &Workload,
    ) -> Result<Rig, String> {
        let url = server.url();
        match row {
            Row::Raw | Row::RawPiggyback => {
                let piggyback = row == Row::RawPiggyback;
                let group =
                    RawGroup { prefix: format!("dp-{}", row.key()), group: "raw".into(), shards: workload.shards };
                crate::raw::create(&url, &group).await?;
                let trips = Arc::new(TripCounters::default());
                let mut publishers = Vec::new();
                for _ in 0..workload.producers {
                    publishers.push(Arc::new(RawPublisher::connect(&url, group.clone(), Arc::clone(&trips)).await?));
                }
                let block_max = Duration::from_millis(workload.wait_ms.max(workload.idle_wait_ms));
                let count = u32::try_from(workload.consumers).map_err(|e| e.to_string())?;
                let mut subscribers = Vec::new();
                for i in 0..count {
                    let subscriber =
                        RawSubscriber::connect(&url, group.clone(), i, count, block_max, Arc::clone(&trips))
                            .await?
                            .piggyback(piggyback.then_some(workload.hold));
                    subscribers.push(Arc::new(subscriber));
                }
                Ok(Rig::Raw { publishers, subscribers, trips })
            }
            Row::LibOverlap => {
                let group = GroupId::new(format!("dp-{}", row.key()), "bench");
                let options = LibOptions { overlap: Some(workload.hold), ..LibOptions::default() };
                let rig = LibRig::start(&url, coordinator, group, Fencing::On, workload, options).await?;
                println!("  {}: group settled in {} ms", row.title(), rig.settle.as_millis());
                Ok(Rig::Library(rig))
            }
            Row::LibEntryEvents => {
                let group = GroupId::new(format!("dp-{}", row.key()), "bench");
                let options = LibOptions { entry_events: true, ..LibOptions::default() };
                let rig = LibRig::start(&url, coordinator, group, Fencing::On, workload, options).await?;
                println!("  {}: group settled in {} ms", row.title(), rig.settle.as_millis());
                Ok(Rig::Library(rig))
            }
            Row::Library { fencing, poll_idle_ms } => {
                // Streams are `<prefix>:<shard>`: every row needs its own prefix, or one row's
                // consumer group would also read what the other rows publish.
                let group = GroupId::new(format!("dp-{}", row.key()), "bench");
                let options = LibOptions { poll_idle_ms, ..LibOptions::default() };
                let rig = LibRig::start(&url, coordinator, group, fencing, workload, options).await?;
                println!("  {}: group settled in {} ms", row.title(), rig.settle.as_millis());
                Ok(Rig::Library(rig))
            }
        }
    }

    /// One run of a row; the library rows also say what disturbed the run (empty: nothing).
    async fn run_row(server: &RedisServer, rig: &Rig, workload: &Workload) -> (Sample, String) {
        match rig {
            Rig::Raw { publishers, subscribers, trips } => {
                (run(server, workload, publishers, subscribers, trips).await, String::new())
            }
            Rig::Library(lib) => {
                let before = lib.disruptions.snapshot();
                let sample = run(server, workload, &lib.publishers, &lib.subscribers, &lib.trips).await;
                (sample, lib.disruptions.since(&before))
            }
        }
    }

    async fn run_all(server: &RedisServer, settings: &Settings) -> Result<(), String> {
        let started = Instant::now();
        let store =
            RedisStore::connect(&server.url(), RedisStoreOptions::default()).await.map_err(|e| e.to_string())?;
        let coordinator = Coordinator::new(store, CoordinatorOptions::default());
        let probe = coordinator.start().await.map_err(|e| format!("probe: {e}"))?;
        let ticker = tokio::spawn({
            let coordinator = coordinator.clone();
            async move { coordinator.run_ticker().await }
        });
        print_header(server, settings, &probe.server_version);
        let mut rigs = Vec::new();
        let mut rows = Vec::new();
        for row in &settings.rows {
            match build(server, &coordinator, *row, &settings.workload).await {
                Ok(rig) => {
                    rigs.push(rig);
                    rows.push(*row);
                }
                Err(error) if !settings.smoke => {
                    println!("  {}: LEFT OUT, its clients did not start: {error}", row.title())
                }
                Err(error) => return Err(format!("{}: {error}", row.title())),
            }
        }
        let mut samples: Vec<RowSamples> =
            rows.iter().map(|row| RowSamples { row: *row, samples: Vec::new() }).collect();
        // Runs whose library clients saw a rebalance, a failed heartbeat or the like.
        let mut disturbed = Vec::new();
        println!();
        for round in 0..settings.rounds {
            // Rotate the order so no row always runs first (on a cooler or warmer machine).
            let n = rows.len();
            for at in (0..n).map(|i| (i + round) % n) {
                let (sample, disruptions) = run_row(server, &rigs[at], &settings.workload).await;
                print_run(round, rows[at], &sample);
                if !disruptions.is_empty() {
                    println!("        disturbed by: {disruptions}");
                    disturbed.push((round, rows[at]));
                }
                samples[at].samples.push(sample);
            }
        }
        ticker.abort();
        for rig in rigs {
            if let Rig::Library(lib) = rig {
                lib.close().await;
            }
        }
        print_tables(&samples, &settings.workload);
        print_goals(&samples, &settings.workload);
        print_piggyback(&samples, &settings.workload);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        println!(
            "\ntotal bench time {:.0} s; load average at the end {}",
            started.elapsed().as_secs_f64(),
            load.join(" ")
        );
        if settings.smoke {
            check_smoke(&samples, &disturbed)?;
        }
        Ok(())
    }

    /// The smoke run's pass condition: every message of every run acked, no error, and no message
    /// delivered twice unless the run was disturbed (a shard changed owner: at-least-once allows it).
    fn check_smoke(rows: &[RowSamples], disturbed: &[(usize, Row)]) -> Result<(), String> {
        for row in rows {
            for (round, sample) in row.samples.iter().enumerate() {
                let calm = !disturbed.contains(&(round, row.row));
                if sample.errors > 0 || sample.missing > 0 || (calm && sample.duplicates > 0) {
                    return Err(format!(
                        "{}: {} errors (first: {}), {} missing, {} duplicates",
                        row.row.title(),
                        sample.errors,
                        sample.first_error.as_deref().unwrap_or("-"),
                        sample.missing,
                        sample.duplicates
                    ));
                }
            }
        }
        Ok(())
    }

    fn print_header(server: &RedisServer, settings: &Settings, version: &str) {
        let w = &settings.workload;
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        let mode = match (settings.smoke, settings.quick) {
            (true, _) => " (smoke run; `cargo bench --bench data_path` for numbers)",
            (false, true) => " (quick run: RSC_BENCH_QUICK)",
            (false, false) => "",
        };
        println!("data_path{mode}");
        println!("machine: {cores} cores (shared by this process and redis-server), load average {}", load.join(" "));
        println!(
            "redis-server {version} on 127.0.0.1:{} (spawned, no persistence); coordinator in-process",
            server.port()
        );
        let consumer = rsc::client::ConsumerConfig::new(GroupId::new("a", "b"), "m");
        println!(
            "{} messages x {} bytes per run, {} producers, {} consumers, {} shards, reads of up to {} entries \
             (wait {} ms), {} idle waits of {} ms per consumer; library poll_idle_ms {} unless the row says \
             otherwise; {} rounds, rows interleaved",
            w.messages,
            crate::workload::PAYLOAD_BYTES,
            w.producers,
            w.consumers,
            w.shards,
            w.batch,
            w.wait_ms,
            w.idle_waits,
            w.idle_wait_ms,
            consumer.poll_idle_ms,
            settings.rounds
        );
    }
}
