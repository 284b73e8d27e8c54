//! TLS on the coordinator's own HTTP listener (issue 9 part 3), on the real binary with
//! certificates made at test time (`e2e_support::certs`): `https://` is served — to the raw probe
//! and to the client library's `HttpTransport` — while plain HTTP, a client that trusts another
//! CA, and a client checking another server name get no HTTP answer. With `--tls-client-ca-file`
//! (mutual TLS) only clients presenting a certificate from that CA are served.

use std::path::PathBuf;
use std::time::Duration;

use crate::e2e_support::certs::TestCa;
use crate::e2e_support::process::{http, https, CoordinatorProcess, Listener, ADMIN_TOKEN, LONG_LEASES_SERVE_CONFIG};
use crate::e2e_support::{fast_config, group};
use crate::support::RedisServer;
use rsc::client::transport::{CoordinatorTransport, TransportError};
use rsc::core::model::GroupId;
use rsc::core::protocol::RoutingReport;
use rsc::http::client::{HttpClientConfig, HttpTransport};
use rsc::http::tls::ClientTls;

fn cert_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rsc-e2e-https-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn tls_args(cert: &std::path::Path, key: &std::path::Path) -> Vec<String> {
    let path = |p: &std::path::Path| p.display().to_string();
    vec!["--tls-cert-file".into(), path(cert), "--tls-key-file".into(), path(key)]
}

/// Creates `group` (4 shards) through the admin route, over the harness's TLS.
async fn create_group(coordinator: &CoordinatorProcess, group: &GroupId) {
    let body = serde_json::json!({"group": group, "shardCount": 4, "config": fast_config()}).to_string();
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    let answer = coordinator.request("POST", "/v1/admin/groups", &headers, body.into_bytes()).await;
    let answer = answer.expect("create-group answered over https");
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
}

/// A transport to `coordinator` that gives up quickly (a refused handshake must not take the
/// default 2 s per attempt to show).
fn transport(coordinator: &CoordinatorProcess) -> HttpTransport {
    let mut config = HttpClientConfig::new(vec![coordinator.addr()]);
    config.request_timeout = Duration::from_secs(2);
    HttpTransport::new(config)
}

async fn shard_count(transport: &HttpTransport, group: &GroupId) -> Result<u32, TransportError> {
    transport.routing(group, RoutingReport::default()).await.map(|routing| routing.shard_count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_serves_https_and_gives_plain_http_and_untrusting_clients_nothing() {
    let redis = RedisServer::start();
    let dir = cert_dir("tls");
    let ca = TestCa::new(&dir, "main");
    let server = ca.server("coordinator");
    let client_tls = ClientTls::new(&ca.ca_file(), None, None).expect("client TLS");
    let listener = Listener { args: tls_args(&server.cert_file, &server.key_file), tls: Some(client_tls.clone()) };
    // `start_with_listener` returns once `/readyz` answered 200 over https.
    let coordinator = CoordinatorProcess::start_with_listener(&redis.url(), "e2e-https", "", listener).await;
    let addr = coordinator.addr();
    assert_eq!(coordinator.get("/healthz").await.status, 200);
    let group = group("https");
    create_group(&coordinator, &group).await;

    let library = transport(&coordinator).with_tls(client_tls.clone());
    assert_eq!(shard_count(&library, &group).await.expect("routing over https"), 4);

    let plain = http(addr, "GET", "/healthz", &[], Vec::new()).await;
    assert!(plain.is_err(), "plain HTTP to the TLS port got an answer: {plain:?}");
    let plain_library = shard_count(&transport(&coordinator), &group).await;
    assert!(matches!(plain_library, Err(TransportError::Unreachable(_))), "{plain_library:?}");

    let stranger = TestCa::new(&dir, "stranger");
    let distrusting = ClientTls::new(&stranger.ca_file(), None, None).expect("client TLS");
    let refused = https(&distrusting, addr, "GET", "/healthz", &[], Vec::new()).await;
    assert!(refused.is_err(), "a client trusting another CA accepted the server: {refused:?}");
    let other_name = ClientTls::new(&ca.ca_file(), None, Some("coordinator.example")).expect("client TLS");
    let refused = https(&other_name, addr, "GET", "/healthz", &[], Vec::new()).await;
    assert!(refused.is_err(), "the certificate names 127.0.0.1 and localhost only: {refused:?}");
    let by_name = ClientTls::new(&ca.ca_file(), None, Some("localhost")).expect("client TLS");
    let answer = https(&by_name, addr, "GET", "/healthz", &[], Vec::new()).await.expect("localhost is named");
    assert_eq!(answer.status, 200);

    coordinator.assert_no_error_logged();
    assert!(coordinator.log().contains("scheme=\"https\"") || coordinator.log().contains("scheme=https"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_only_clients_with_a_certificate_from_the_client_ca() {
    let redis = RedisServer::start();
    let dir = cert_dir("mtls");
    let ca = TestCa::new(&dir, "main");
    let clients_ca = TestCa::new(&dir, "clients");
    let server = ca.server("coordinator");
    let member = clients_ca.client("member");
    let identity = Some((member.cert_file.as_path(), member.key_file.as_path()));
    let with_cert = ClientTls::new(&ca.ca_file(), identity, None).expect("client TLS");
    let mut args = tls_args(&server.cert_file, &server.key_file);
    args.extend(["--tls-client-ca-file".to_string(), clients_ca.ca_file().display().to_string()]);
    let listener = Listener { args, tls: Some(with_cert.clone()) };
    let coordinator =
        CoordinatorProcess::start_with_listener(&redis.url(), "e2e-mtls", LONG_LEASES_SERVE_CONFIG, listener).await;
    let addr = coordinator.addr();
    let group = group("mtls");
    // The admin CLI over mutual TLS (`coordinator.url()` is https://...).
    let (ca_file, cert_file, key_file) = (
        ca.ca_file().display().to_string(),
        member.cert_file.display().to_string(),
        member.key_file.display().to_string(),
    );
    let create = ["create-group", "--prefix", &group.stream_prefix, "--group", &group.consumer_group, "--shards", "4"];
    let tls_flags = ["--tls-ca-file", ca_file.as_str()];
    let no_cert: Vec<&str> = create.iter().chain(&tls_flags).copied().collect();
    let (status, stdout, stderr) = coordinator.admin(&no_cert).await;
    assert_eq!(status.code(), Some(1), "the CLI without a client certificate is refused: {stdout}{stderr}");
    let identity_flags = ["--tls-client-cert-file", cert_file.as_str(), "--tls-client-key-file", key_file.as_str()];
    let cli_with_cert: Vec<&str> = no_cert.iter().chain(&identity_flags).copied().collect();
    let (status, stdout, stderr) = coordinator.admin(&cli_with_cert).await;
    assert!(status.success(), "create-group over mutual TLS: {stdout}{stderr}");

    assert_eq!(coordinator.get("/healthz").await.status, 200, "a client with a certificate from the CA");
    let library = transport(&coordinator).with_tls(with_cert);
    assert_eq!(shard_count(&library, &group).await.expect("routing over mutual TLS"), 4);

    let without_cert = ClientTls::new(&ca.ca_file(), None, None).expect("client TLS");
    let refused = https(&without_cert, addr, "GET", "/healthz", &[], Vec::new()).await;
    assert!(refused.is_err(), "a client without a certificate was served: {refused:?}");
    let refused_library = shard_count(&transport(&coordinator).with_tls(without_cert), &group).await;
    assert!(matches!(refused_library, Err(TransportError::Unreachable(_))), "{refused_library:?}");

    let stranger = TestCa::new(&dir, "stranger").client("intruder");
    let identity = Some((stranger.cert_file.as_path(), stranger.key_file.as_path()));
    let foreign_cert = ClientTls::new(&ca.ca_file(), identity, None).expect("client TLS");
    let refused = https(&foreign_cert, addr, "GET", "/healthz", &[], Vec::new()).await;
    assert!(refused.is_err(), "a client certificate from another CA was accepted: {refused:?}");

    // The refused handshakes cost the listener nothing: a client with a certificate is still
    // served, by the same process.
    assert_eq!(coordinator.get("/healthz").await.status, 200, "served after the refused handshakes");
    assert_eq!(shard_count(&library, &group).await.expect("routing after the refused handshakes"), 4);
    let mut coordinator = coordinator;
    assert_eq!(coordinator.wait_exit(Duration::ZERO).await, None, "the coordinator is still running");
    coordinator.assert_no_error_logged();
    let _ = std::fs::remove_dir_all(&dir);
}
