//! Rebalances against a real `redis-server`, before and after the fix of "a rebalance with no
//! fault at all sometimes stalls a whole group for a full lease" (not a test: it prints numbers).
//!
//! Starts its own `redis-server` on a free loopback port (the integration-test harness in
//! `tests/support`, which kills it when dropped, also on a panic). Every run builds a fresh
//! coordinator process (`Coordinator<RedisStore>` behind a store wrapper that only counts) and a
//! fresh group with the default config (heartbeat 1 s, assignment lease 8 s), then runs consumers
//! of the project's consumer library — many per process, as tasks of one tokio runtime — that
//! reach the coordinator in-process (or over loopback HTTP with `REB_TRANSPORT=http`). The
//! consumers never poll: a consumer with nothing in flight drains a revoked shard at once, so
//! the numbers are the protocol's and the coordinator's, not an application's.
//!
//! Each scenario runs under two coordinators in the same process, alternating run by run:
//! - `before`: the planted bug `ProcessWideRevisionMark` (the behaviour before the fix: a read
//!   that raced a concurrent write looks like a revision regression and starts a correction round);
//! - `after`: no planted bug.
//!
//! Scenarios: `storm10` (9 joining onto 1 member that owns all of 900 shards), `bounce10` (10
//! members on 900 shards, each in turn closes cleanly and a new one joins; every bounce timed),
//! `storm200` (199 joining onto 1, 4,096 shards). Timing: from the moment the change starts (the
//! joins, or the clean close) to the moment the last member applied its final `OK` — every member
//! `OK` with nothing pending or revoking, reading exactly what it was assigned, the assignments
//! covering every shard — confirmed by `Coordinator::describe` (exactly these members, no
//! correction round, every shard `Owned` by its target). Correction rounds are counted at the
//! store boundary (written aggregates whose `correction` goes from null to set) and cross-checked
//! with the coordinator's loss-evidence counters (`rsc_metadata_version_regressions_total` and
//! the two other kinds) and the `SYNC_METADATA` statuses the consumers applied.
//!
//! Printed: a line per run, the results table (min / median / max seconds and correction rounds
//! per scenario and variant), after/before ratios, the goals, and where the time goes — the
//! coordinator's store calls per rebalance (writes, full-aggregate reads, mutex time, CPU of this
//! process and of redis-server) and the mean phases of a critical section (load, compute, write,
//! release), all measured by the store wrapper without touching the library.
//!
//! Run: `cargo bench --bench rebalance_redis`. Knobs (environment): `REB_SCENARIOS`
//! (`storm10,bounce10,storm200`), `REB_REPS` runs of storm10 and bounce10 (20), `REB_BIG_REPS`
//! runs of storm200 (3), `REB_VARIANTS` (`before,after`), `REB_TRANSPORT` (`inprocess` | `http`),
//! `REB_DEADLINE_S` longest wait for one rebalance of storm10 or bounce10 (60) and
//! `REB_BIG_DEADLINE_S` of storm200 (180): a slower one is reported as unfinished, timed at the
//! deadline (a lower bound), and ends its run; `REB_TIMELINE=1` to print each timed
//! rebalance as 250 ms buckets (heartbeats, statuses, writes, mutex time, members done),
//! `REB_HB_TIMEOUT_MS` the consumers' heartbeat timeout (the library's default, 2000, otherwise).
//! Without `--bench` (how `cargo test --all-targets` and `cargo nextest` run it) a small smoke run
//! (a storm of 3 onto 1 and a bounce of 3, 32 shards, fixed coordinator only) checks that every
//! rebalance reaches all-OK with no correction round, and exits non-zero otherwise.

// The integration-test harness; this binary uses only `RedisServer`.
#[cfg(not(madsim))]
#[allow(unused_imports)]
#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(not(madsim))]
#[path = "rebalance_redis/board.rs"]
mod board;
#[cfg(not(madsim))]
#[path = "rebalance_redis/instrumented.rs"]
mod instrumented;
#[cfg(not(madsim))]
#[path = "rebalance_redis/report.rs"]
mod report;
#[cfg(not(madsim))]
#[path = "rebalance_redis/rig.rs"]
mod rig;
#[cfg(not(madsim))]
#[path = "rebalance_redis/scenarios.rs"]
mod scenarios;
#[cfg(not(madsim))]
#[path = "rebalance_redis/timeline.rs"]
mod timeline;
#[cfg(not(madsim))]
#[path = "rebalance_redis/transport.rs"]
mod transport;

#[cfg(madsim)]
fn main() {
    eprintln!("rebalance_redis needs a real redis-server; build it without --cfg madsim");
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

    use crate::report::{print_results, print_run, print_where_time_goes, Row};
    use crate::rig::{RigSettings, Variant};
    use crate::scenarios::{run, Kind, Scenario};
    use crate::support::RedisServer;
    use rsc::core::model::GroupConfig;

    /// What one invocation runs.
    struct Settings {
        scenarios: Vec<Scenario>,
        variants: Vec<Variant>,
        rig: RigSettings,
        /// Not run by `cargo bench`: small, and a failure is an error exit.
        smoke: bool,
    }

    fn env_number(name: &str, default: usize) -> usize {
        std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
    }

    fn env_list(name: &str) -> Option<Vec<String>> {
        let value = std::env::var(name).ok()?;
        let items: Vec<String> =
            value.split(',').map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()).collect();
        (!items.is_empty()).then_some(items)
    }

    fn settings() -> Result<Settings, String> {
        if !std::env::args().any(|a| a == "--bench") {
            let deadline = Duration::from_secs(30);
            let scenario = |key, kind| Scenario { key, kind, shard_count: 32, reps: 1, goal_intervals: 3.0, deadline };
            return Ok(Settings {
                scenarios: vec![
                    scenario("storm3", Kind::Storm { initial: 1, joiners: 3 }),
                    scenario("bounce3", Kind::Bounce { members: 3 }),
                ],
                variants: vec![Variant::After],
                rig: RigSettings { http: false, deadline, timeline: false, heartbeat_timeout_ms: None },
                smoke: true,
            });
        }
        let reps = env_number("REB_REPS", 20).max(1);
        let deadline = Duration::from_secs(env_number("REB_DEADLINE_S", 60).max(1) as u64);
        let big_deadline = Duration::from_secs(env_number("REB_BIG_DEADLINE_S", 180).max(1) as u64);
        let all = [
            Scenario {
                key: "storm10",
                kind: Kind::Storm { initial: 1, joiners: 9 },
                shard_count: 900,
                reps,
                goal_intervals: 2.0,
                deadline,
            },
            Scenario {
                key: "bounce10",
                kind: Kind::Bounce { members: 10 },
                shard_count: 900,
                reps,
                goal_intervals: 1.0,
                deadline,
            },
            Scenario {
                key: "storm200",
                kind: Kind::Storm { initial: 1, joiners: 199 },
                shard_count: 4096,
                reps: env_number("REB_BIG_REPS", 3).max(1),
                goal_intervals: 3.0,
                deadline: big_deadline,
            },
        ];
        let scenarios = match env_list("REB_SCENARIOS") {
            None => all.to_vec(),
            Some(keys) => {
                if let Some(unknown) = keys.iter().find(|k| !all.iter().any(|s| s.key == k.as_str())) {
                    return Err(format!("REB_SCENARIOS: unknown scenario {unknown:?} (storm10, bounce10, storm200)"));
                }
                all.iter().filter(|s| keys.iter().any(|k| k == s.key)).cloned().collect()
            }
        };
        let variants = match env_list("REB_VARIANTS") {
            None => vec![Variant::Before, Variant::After],
            Some(names) => {
                let mut variants = Vec::new();
                for name in names {
                    match name.as_str() {
                        "before" => variants.push(Variant::Before),
                        "after" => variants.push(Variant::After),
                        other => return Err(format!("REB_VARIANTS: unknown variant {other:?} (before, after)")),
                    }
                }
                variants
            }
        };
        let http = match std::env::var("REB_TRANSPORT").unwrap_or_default().trim() {
            "" | "inprocess" => false,
            "http" => true,
            other => return Err(format!("REB_TRANSPORT: {other:?} is neither inprocess nor http")),
        };
        let timeline = env_number("REB_TIMELINE", 0) > 0;
        let heartbeat_timeout_ms = std::env::var("REB_HB_TIMEOUT_MS").ok().and_then(|v| v.trim().parse().ok());
        // Each scenario replaces `deadline` with its own.
        let rig = RigSettings { http, deadline, timeline, heartbeat_timeout_ms };
        Ok(Settings { scenarios, variants, rig, smoke: false })
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
                eprintln!("rebalance_redis: {error}");
                return ExitCode::from(2);
            }
        };
        let redis = Arc::new(RedisServer::start());
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
        let result = runtime.block_on(run_all(&redis, &settings));
        // Every rig was torn down; no task of the runtime still uses the server.
        drop(runtime);
        drop(redis);
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("rebalance_redis FAILED: {error}");
                ExitCode::FAILURE
            }
        }
    }

    async fn run_all(redis: &Arc<RedisServer>, settings: &Settings) -> Result<(), String> {
        let started = Instant::now();
        let interval_s = GroupConfig::default().heartbeat_interval_ms as f64 / 1000.0;
        print_header(redis, settings);
        let mut rows: Vec<Row> = Vec::new();
        for (index, scenario) in settings.scenarios.iter().enumerate() {
            println!("{} ({} runs per variant):", scenario.title(), scenario.reps);
            for rep in 0..scenario.reps {
                // Alternate which variant goes first, so neither always runs on a warmer machine.
                let mut order = settings.variants.clone();
                if rep % 2 == 1 {
                    order.reverse();
                }
                for variant in order {
                    let result = run(redis, settings.rig, scenario, variant, rep).await;
                    print_run(scenario, variant, rep, &result);
                    let row = match rows.iter_mut().position(|r| r.scenario == index && r.variant == variant) {
                        Some(at) => &mut rows[at],
                        None => {
                            rows.push(Row { scenario: index, variant, outcomes: Vec::new(), errors: Vec::new() });
                            rows.last_mut().expect("just pushed")
                        }
                    };
                    row.outcomes.extend(result.outcomes);
                    row.errors.extend(result.error);
                }
            }
        }
        print_results(&settings.scenarios, &rows, interval_s);
        print_where_time_goes(&settings.scenarios, &rows);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        println!(
            "\ntotal bench time {:.0} s; load average at the end {}",
            started.elapsed().as_secs_f64(),
            load.join(" ")
        );
        if settings.smoke {
            check_smoke(&rows)?;
        }
        Ok(())
    }

    /// The smoke run's pass condition: every rebalance reached all-OK, without a correction round.
    fn check_smoke(rows: &[Row]) -> Result<(), String> {
        for row in rows {
            if let Some(error) = row.errors.first() {
                return Err(error.clone());
            }
            let rounds: u64 = row.outcomes.iter().map(|o| o.rounds + o.evidence).sum();
            if rounds > 0 {
                return Err(format!("{rounds} correction rounds / loss evidence with the fixed coordinator"));
            }
        }
        Ok(())
    }

    fn print_header(redis: &RedisServer, settings: &Settings) {
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        let config = GroupConfig::default();
        println!("rebalance_redis{}", if settings.smoke { " (smoke run; `cargo bench` for numbers)" } else { "" });
        println!("machine: {cores} cores (shared by this process and redis-server), load average {}", load.join(" "));
        let consumer = rsc::client::ConsumerConfig::new(rsc::core::model::GroupId::new("a", "b"), "m");
        println!(
            "redis-server on 127.0.0.1:{} (spawned, no persistence); consumers: the consumer library, one tokio \
             multi-thread runtime, {} transport, no polling, heartbeat timeout {} ms",
            redis.port(),
            if settings.rig.http { "loopback HTTP" } else { "in-process" },
            settings.rig.heartbeat_timeout_ms.unwrap_or(consumer.heartbeat_timeout_ms)
        );
        println!(
            "group config: default (heartbeat {} ms, assignment lease {} ms, member lease TTL {} ms); coordinator \
             options default (tick {} ms); variants: {}\n",
            config.heartbeat_interval_ms,
            config.assignment_lease_ms,
            config.member_lease_ttl_ms,
            rsc::service::CoordinatorOptions::default().tick_interval_ms,
            settings.variants.iter().map(|v| v.name()).collect::<Vec<_>>().join(", ")
        );
    }
}
