//! Steady-state heartbeats against a real `redis-server` (not a test: it prints numbers).
//!
//! Starts its own `redis-server` on a free port (the integration-test harness in `tests/support`),
//! creates a group (64 shards), joins 200 members and settles them (every member `OK`, nothing
//! pending or revoking), then drives *steady* heartbeats — the ones that change nothing, which is
//! what a healthy group sends all day — with N concurrent tasks for a fixed number of heartbeats:
//! 1. `Coordinator<RedisStore>` in-process (no HTTP);
//! 2. the HTTP router in-process (`tower::ServiceExt::oneshot`: routing, middleware, JSON);
//! 3. loopback TCP: the clients' `HttpTransport` against `rsc::http::serve`;
//! 4. the same over TLS (`rsc::http::serve::serve_tls_with`, certificates made at start with
//!    rcgen, keep-alive connections as the clients use them), printed next to row 3 as a ratio.
//!
//! 5. row 1 once more on a Redis Cluster of 3 primaries (the harness's `RedisCluster`), printed
//!    beside the one-server row of the same concurrency as a ratio, with its round trips and
//!    commands per steady heartbeat (Redis work summed over the primaries).
//!
//! Per run: heartbeats/s, p50/p99/max latency (µs) and Redis work per heartbeat from
//! `INFO commandstats` deltas, which count every command the server executed, including the ones
//! a Lua script ran. Client round trips per heartbeat are counted separately, by one pass through
//! a store wrapper that counts calls (each `RedisStore` method is one round trip; a steady
//! heartbeat is `touch_and_check`, HINCRBY + HMGET pipelined, one script on a Cluster). Last, the CPU a steady heartbeat
//! costs the coordinator besides Redis: the observation update plus the decision (the aggregate
//! comes from the decoded cache), and, for comparison, decoding the aggregate.
//!
//! The coordinator's ticker runs during the timed runs, as in production (every 250 ms: INFO
//! twice, SMEMBERS, HMGET, HGETALL per group); its commands are included in the per-heartbeat
//! numbers, where they show as the small fractional entries. The round-trip pass has no ticker.
//!
//! Run: `cargo bench --bench heartbeat_redis`. Knobs (environment): `HB_COUNT` heartbeats per run
//! (default 20000), `HB_REPEAT` runs per row, the median-throughput one reported (3),
//! `HB_CONCURRENCY` (`1,16,64`), `HB_MEMBERS` (200), `HB_SHARDS` (64).
//! Without `--bench` (how `cargo test --all-targets` and `cargo nextest` run it) a small smoke run
//! only checks that every steady heartbeat answers `OK` in one round trip, of at most two Redis
//! commands on one server and of one script call (four commands with the ones it runs) on the
//! Cluster, and exits non-zero otherwise.

// The integration-test harness; this binary uses `RedisServer` and `RedisCluster`.
#[cfg(not(madsim))]
#[allow(unused_imports)]
#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(madsim)]
fn main() {
    eprintln!("heartbeat_redis needs a real redis-server; build it without --cfg madsim");
}

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    bench::main()
}

#[cfg(not(madsim))]
mod bench {
    use std::collections::BTreeMap;
    use std::future::Future;
    use std::process::ExitCode;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use crate::support::RedisServer;
    use rsc::core::model::{Fence, GroupConfig, GroupId, MemberId};
    use rsc::core::protocol::{AdminRequest, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus};
    use rsc::core::{decide_heartbeat, decide_heartbeat_indexed, Context, GroupIndex, LocalView, PlantedBugs};
    use rsc::http::client::{HttpClientConfig, HttpTransport};
    use rsc::http::router::{app, HttpOptions};
    use rsc::http::routes::{group_path, RouteId};
    use rsc::service::codec::decode;
    use rsc::service::{Coordinator, CoordinatorOptions};
    use rsc::store::redis::{RedisStore, RedisStoreOptions};
    use rsc::store::{
        CasStamp, FenceRaise, MetadataStore, ProbeReport, RecordStamp, ServerIdentity, StoreError, StoredRecord,
        TouchCheck, TouchResult, WriteOutcome, WriteRequest,
    };

    /// What one invocation measures.
    struct Settings {
        heartbeats: usize,
        warmup: usize,
        /// Runs per (path, concurrency); the one with the median throughput is reported.
        repeats: usize,
        concurrency: Vec<usize>,
        members: usize,
        shards: u32,
        /// Not run by `cargo bench`: small, and a failure is an error exit.
        smoke: bool,
    }

    fn settings() -> Settings {
        if !std::env::args().any(|a| a == "--bench") {
            return Settings {
                heartbeats: 400,
                warmup: 50,
                repeats: 1,
                concurrency: vec![1, 4],
                members: 20,
                shards: 8,
                smoke: true,
            };
        }
        let number = |name: &str, default: usize| {
            std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
        };
        let concurrency = std::env::var("HB_CONCURRENCY")
            .ok()
            .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).filter(|c| *c > 0).collect::<Vec<usize>>())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vec![1, 16, 64]);
        Settings {
            heartbeats: number("HB_COUNT", 20_000),
            warmup: 2_000,
            repeats: number("HB_REPEAT", 3).max(1),
            concurrency,
            members: number("HB_MEMBERS", 200),
            shards: u32::try_from(number("HB_SHARDS", 64)).unwrap_or(64),
            smoke: false,
        }
    }

    pub fn main() -> ExitCode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.iter().any(|a| a == "--list") {
            // `cargo nextest`'s listing protocol: one `name: test` line per test. The smoke run is
            // the only test; nextest then runs it as `heartbeat_redis smoke --exact`.
            if !args.iter().any(|a| a == "--ignored") {
                println!("smoke: test");
            }
            return ExitCode::SUCCESS;
        }
        let settings = settings();
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
        match runtime.block_on(run(&server, &settings)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("heartbeat_redis FAILED: {error}");
                ExitCode::FAILURE
            }
        }
    }

    async fn run(server: &RedisServer, settings: &Settings) -> Result<(), String> {
        let store =
            RedisStore::connect(&server.url(), RedisStoreOptions::default()).await.map_err(|e| e.to_string())?;
        let coordinator = Coordinator::new(store.clone(), CoordinatorOptions::default());
        let probe = coordinator.start().await.map_err(|e| e.to_string())?;
        let group = GroupId::new("bench", "hb");
        let create = AdminRequest::CreateGroup {
            group: group.clone(),
            shard_count: settings.shards,
            config: GroupConfig::default(),
        };
        coordinator.admin(create).await.map_err(|e| e.to_string())?;
        let settle_started = Instant::now();
        let (members, passes) = settle(&coordinator, &group, settings.members).await?;
        let settle_ms = settle_started.elapsed().as_millis();
        let aggregate_bytes = coordinator
            .describe(&group)
            .await
            .map(|d| serde_json::to_string(&d.metadata).map_or(0, |s| s.len()))
            .map_err(|e| e.to_string())?;
        let members = Arc::new(members);
        let ticker = tokio::spawn({
            let coordinator = coordinator.clone();
            async move { coordinator.run_ticker().await }
        });

        print_header(server, settings, &probe, passes, settle_ms, aggregate_bytes);
        let mut rows = Vec::new();
        let in_process = {
            let coordinator = coordinator.clone();
            move |req: HeartbeatRequest| {
                let coordinator = coordinator.clone();
                async move { coordinator.heartbeat(req).await.map_err(|e| e.to_string()) }
            }
        };
        for &n in &settings.concurrency {
            rows.push(measure(&[server], IN_PROCESS, n, settings, &members, in_process.clone()).await?);
        }
        let router = app(coordinator.clone(), HttpOptions::default());
        let oneshot = {
            let path = group_path(RouteId::Heartbeat, &group);
            move |req: HeartbeatRequest| oneshot_heartbeat(router.clone(), path.clone(), req)
        };
        for &n in &settings.concurrency {
            rows.push(
                measure(&[server], "HTTP router, in-process oneshot", n, settings, &members, oneshot.clone()).await?,
            );
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let http_server = tokio::spawn(rsc::http::serve::serve(
            listener,
            app(coordinator.clone(), HttpOptions::default()),
            std::future::pending(),
        ));
        let max_concurrency = settings.concurrency.iter().copied().max().unwrap_or(1);
        let transport = Arc::new(HttpTransport::new(HttpClientConfig {
            addrs: vec![addr],
            request_timeout: Duration::from_secs(5),
            idle_per_address_max: max_concurrency,
            client_token: None,
        }));
        let loopback = move |req: HeartbeatRequest| {
            let transport = Arc::clone(&transport);
            async move {
                use rsc::client::CoordinatorTransport;
                transport.heartbeat(req).await.map_err(|e| e.to_string())
            }
        };
        // The same server with client tokens configured (four valid, as during a rotation: every
        // one is compared), and a transport that sends the last: credentials on vs off.
        let tokens: Vec<String> = (0..4).map(|i| format!("bench-client-token-{i:04}")).collect();
        let options = HttpOptions {
            client_tokens: rsc::http::auth::ClientTokens::parse(&tokens).map_err(|e| e.to_string())?,
            ..HttpOptions::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let token_addr = listener.local_addr().map_err(|e| e.to_string())?;
        let token_server =
            tokio::spawn(rsc::http::serve::serve(listener, app(coordinator.clone(), options), std::future::pending()));
        let token_transport = Arc::new(HttpTransport::new(
            HttpClientConfig {
                addrs: vec![token_addr],
                request_timeout: Duration::from_secs(5),
                idle_per_address_max: max_concurrency,
                client_token: None,
            }
            .with_client_token(tokens[3].clone()),
        ));
        let with_token = move |req: HeartbeatRequest| {
            let transport = Arc::clone(&token_transport);
            async move {
                use rsc::client::CoordinatorTransport;
                transport.heartbeat(req).await.map_err(|e| e.to_string())
            }
        };
        for &n in &settings.concurrency {
            rows.push(measure(&[server], LOOPBACK, n, settings, &members, loopback.clone()).await?);
            rows.push(measure(&[server], LOOPBACK_TOKEN, n, settings, &members, with_token.clone()).await?);
        }
        token_server.abort();
        http_server.abort();
        let (tls_server, tls_loopback) = tls_loopback(&coordinator, max_concurrency).await?;
        for &n in &settings.concurrency {
            rows.push(measure(&[server], LOOPBACK_TLS, n, settings, &members, tls_loopback.clone()).await?);
        }
        tls_server.abort();
        ticker.abort();
        print_rows(&rows);
        print_ratios(&rows, LOOPBACK_TLS, "TLS on vs off (HTTPS / HTTP loopback, same run, keep-alive connections)");
        print_ratios(&rows, LOOPBACK_TOKEN, "Client token on vs off (HTTP loopback, same run; 4 tokens configured)");

        let trips = count_round_trips(&[server], &store, &members, settings).await?;
        print_summary(&rows, &trips);
        cpu_per_heartbeat(&store, &group, &members[0]).await?;
        let cluster = on_cluster(settings, &rows).await?;
        let failed: Vec<&Row> = rows.iter().chain(&cluster.rows).filter(|r| r.errors > 0).collect();
        if let Some(row) = failed.first() {
            return Err(format!("{} heartbeats failed in {} (first: {})", row.errors, row.path, row.first_error));
        }
        // On one server: HINCRBY + HMGET, pipelined. On a Cluster: one script call running HMGET,
        // HINCRBY and HGET (INFO commandstats counts the EVALSHA beside them), since two
        // requests there are not ordered at Redis (DESIGN §11).
        for (name, trips, most) in [("one server", &trips, 2.0), ("Redis Cluster", &cluster.trips, 4.0)] {
            if settings.smoke && (trips.per_heartbeat - 1.0).abs() > f64::EPSILON {
                return Err(format!(
                    "{name}: {:.3} round trips per steady heartbeat, expected exactly 1",
                    trips.per_heartbeat
                ));
            }
            if settings.smoke && trips.commands_per_heartbeat > most + 1e-9 {
                return Err(format!(
                    "{name}: {:.3} Redis commands per steady heartbeat, expected at most {most}",
                    trips.commands_per_heartbeat
                ));
            }
        }
        Ok(())
    }

    const IN_PROCESS: &str = "coordinator, in-process";
    const IN_PROCESS_CLUSTER: &str = "in-process, Redis Cluster";

    /// The rows measured on a Redis Cluster.
    struct ClusterRun {
        rows: Vec<Row>,
        trips: RoundTrips,
    }

    /// The in-process rows once more on a Redis Cluster of 3 primaries (a group lives in one
    /// slot, so its heartbeats go to one primary; the ticker's INFO goes to all three), printed
    /// beside the one-server rows of the same run, and the round trips and commands of a steady
    /// heartbeat there.
    async fn on_cluster(settings: &Settings, single: &[Row]) -> Result<ClusterRun, String> {
        let cluster = crate::support::redis_cluster::RedisCluster::start(3, 0);
        let store = RedisStore::connect_cluster(&cluster.nodes(), RedisStoreOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let coordinator = Coordinator::new(store.clone(), CoordinatorOptions::default());
        coordinator.start().await.map_err(|e| e.to_string())?;
        let group = GroupId::new("bench", "hb");
        let create = AdminRequest::CreateGroup {
            group: group.clone(),
            shard_count: settings.shards,
            config: GroupConfig::default(),
        };
        coordinator.admin(create).await.map_err(|e| e.to_string())?;
        let (members, _) = settle(&coordinator, &group, settings.members).await?;
        let members = Arc::new(members);
        let ticker = tokio::spawn({
            let coordinator = coordinator.clone();
            async move { coordinator.run_ticker().await }
        });
        let primaries = cluster.primaries();
        let in_process = move |req: HeartbeatRequest| {
            let coordinator = coordinator.clone();
            async move { coordinator.heartbeat(req).await.map_err(|e| e.to_string()) }
        };
        let mut rows = Vec::new();
        for &n in &settings.concurrency {
            rows.push(measure(&primaries, IN_PROCESS_CLUSTER, n, settings, &members, in_process.clone()).await?);
        }
        ticker.abort();
        let trips = count_round_trips(&primaries, &store, &members, settings).await?;
        println!("\nOn a Redis Cluster of 3 primaries (the group's keys on one of them), same run:");
        print_rows(&rows);
        for row in &rows {
            let Some(one) = single.iter().find(|r| r.path == IN_PROCESS && r.concurrency == row.concurrency) else {
                continue;
            };
            println!(
                "  concurrency {:>3}: throughput x{:.2} of one server ({:.0} vs {:.0} hb/s), p99 {} vs {} us",
                row.concurrency,
                row.per_second / one.per_second,
                row.per_second,
                one.per_second,
                row.p99_us,
                one.p99_us
            );
        }
        let calls: Vec<String> = trips.by_call.iter().map(|(name, per)| format!("{name} {per:.3}")).collect();
        let commands: Vec<String> = trips.commands.iter().map(|(name, per)| format!("{name} {per:.3}")).collect();
        println!(
            "steady heartbeats on the Cluster without the ticker: client round trips per heartbeat {:.3} ({}); Redis \
             commands per heartbeat {:.3} = {}",
            trips.per_heartbeat,
            calls.join(", "),
            trips.commands_per_heartbeat,
            commands.join(" + ")
        );
        Ok(ClusterRun { rows, trips })
    }

    const LOOPBACK: &str = "HTTP loopback, HttpTransport";
    const LOOPBACK_TOKEN: &str = "HTTP loopback, client token on";
    /// What the TLS row's sender returns (boxed: the closure's async block has no nameable type).
    type SendFuture = std::pin::Pin<Box<dyn Future<Output = Result<HeartbeatResponse, String>> + Send>>;
    const LOOPBACK_TLS: &str = "HTTPS loopback, HttpTransport";

    /// A TLS listener serving the router on loopback (a CA and a server certificate for 127.0.0.1
    /// made now with rcgen) and the heartbeat sender of an `HttpTransport` trusting that CA.
    async fn tls_loopback<S: MetadataStore>(
        coordinator: &Coordinator<S>,
        idle_per_address_max: usize,
    ) -> Result<
        (tokio::task::JoinHandle<()>, impl Fn(HeartbeatRequest) -> SendFuture + Clone + Send + Sync + 'static),
        String,
    > {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let err = |e: rcgen::Error| e.to_string();
        let ca_key = KeyPair::generate().map_err(err)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).map_err(err)?;
        let key = KeyPair::generate().map_err(err)?;
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).map_err(err)?.signed_by(&key, &ca, &ca_key);
        let cert = cert.map_err(err)?;
        let dir = std::env::temp_dir().join(format!("rsc-heartbeat-bench-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let (ca_file, cert_file, key_file) = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
        for (path, pem) in [(&ca_file, ca.pem()), (&cert_file, cert.pem()), (&key_file, key.serialize_pem())] {
            std::fs::write(path, pem).map_err(|e| e.to_string())?;
        }
        let server_tls = rsc::http::tls::server_config(&cert_file, &key_file, None).map_err(|e| e.to_string())?;
        let client_tls = rsc::http::tls::ClientTls::new(&ca_file, None, None).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(&dir);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let router = app(coordinator.clone(), HttpOptions::default());
        let config = rsc::http::serve::ServeConfig::default();
        let server = tokio::spawn(rsc::http::serve::serve_tls_with(
            listener,
            router,
            config,
            server_tls,
            std::future::pending(),
        ));
        let transport = Arc::new(
            HttpTransport::new(HttpClientConfig {
                addrs: vec![addr],
                request_timeout: Duration::from_secs(5),
                idle_per_address_max,
                client_token: None,
            })
            .with_tls(client_tls),
        );
        let send = move |req: HeartbeatRequest| {
            let transport = Arc::clone(&transport);
            Box::pin(async move {
                use rsc::client::CoordinatorTransport;
                transport.heartbeat(req).await.map_err(|e| e.to_string())
            }) as SendFuture
        };
        Ok((server, send))
    }

    /// The request a member sends next, and whether its last answer left nothing to do.
    fn apply(req: &mut HeartbeatRequest, r: &HeartbeatResponse) -> bool {
        req.member_epoch = r.member_epoch;
        req.metadata_version = r.metadata_version;
        req.assignment_epoch = r.assignment_epoch;
        // Only OK starts shards; other statuses keep what is already read and still assigned.
        req.owned = if r.status == HeartbeatStatus::Ok {
            r.assigned.clone()
        } else {
            req.owned.iter().copied().filter(|s| r.assigned.contains(s)).collect()
        };
        // A bench member drains instantly: every revoked shard is reported REVOKED at once.
        req.revoking = r.revoked_reports();
        r.status == HeartbeatStatus::Ok && r.revoke.is_empty() && r.pending.is_empty()
    }

    /// Joins `count` members, then heartbeats them round-robin until a whole pass is settled at
    /// one metadataVersion. Returns each member's steady request and the passes it took.
    async fn settle<S: MetadataStore>(
        coordinator: &Coordinator<S>,
        group: &GroupId,
        count: usize,
    ) -> Result<(Vec<HeartbeatRequest>, usize), String> {
        let mut members: Vec<HeartbeatRequest> = (0..count)
            .map(|i| HeartbeatRequest {
                metadata_version_proof: None,
                group: group.clone(),
                member_id: format!("member-{i:04}"),
                member_epoch: 0,
                metadata_version: 0,
                assignment_epoch: 0,
                owned: Vec::new(),
                revoking: Vec::new(),
                leave: false,
                member_session: Some(rsc::core::protocol::MemberSession::generate()),
                fenced: Vec::new(),
            })
            .collect();
        for member in &mut members {
            let answer = coordinator.heartbeat(member.clone()).await.map_err(|e| format!("join: {e}"))?;
            apply(member, &answer);
        }
        for pass in 1..=100 {
            let mut settled = true;
            for member in &mut members {
                let answer = coordinator.heartbeat(member.clone()).await.map_err(|e| format!("settle: {e}"))?;
                settled &= apply(member, &answer);
            }
            let version = members[0].metadata_version;
            if settled && members.iter().all(|m| m.metadata_version == version) {
                return Ok((members, pass));
            }
        }
        Err("the group did not settle within 100 passes".into())
    }

    async fn oneshot_heartbeat(
        router: axum::Router,
        path: String,
        req: HeartbeatRequest,
    ) -> Result<HeartbeatResponse, String> {
        let body = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
        let request = axum::http::Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .map_err(|e| e.to_string())?;
        let response = router.oneshot(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)));
        }
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    }

    /// One measured run of one path at one concurrency.
    struct Row {
        path: &'static str,
        concurrency: usize,
        heartbeats: usize,
        per_second: f64,
        p50_us: u32,
        p99_us: u32,
        max_us: u32,
        /// Commands the server executed per heartbeat, by command (INFO excluded).
        commands: BTreeMap<String, f64>,
        errors: usize,
        first_error: String,
    }

    /// `settings.repeats` runs after one warm-up; the median-throughput run, with every run's errors.
    async fn measure<F, Fut>(
        servers: &[&RedisServer],
        path: &'static str,
        concurrency: usize,
        settings: &Settings,
        members: &Arc<Vec<HeartbeatRequest>>,
        send: F,
    ) -> Result<Row, String>
    where
        F: Fn(HeartbeatRequest) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<HeartbeatResponse, String>> + Send + 'static,
    {
        drive(concurrency, settings.warmup, members, send.clone()).await;
        let mut runs = Vec::with_capacity(settings.repeats);
        for _ in 0..settings.repeats {
            runs.push(measure_once(servers, path, concurrency, settings, members, send.clone()).await);
        }
        let errors: usize = runs.iter().map(|r| r.errors).sum();
        let first_error = runs.iter().map(|r| r.first_error.clone()).find(|e| !e.is_empty()).unwrap_or_default();
        runs.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
        let median = runs.swap_remove(runs.len() / 2);
        Ok(Row { errors, first_error, ..median })
    }

    async fn measure_once<F, Fut>(
        servers: &[&RedisServer],
        path: &'static str,
        concurrency: usize,
        settings: &Settings,
        members: &Arc<Vec<HeartbeatRequest>>,
        send: F,
    ) -> Row
    where
        F: Fn(HeartbeatRequest) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<HeartbeatResponse, String>> + Send + 'static,
    {
        let before = commandstats(servers);
        let started = Instant::now();
        let outcome = drive(concurrency, settings.heartbeats, members, send).await;
        let elapsed_s = started.elapsed().as_secs_f64();
        let after = commandstats(servers);
        let mut latencies = outcome.latencies_us;
        latencies.sort_unstable();
        let at = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
        let count = settings.heartbeats as f64;
        let commands = after
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, calls)| (name.clone(), (calls - before.get(name).copied().unwrap_or(0)) as f64 / count))
            .filter(|(_, per)| *per > 0.0)
            .collect();
        Row {
            path,
            concurrency,
            heartbeats: settings.heartbeats,
            per_second: count / elapsed_s,
            p50_us: at(0.50),
            p99_us: at(0.99),
            max_us: latencies.last().copied().unwrap_or(0),
            commands,
            errors: outcome.errors,
            first_error: outcome.first_error.unwrap_or_default(),
        }
    }

    struct Outcome {
        latencies_us: Vec<u32>,
        errors: usize,
        first_error: Option<String>,
    }

    /// `total` heartbeats from `concurrency` tasks, members taken round-robin. Anything but an
    /// `OK` answer counts as an error.
    async fn drive<F, Fut>(concurrency: usize, total: usize, members: &Arc<Vec<HeartbeatRequest>>, send: F) -> Outcome
    where
        F: Fn(HeartbeatRequest) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<HeartbeatResponse, String>> + Send + 'static,
    {
        let next = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..concurrency)
            .map(|_| {
                let (next, members, send) = (Arc::clone(&next), Arc::clone(members), send.clone());
                tokio::spawn(async move {
                    let mut out = Outcome { latencies_us: Vec::new(), errors: 0, first_error: None };
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= total {
                            return out;
                        }
                        let req = members[k % members.len()].clone();
                        let started = Instant::now();
                        let answer = send(req).await;
                        out.latencies_us.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
                        let error = match answer {
                            Ok(r) if r.status == HeartbeatStatus::Ok => continue,
                            Ok(r) => format!("status {:?}", r.status),
                            Err(e) => e,
                        };
                        out.errors += 1;
                        out.first_error.get_or_insert(error);
                    }
                })
            })
            .collect();
        let mut all = Outcome { latencies_us: Vec::with_capacity(total), errors: 0, first_error: None };
        for task in tasks {
            match task.await {
                Ok(mut part) => {
                    all.latencies_us.append(&mut part.latencies_us);
                    all.errors += part.errors;
                    all.first_error = all.first_error.or(part.first_error);
                }
                Err(e) => {
                    all.errors += 1;
                    all.first_error.get_or_insert(format!("task failed: {e}"));
                }
            }
        }
        all
    }

    /// `INFO commandstats` as command -> calls, summed over `servers` (a Cluster's primaries).
    fn commandstats(servers: &[&RedisServer]) -> BTreeMap<String, u64> {
        let mut all = BTreeMap::new();
        for server in servers {
            let text: String = redis::from_redis_value(server.cmd(&["INFO", "commandstats"])).expect("INFO is text");
            for line in text.lines() {
                let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
                    continue;
                };
                let Some(calls) = rest.split(',').find_map(|kv| kv.strip_prefix("calls=")?.parse::<u64>().ok()) else {
                    continue;
                };
                *all.entry(name.to_string()).or_default() += calls;
            }
        }
        all
    }

    /// Store calls per steady heartbeat, counted by a wrapper (each call is one round trip).
    struct RoundTrips {
        heartbeats: usize,
        per_heartbeat: f64,
        by_call: BTreeMap<&'static str, f64>,
        /// Every command the server executed during the pass (INFO commandstats, the pass's own
        /// INFO excluded; no ticker runs), per heartbeat.
        commands_per_heartbeat: f64,
        commands: BTreeMap<String, f64>,
    }

    async fn count_round_trips(
        servers: &[&RedisServer],
        store: &RedisStore,
        members: &Arc<Vec<HeartbeatRequest>>,
        settings: &Settings,
    ) -> Result<RoundTrips, String> {
        let counted = Counted { inner: store.clone(), calls: Arc::default() };
        let calls = Arc::clone(&counted.calls);
        let coordinator = Coordinator::new(counted, CoordinatorOptions::default());
        let send = move |req: HeartbeatRequest| {
            let coordinator = coordinator.clone();
            async move { coordinator.heartbeat(req).await.map_err(|e| e.to_string()) }
        };
        // This fresh coordinator process has not read the group yet; warm it like the others.
        drive(4, settings.warmup, members, send.clone()).await;
        calls.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let heartbeats = settings.heartbeats.min(10_000);
        let before = commandstats(servers);
        let outcome = drive(4, heartbeats, members, send).await;
        let after = commandstats(servers);
        if outcome.errors > 0 {
            return Err(format!("round-trip pass: {} errors ({:?})", outcome.errors, outcome.first_error));
        }
        let count = heartbeats as f64;
        let by_call: BTreeMap<&'static str, f64> = calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, calls)| (*name, *calls as f64 / count))
            .collect();
        let commands: BTreeMap<String, f64> = after
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, calls)| (name.clone(), (calls - before.get(name).copied().unwrap_or(0)) as f64 / count))
            .filter(|(_, per)| *per > 0.0)
            .collect();
        Ok(RoundTrips {
            heartbeats,
            per_heartbeat: by_call.values().sum(),
            by_call,
            commands_per_heartbeat: commands.values().sum(),
            commands,
        })
    }

    /// A `MetadataStore` that counts calls by method and passes them on.
    struct Counted<S> {
        inner: S,
        calls: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    }

    impl<S> Counted<S> {
        fn hit(&self, name: &'static str) {
            *self.calls.lock().unwrap_or_else(|p| p.into_inner()).entry(name).or_default() += 1;
        }
    }

    /// Implements `MetadataStore` for `Counted<S>`: count the call, then delegate.
    macro_rules! counted {
        ($($method:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
            impl<S: MetadataStore> MetadataStore for Counted<S> {
                $(async fn $method(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
                    self.hit(stringify!($method));
                    self.inner.$method($($arg),*).await
                })*
            }
        };
    }

    counted! {
        load(group: &GroupId) -> Option<StoredRecord>;
        touch_and_load_by(group: &GroupId, member: &str, step: u64) -> TouchResult;
        touch_and_check_by(group: &GroupId, member: &str, known: &RecordStamp, step: u64) -> TouchCheck;
        liveness(group: &GroupId) -> BTreeMap<MemberId, u64>;
        write(group: &GroupId, request: WriteRequest) -> WriteOutcome;
        delete(group: &GroupId, expected: &CasStamp) -> WriteOutcome;
        acquire_mutex(group: &GroupId, token: &str, ttl_ms: u64) -> bool;
        release_mutex(group: &GroupId, token: &str) -> bool;
        index_add(group: &GroupId) -> ();
        index_members() -> Vec<GroupId>;
        tick_roster(instance: &str) -> BTreeMap<String, u64>;
        forget_tickers(instances: &[String]) -> ();
        exchange_heard(sender: &str, outgoing: &[(String, String)], ttl_ms: u64, senders: &[String]) -> Vec<Option<String>>;
        rebuild_index() -> Vec<GroupId>;
        identity() -> ServerIdentity;
        probe() -> ProbeReport;
        raise_fences(raises: &[FenceRaise]) -> Vec<Fence>;
        read_fences(keys: &[String]) -> Vec<Option<Fence>>;
    }

    /// The coordinator's own CPU per steady heartbeat, besides Redis: the observation update (wait
    /// windows; liveness windows filled by a tick, as in production) plus the read-only decision,
    /// from the decoded-aggregate cache; and, for comparison, decoding the aggregate, which a
    /// heartbeat pays only after the record changed. Mean of 2,000 iterations each.
    async fn cpu_per_heartbeat(store: &RedisStore, group: &GroupId, req: &HeartbeatRequest) -> Result<(), String> {
        let record = store.load(group).await.map_err(|e| e.to_string())?.ok_or("the group vanished")?;
        let g = decode(group, &record).map_err(|e| e.to_string())?;
        let liveness = store.liveness(group).await.map_err(|e| e.to_string())?;
        let mut view = LocalView::default();
        view.observe(0, &g, Some(&liveness));
        const ROUNDS: u32 = 2_000;
        let started = Instant::now();
        for _ in 0..ROUNDS {
            std::hint::black_box(decode(group, std::hint::black_box(&record)).map_err(|e| e.to_string())?);
        }
        let decode_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS);
        let revision = record.revision;
        fn context(stored_revision: u64, observations: &rsc::core::Observations) -> Context<'_> {
            Context {
                fresh_view_key: None,
                wall_clock_secs: 0,
                stored_revision,
                observations,
                planted: PlantedBugs::NONE,
                nonce: 1,
            }
        }
        let started = Instant::now();
        for round in 0..ROUNDS {
            let obs = view.observe_waits(u64::from(round), &g);
            std::hint::black_box(decide_heartbeat(&g, std::hint::black_box(req), context(revision, &obs)));
        }
        let decide_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS);
        // As the coordinator answers: from the per-member index of the cached state, built by the
        // first steady heartbeat after the record changed.
        let started = Instant::now();
        let index = GroupIndex::build(&g);
        let build_us = started.elapsed().as_secs_f64() * 1e6;
        let started = Instant::now();
        for round in 0..ROUNDS {
            let obs = view.observe_listed_waits(u64::from(round), &g, index.waits().iter().copied());
            std::hint::black_box(decide_heartbeat_indexed(
                &g,
                Some(&index),
                std::hint::black_box(req),
                context(revision, &obs),
            ));
        }
        let indexed_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS);
        println!(
            "coordinator CPU per steady heartbeat besides Redis: observe + decide {indexed_us:.1} us from the \
             per-member index ({decide_us:.1} us walking the state; building the index, paid once after the record \
             changed: {build_us:.1} us) ({} members, {} shards); decoding the {}-byte aggregate, paid only after \
             the record changed: {decode_us:.1} us",
            g.members.len(),
            g.shard_count,
            record.aggregate.len(),
        );
        Ok(())
    }

    fn print_header(
        server: &RedisServer,
        settings: &Settings,
        probe: &ProbeReport,
        passes: usize,
        settle_ms: u128,
        aggregate_bytes: usize,
    ) {
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        println!("heartbeat_redis{}", if settings.smoke { " (smoke run; `cargo bench` for numbers)" } else { "" });
        println!("machine: {cores} cores (shared by this process and redis-server), load average {}", load.join(" "));
        println!("redis-server {} on 127.0.0.1:{} (spawned, no persistence)", probe.server_version, server.port());
        println!(
            "group bench:hb: {} shards, {} members joined and settled in {passes} passes ({settle_ms} ms); \
             aggregate {aggregate_bytes} bytes of JSON",
            settings.shards, settings.members
        );
        println!(
            "{} steady heartbeats per run, median-throughput run of {} after {} warm-up; tokio multi-thread \
             runtime; ticker running\n",
            settings.heartbeats, settings.repeats, settings.warmup
        );
    }

    fn print_rows(rows: &[Row]) {
        println!(
            "{:<32} {:>4} {:>9} {:>7} {:>7} {:>8}  redis commands per heartbeat (INFO commandstats)",
            "path", "conc", "hb/s", "p50_us", "p99_us", "max_us"
        );
        for row in rows {
            let total: f64 = row.commands.values().sum();
            let parts: Vec<String> = row.commands.iter().map(|(name, per)| format!("{name} {per:.3}")).collect();
            println!(
                "{:<32} {:>4} {:>9.0} {:>7} {:>7} {:>8}  {total:.2} = {}{}",
                row.path,
                row.concurrency,
                row.per_second,
                row.p50_us,
                row.p99_us,
                row.max_us,
                parts.join(" + "),
                if row.errors > 0 { format!("  ({} of {} FAILED)", row.errors, row.heartbeats) } else { String::new() },
            );
        }
    }

    /// Rows of `path` against the plain loopback rows of the same concurrency, as ratios.
    fn print_ratios(rows: &[Row], path: &str, title: &str) {
        println!("\n{title}:");
        for plain in rows.iter().filter(|r| r.path == LOOPBACK) {
            let Some(on) = rows.iter().find(|r| r.path == path && r.concurrency == plain.concurrency) else { continue };
            println!(
                "  concurrency {:>3}: throughput x{:.2} ({:.0} vs {:.0} hb/s), p50 x{:.2} ({} vs {} us), p99 x{:.2}",
                plain.concurrency,
                on.per_second / plain.per_second,
                on.per_second,
                plain.per_second,
                f64::from(on.p50_us) / f64::from(plain.p50_us.max(1)),
                on.p50_us,
                plain.p50_us,
                f64::from(on.p99_us) / f64::from(plain.p99_us.max(1)),
            );
        }
    }

    fn print_summary(rows: &[Row], trips: &RoundTrips) {
        let calls: Vec<String> = trips.by_call.iter().map(|(name, per)| format!("{name} {per:.3}")).collect();
        let commands: Vec<String> = trips.commands.iter().map(|(name, per)| format!("{name} {per:.3}")).collect();
        println!(
            "\nsteady heartbeats without the ticker ({} heartbeats): client round trips per heartbeat {:.3} ({}); \
             Redis commands per heartbeat {:.3} = {} (goal <= 2 commands and 1 round trip: {})",
            trips.heartbeats,
            trips.per_heartbeat,
            calls.join(", "),
            trips.commands_per_heartbeat,
            commands.join(" + "),
            if trips.commands_per_heartbeat <= 2.0 + 1e-9 && (trips.per_heartbeat - 1.0).abs() < 1e-9 {
                "met"
            } else {
                "NOT met"
            }
        );
        let best =
            |path: &str| rows.iter().filter(|r| r.path == path).max_by(|a, b| a.per_second.total_cmp(&b.per_second));
        let direct = best("coordinator, in-process");
        if let Some(d) = direct {
            println!(
                "best in-process: {:.0} heartbeats/s at concurrency {} (goal >= 20000: {})",
                d.per_second,
                d.concurrency,
                if d.per_second >= 20_000.0 { "met" } else { "NOT met on this machine" }
            );
        }
        for path in ["HTTP router, in-process oneshot", "HTTP loopback, HttpTransport"] {
            if let (Some(d), Some(h)) = (direct, best(path)) {
                println!(
                    "{path}: best {:.0} heartbeats/s = {:.2}x the in-process best",
                    h.per_second,
                    h.per_second / d.per_second
                );
            }
        }
        let single = |path: &str| rows.iter().find(|r| r.path == path && r.concurrency == 1);
        if let (Some(d), Some(h)) = (single("coordinator, in-process"), single("HTTP loopback, HttpTransport")) {
            let ratio = f64::from(h.p50_us) / f64::from(d.p50_us.max(1));
            println!(
                "HTTP loopback p50 at concurrency 1: {} us = {ratio:.2}x the in-process {} us",
                h.p50_us, d.p50_us
            );
        }
    }
}
