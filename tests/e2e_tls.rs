//! End to end over TLS: the real `coordinator` binary serving from a TLS-only `redis-server`
//! (`--port 0 --tls-port`, `tls-auth-clients yes`) whose certificates come from a private CA made
//! with `openssl` at test time. The CA file and the client certificate and key reach the binary
//! through the `--config` file keys (`redis_tls_*`; the flags and environment variables are unit
//! tested in `src/bin/coordinator/cli.rs` and `config.rs`).
//!
//! Run: `cargo test --test e2e_tls` (needs `redis-server` built with TLS, as Debian's is, and the
//! `openssl` CLI). Real tokio; not built under `--cfg madsim`.

#![cfg(not(madsim))]

mod e2e_support;
#[allow(unused_imports)] // The harness re-exports what other test binaries use.
mod support;

use std::time::Duration;

use e2e_support::process::{http, serve_expecting_exit, CoordinatorProcess};
use e2e_support::{fast_config, group, join_json};
use rsc::http::routes::{group_path, RouteId};
use support::redis_server::TlsClientAuth;
use support::{RedisServer, ServerConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_serves_heartbeats_from_a_mutual_tls_redis() {
    let redis = RedisServer::start_with(ServerConfig { tls: Some(TlsClientAuth::Yes), ..ServerConfig::default() });
    let files = redis.tls_files().expect("TLS files").clone();
    let url = redis.url();
    assert!(url.starts_with("rediss://"), "{url}");

    // Without the CA (the platform's roots only) the binary stops at startup, naming the cause.
    let failed = serve_expecting_exit(&url, Duration::from_secs(20)).await;
    assert_eq!(failed.status.code(), Some(3), "exit 3 (store unreachable):\n{}", failed.stderr);
    let error_line = failed.stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(error_line.contains("certificate"), "the error says why:\n{}", failed.stderr);
    eprintln!("without the CA: exit 3 after {:?}: {error_line}", failed.elapsed);

    let config = format!(
        "redis_tls_ca_file = {:?}\nredis_tls_client_cert_file = {:?}\nredis_tls_client_key_file = {:?}\n",
        files.ca_cert.display().to_string(),
        files.client_cert.display().to_string(),
        files.client_key.display().to_string(),
    );
    // `start_with_config` returns once `/readyz` answers 200 (after the startup store probe).
    let coordinator = CoordinatorProcess::start_with_config(&url, "e2e-tls", &config).await;
    assert_eq!(coordinator.get("/readyz").await.status, 200);

    let group = group("tls");
    coordinator.create_group(&group, 2, &fast_config()).await;
    let heartbeat = group_path(RouteId::Heartbeat, &group);
    let join = join_json(&group, "alpha");
    let json = ("Content-Type", "application/json");
    let joined = http(coordinator.addr(), "POST", &heartbeat, &[json], join.into_bytes()).await.expect("join");
    assert_eq!(joined.status, 200, "{}", String::from_utf8_lossy(&joined.body));
    let answer = joined.json();
    assert!(answer["memberEpoch"].as_u64().is_some_and(|e| e > 0), "joined with an epoch: {answer}");
    assert_eq!(answer["shardCount"], 2, "{answer}");

    // The join reached Redis through TLS: the member is recorded and its liveness counted.
    let described = coordinator.describe(&group).await;
    assert!(described["metadata"]["members"]["alpha"].is_object(), "{described}");
    let liveness = redis.cmd(&["HGET", &rsc::store::keys::liveness_key(&group), "alpha"]);
    assert!(matches!(liveness, redis::Value::BulkString(_)), "liveness counter: {liveness:?}");
    coordinator.assert_no_error_logged();
    eprintln!("{}", coordinator.log().lines().filter(|l| l.contains("probe passed")).collect::<Vec<_>>().join("\n"));
}
