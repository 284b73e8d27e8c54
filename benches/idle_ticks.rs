//! What the coordinator's tick costs for idle groups, against a real `redis-server` (not a test:
//! it prints numbers; issue #12, "ticks scale with due work, not with groups").
//!
//! Starts its own `redis-server` on a free port (the integration-test harness in `tests/support`),
//! creates N groups nobody joined (idle: nothing can come due without a request), then runs I
//! in-process `Coordinator<RedisStore>` instances, each ticking every `tick_interval_ms` (250 ms)
//! as `run_ticker` does, for a timed window. Per (N, I), in one run:
//! `every pass` (`idle_group_audit_ms = 0` and `ticker_silence_ms = 0`: every group read every pass
//! by every instance, the ticker before idle groups were deferred), `shared` (instances share the
//! groups through the tick roster), `deferred` (the default audit period, 120 s) and both (the
//! defaults), four rows side by side. Measured over the
//! window: Redis commands/s (`INFO stats` `total_commands_processed` delta, the INFO calls
//! themselves excluded), this process's CPU (`/proc/self/stat`, all instances together) and the
//! longest `tick_all` pass of any instance. The window starts once every instance counts all of
//! them live and then two passes later, so the first pass of every group (which reads it) and the
//! reads that follow an instance entering the live set are not in it: what is printed is the
//! steady cost.
//!
//! Run: `cargo bench --bench idle_ticks`; `RSC_BENCH_QUICK=1` for a short run. Knobs
//! (environment): `IT_GROUPS` (`1,100,10000`; quick `1,100,1000`), `IT_INSTANCES` (`1,3`),
//! `IT_WINDOW_MS` (5000; quick 2000), `IT_CLUSTER=1` (the groups on a Redis Cluster of 3
//! primaries, commands counted on all of them, instead of one server). Without `--bench` a smoke run (1 and 20 groups, one
//! instance, 1 s) checks that deferred idle groups cost fewer commands than ticking every pass
//! and exits non-zero otherwise. Linux only (reads /proc).

#[cfg(all(not(madsim), target_os = "linux"))]
#[allow(unused_imports)]
#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(not(all(not(madsim), target_os = "linux")))]
fn main() {
    eprintln!("idle_ticks needs a real redis-server and /proc; build it without --cfg madsim on Linux");
}

#[cfg(all(not(madsim), target_os = "linux"))]
fn main() -> std::process::ExitCode {
    bench::main()
}

#[cfg(all(not(madsim), target_os = "linux"))]
mod bench {
    use std::process::ExitCode;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rsc::core::model::{GroupConfig, GroupId};
    use rsc::core::protocol::{AdminRequest, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, MemberSession};
    use rsc::service::{Coordinator, CoordinatorOptions, TICKER_REFRESH_MS_DEFAULT, TICKER_SILENCE_MS_DEFAULT};
    use rsc::store::redis::{RedisStore, RedisStoreOptions};

    use crate::support::cpu::process_cpu as cpu;
    use crate::support::redis_cluster::RedisCluster;
    use crate::support::RedisServer;

    /// Where the groups live: one `redis-server`, or (`IT_CLUSTER=1`) a Redis Cluster of 3
    /// primaries started by the test harness, where the commands counted are every primary's.
    enum Target {
        One(RedisServer),
        Cluster(RedisCluster),
    }

    impl Target {
        fn start() -> Self {
            if std::env::var("IT_CLUSTER").is_ok_and(|v| v == "1") {
                Target::Cluster(RedisCluster::start(3, 0))
            } else {
                Target::One(RedisServer::start())
            }
        }

        fn describe(&self) -> String {
            match self {
                Target::One(redis) => format!("redis-server on {}", redis.url()),
                Target::Cluster(cluster) => format!("a Redis Cluster of 3 primaries ({})", cluster.nodes().join(", ")),
            }
        }

        async fn store(&self) -> RedisStore {
            let options = RedisStoreOptions::default();
            match self {
                Target::One(redis) => RedisStore::connect(&redis.url(), options).await.expect("connect"),
                Target::Cluster(cluster) => {
                    RedisStore::connect_cluster(&cluster.nodes(), options).await.expect("connect")
                }
            }
        }

        /// `total_commands_processed` summed over the primaries, and the number of INFO calls
        /// that read it (each counts itself on its node).
        fn commands(&self) -> (u64, u64) {
            let of = |redis: &RedisServer| -> u64 {
                redis.info_field("stats", "total_commands_processed").and_then(|v| v.parse().ok()).unwrap_or(0)
            };
            match self {
                Target::One(redis) => (of(redis), 1),
                Target::Cluster(cluster) => {
                    let primaries = cluster.primaries();
                    (primaries.iter().map(|p| of(p)).sum(), primaries.len() as u64)
                }
            }
        }

        /// Deletes `key` on the node that holds it.
        fn del(&self, key: &str) {
            match self {
                Target::One(redis) => redis.cmd(&["DEL", key]),
                Target::Cluster(cluster) => cluster.node_for_key(key).cmd(&["DEL", key]),
            };
        }
    }

    struct Settings {
        groups: Vec<usize>,
        /// Groups with a member each (the second table).
        member_groups: Vec<usize>,
        instances: Vec<usize>,
        window: Duration,
        smoke: bool,
    }

    fn list(name: &str, default: &str) -> Vec<usize> {
        let text = std::env::var(name).unwrap_or_else(|_| default.to_string());
        text.split(',').filter_map(|v| v.trim().parse().ok()).collect()
    }

    fn settings() -> Settings {
        if !std::env::args().any(|a| a == "--bench") {
            return Settings {
                groups: vec![1, 20],
                member_groups: vec![20],
                instances: vec![1],
                window: Duration::from_secs(3),
                smoke: true,
            };
        }
        let quick = std::env::var("RSC_BENCH_QUICK").is_ok();
        let window_ms = std::env::var("IT_WINDOW_MS").ok().and_then(|v| v.parse().ok());
        Settings {
            groups: list("IT_GROUPS", if quick { "1,100,1000" } else { "1,100,10000" }),
            member_groups: list("IT_MEMBER_GROUPS", if quick { "100" } else { "100,1000" }),
            instances: list("IT_INSTANCES", "1,3"),
            window: Duration::from_millis(window_ms.unwrap_or(if quick { 2_000 } else { 5_000 })),
            smoke: false,
        }
    }

    /// Commands the target executed between two [`Target::commands`] reads: the first read's INFO
    /// calls count themselves, the second's are not counted yet.
    fn executed(before: (u64, u64), after: (u64, u64)) -> u64 {
        after.0.saturating_sub(before.0).saturating_sub(before.1)
    }

    struct Row {
        commands_per_s: f64,
        cpu_percent: f64,
        longest_pass: Duration,
    }

    /// One timed window: `instances` coordinators ticking `groups` idle groups.
    async fn measure(
        target: &Target,
        instances: usize,
        (audit_ms, silence_ms, refresh_ms): (u64, u64, u64),
        window: Duration,
    ) -> Row {
        // A fresh tick roster: the instances of the previous row are gone, and would otherwise
        // count live for `ticker_silence_ms`, their groups moving to this row's instances (one
        // first read each) inside its window.
        target.del(rsc::store::keys::TICK_ROSTER_KEY);
        let mut coordinators = Vec::with_capacity(instances);
        for i in 0..instances {
            let store = target.store().await;
            let options = CoordinatorOptions {
                instance_id: format!("bench-{i}"),
                idle_group_audit_ms: audit_ms,
                ticker_silence_ms: silence_ms,
                ticker_refresh_ms: refresh_ms,
                ..CoordinatorOptions::default()
            };
            let coordinator = Coordinator::new(store, options);
            coordinator.start().await.expect("probe");
            coordinators.push(coordinator);
        }
        let tick = Duration::from_millis(coordinators[0].options().tick_interval_ms);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = Vec::new();
        let counters: Vec<Arc<std::sync::atomic::AtomicUsize>> = coordinators.iter().map(|_| Arc::default()).collect();
        let watched = coordinators.clone();
        for (coordinator, passes) in coordinators.into_iter().zip(counters.iter().cloned()) {
            let (stop, measuring) = (Arc::clone(&stop), Arc::clone(&measuring));
            tasks.push(tokio::spawn(async move {
                let mut longest = Duration::ZERO;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let started = Instant::now();
                    coordinator.tick_all().await;
                    if measuring.load(std::sync::atomic::Ordering::SeqCst) {
                        longest = longest.max(started.elapsed());
                    }
                    passes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(tick).await;
                }
                longest
            }));
        }
        // Every instance counting all of them live first (sharing on): an instance entering another's
        // live set ends that one's deferrals (DESIGN §12), a one-time read of each group. Then two
        // more passes of every instance (at least): each group's first tick reads it.
        if silence_ms > 0 {
            let live = |c: &Coordinator<RedisStore>| c.metrics().total("rsc_ticker_live_instances") as usize;
            while watched.iter().any(|c| live(c) < instances) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let settled: Vec<usize> = counters.iter().map(|p| p.load(std::sync::atomic::Ordering::SeqCst)).collect();
        while counters.iter().zip(&settled).any(|(p, s)| p.load(std::sync::atomic::Ordering::SeqCst) < s + 2) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(watched);
        tokio::time::sleep(tick).await;
        let (commands_before, cpu_before, started) = (target.commands(), cpu(), Instant::now());
        measuring.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(window).await;
        let (commands_after, cpu_after, elapsed) = (target.commands(), cpu(), started.elapsed());
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut longest_pass = Duration::ZERO;
        for task in tasks {
            longest_pass = longest_pass.max(task.await.unwrap_or_default());
        }
        let executed = executed(commands_before, commands_after);
        Row {
            commands_per_s: executed as f64 / elapsed.as_secs_f64(),
            cpu_percent: 100.0 * cpu_after.saturating_sub(cpu_before).as_secs_f64() / elapsed.as_secs_f64(),
            longest_pass,
        }
    }

    /// The steady heartbeat of a client that applied `r` (it owns what it was assigned).
    fn next(group: &GroupId, r: &HeartbeatResponse) -> HeartbeatRequest {
        HeartbeatRequest {
            metadata_version_proof: None,
            group: group.clone(),
            member_id: r.member_id.clone(),
            member_epoch: r.member_epoch,
            metadata_version: r.metadata_version,
            assignment_epoch: r.assignment_epoch,
            owned: r.assigned.clone(),
            revoking: r.revoked_reports(),
            leave: false,
            member_session: Some(MemberSession("0".repeat(32))),
            fenced: Vec::new(),
        }
    }

    /// One timed window of `groups` idle groups with one member each, heartbeating at the default
    /// interval (1 s), each heartbeat through the next of `instances` coordinators (round robin:
    /// what a load balancer does; with one instance every heartbeat reaches the group's owner).
    /// Returns the commands/s that are not the heartbeats' own (two per steady heartbeat).
    async fn measure_members(
        target: &Target,
        instances: usize,
        groups: usize,
        renew: bool,
        relay: bool,
        window: Duration,
    ) -> f64 {
        target.del(rsc::store::keys::TICK_ROSTER_KEY);
        let mut coordinators = Vec::with_capacity(instances);
        for i in 0..instances {
            let store = target.store().await;
            let options = CoordinatorOptions {
                instance_id: format!("bench-m{i}"),
                renew_deferrals_from_heartbeats: renew,
                heard_relay_ms: if relay { relay_ms() } else { 0 },
                ..CoordinatorOptions::default()
            };
            let coordinator = Coordinator::new(store, options);
            coordinator.start().await.expect("probe");
            coordinators.push(coordinator);
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let heartbeats = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for coordinator in coordinators.clone() {
            let stop = Arc::clone(&stop);
            tasks.push(tokio::spawn(async move {
                let tick = Duration::from_millis(coordinator.options().tick_interval_ms);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    coordinator.tick_all().await;
                    tokio::time::sleep(tick).await;
                }
            }));
        }
        let interval = Duration::from_millis(GroupConfig::default().heartbeat_interval_ms);
        for g in 0..groups {
            let group = GroupId::new("members", format!("m{g}"));
            let coordinators = coordinators.clone();
            let (stop, measuring, heartbeats) = (Arc::clone(&stop), Arc::clone(&measuring), Arc::clone(&heartbeats));
            tasks.push(tokio::spawn(async move {
                // Spread over the interval; each member (re)joins as a new incarnation.
                tokio::time::sleep(interval.mul_f64(g as f64 / groups as f64)).await;
                let join = HeartbeatRequest {
                    metadata_version_proof: None,
                    group: group.clone(),
                    member_id: format!("member-{g}"),
                    member_epoch: 0,
                    metadata_version: 0,
                    assignment_epoch: 0,
                    owned: Vec::new(),
                    revoking: Vec::new(),
                    leave: false,
                    member_session: Some(MemberSession("0".repeat(32))),
                    fenced: Vec::new(),
                };
                let mut last = coordinators[0].heartbeat(join).await.expect("join");
                let mut turn = g;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(interval).await;
                    turn += 1;
                    let answer = coordinators[turn % coordinators.len()].heartbeat(next(&group, &last)).await;
                    if let Ok(answer) = answer {
                        if answer.status == HeartbeatStatus::Ok {
                            last = answer;
                        }
                    }
                    if measuring.load(std::sync::atomic::Ordering::SeqCst) {
                        heartbeats.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }));
        }
        // Joins settle, every instance reads every group once and has it cached.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let (commands_before, started) = (target.commands(), Instant::now());
        measuring.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(window).await;
        measuring.store(false, std::sync::atomic::Ordering::SeqCst);
        let (commands_after, elapsed) = (target.commands(), started.elapsed());
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for task in tasks {
            let _ = task.await;
        }
        let executed = executed(commands_before, commands_after);
        let own = 2 * heartbeats.load(std::sync::atomic::Ordering::SeqCst);
        executed.saturating_sub(own) as f64 / elapsed.as_secs_f64()
    }

    /// The relay period of the "renewal + relay" column: `IT_RELAY_MS`, else the default.
    fn relay_ms() -> u64 {
        std::env::var("IT_RELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CoordinatorOptions::default().heard_relay_ms)
    }

    async fn create_groups(target: &Target, from: usize, to: usize) {
        let store = target.store().await;
        let admin = Coordinator::new(store, CoordinatorOptions::default());
        for i in from..to {
            let group = GroupId::new("idle", format!("g{i}"));
            let create = AdminRequest::CreateGroup { group, shard_count: 4, config: GroupConfig::default() };
            admin.admin(create).await.expect("create group");
        }
    }

    pub fn main() -> ExitCode {
        let settings = settings();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
        let runtime = runtime.expect("tokio runtime");
        runtime.block_on(async move {
            let target = Target::start();
            println!(
                "idle_ticks: {}; idle groups (created, nobody joined); tick every 250 ms; window {:?}",
                target.describe(),
                settings.window
            );
            println!(
                "{:>7} {:>9}  {:>12} {:>12} {:>12} {:>12} {:>12}  {:>9} {:>9} {:>9} {:>9} {:>9}  {:>10} {:>10} {:>10} {:>10} {:>10}",
                "groups",
                "instances",
                "cmds/s every",
                "shared",
                "deferred",
                "def+sh rd/p",
                "def+sh+pace",
                "CPU% ev.",
                "shared",
                "deferred",
                "d+s rd/p",
                "default",
                "pass ms ev",
                "shared",
                "deferred",
                "d+s rd/p",
                "default"
            );
            let mut created = 0;
            let mut ok = true;
            for &groups in &settings.groups {
                create_groups(&target, created, groups.max(created)).await;
                created = created.max(groups);
                for &instances in &settings.instances {
                    // Every pass, no sharing: the ticker before idle groups were deferred and before
                    // instances shared ticks. Then each change alone, then both with the index and
                    // the roster read every pass, then the defaults (both read every
                    // `ticker_refresh_ms`).
                    let (silence, pace) = (TICKER_SILENCE_MS_DEFAULT, TICKER_REFRESH_MS_DEFAULT);
                    let every = measure(&target, instances, (0, 0, 0), settings.window).await;
                    let shared = measure(&target, instances, (0, silence, 0), settings.window).await;
                    let deferred = measure(&target, instances, (120_000, 0, 0), settings.window).await;
                    let unpaced = measure(&target, instances, (120_000, silence, 0), settings.window).await;
                    let both = measure(&target, instances, (120_000, silence, pace), settings.window).await;
                    let rows = [&every, &shared, &deferred, &unpaced, &both];
                    let ms = |row: &Row| row.longest_pass.as_secs_f64() * 1e3;
                    println!(
                        "{:>7} {:>9}  {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>12.1}  {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                        groups,
                        instances,
                        rows[0].commands_per_s,
                        rows[1].commands_per_s,
                        rows[2].commands_per_s,
                        rows[3].commands_per_s,
                        rows[4].commands_per_s,
                        rows[0].cpu_percent,
                        rows[1].cpu_percent,
                        rows[2].cpu_percent,
                        rows[3].cpu_percent,
                        rows[4].cpu_percent,
                        ms(rows[0]),
                        ms(rows[1]),
                        ms(rows[2]),
                        ms(rows[3]),
                        ms(rows[4])
                    );
                    if settings.smoke && groups > 1 && deferred.commands_per_s >= every.commands_per_s {
                        eprintln!("deferred idle groups did not cost fewer commands ({groups} groups)");
                        ok = false;
                    }
                }
            }
            println!(
                "(commands that remain when deferred: per instance and pass, the identity check (one INFO; on a Cluster, CLUSTER SLOTS and each \
                 primary's INFO and CLUSTER NODES), \
                 and every pass (rd/p) or every ticker_refresh_ms (default) the index (SMEMBERS) and, shared, \
                 the tick roster (HINCRBY + HGETALL), independent of the group count. Not in the window: each idle group's record is read once per 120 s audit, one command, \
                 so N groups add N/120 commands/s per instance, or in all when shared)"
            );
            // Groups with members: the heartbeats of their members renew the deferral.
            println!();
            println!(
                "idle groups with one member each, heartbeating every {} ms through the instances in turn; \
                 commands/s besides the heartbeats' own (2 each)",
                GroupConfig::default().heartbeat_interval_ms
            );
            println!(
                "{:>7} {:>9}  {:>20} {:>18} {:>22} {:>7}",
                "groups", "instances", "renewal off (before)", "renewal, no relay", "renewal + relay (def.)", "ratio"
            );
            for &groups in &settings.member_groups {
                let store = target.store().await;
                let admin = Coordinator::new(store, CoordinatorOptions::default());
                for g in 0..groups {
                    let group = GroupId::new("members", format!("m{g}"));
                    let create = AdminRequest::CreateGroup { group, shard_count: 4, config: GroupConfig::default() };
                    // Rows share groups: the next row's larger count creates only the new ones.
                    let _ = admin.admin(create).await;
                }
                for &instances in &settings.instances {
                    let off = measure_members(&target, instances, groups, false, false, settings.window).await;
                    let local = measure_members(&target, instances, groups, true, false, settings.window).await;
                    let on = measure_members(&target, instances, groups, true, true, settings.window).await;
                    println!(
                        "{groups:>7} {instances:>9}  {off:>20.1} {local:>18.1} {on:>22.1} {:>7.2}",
                        on / off.max(1e-9)
                    );
                    if settings.smoke && on >= off {
                        eprintln!("heartbeats through the instance did not save tick commands ({groups} groups)");
                        ok = false;
                    }
                }
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        })
    }
}
