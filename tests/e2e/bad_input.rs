//! Story 5: bad input over real HTTP, in bytes (malformed and oversized bodies) and in time
//! (request bodies that never finish).

use std::time::{Duration, Instant};

use crate::e2e_support::process::{http, parse_answer, CoordinatorProcess, ADMIN_TOKEN, LONG_LEASES_SERVE_CONFIG};
use crate::e2e_support::{fast_config, group, join_json};
use crate::support::RedisServer;
use rsc::core::protocol::ErrorCode;
use rsc::http::routes::{group_path, RouteId};

/// One raw request: method, path, headers, body, and the status it must get.
type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_requests_get_typed_4xx_json_and_change_nothing_in_redis() {
    let redis = RedisServer::start();
    let coordinator = CoordinatorProcess::start_with_config(&redis.url(), "e2e-input", LONG_LEASES_SERVE_CONFIG).await;
    let group = group("input");
    // Long leases: nothing may change by itself while the cases run.
    coordinator.create_group(&group, 2, &rsc::core::model::GroupConfig::default()).await;
    let heartbeat = group_path(RouteId::Heartbeat, &group);
    let join = join_json(&group, "alpha");
    let json = ("Content-Type", "application/json");
    let joined = http(coordinator.addr(), "POST", &heartbeat, &[json], join.clone().into_bytes()).await.expect("join");
    assert_eq!(joined.status, 200, "{}", String::from_utf8_lossy(&joined.body));

    let snapshot = || {
        let metadata = redis.cmd(&["HGETALL", &rsc::store::keys::metadata_key(&group)]);
        let liveness = redis.cmd(&["HGETALL", &rsc::store::keys::liveness_key(&group)]);
        let index = redis.cmd(&["SMEMBERS", rsc::store::keys::INDEX_KEY]);
        (metadata, liveness, index)
    };
    let before = snapshot();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let auth = ("Authorization", bearer.as_str());
    let huge = format!(r#"{{"memberId":"{}"}}"#, "x".repeat(2 * 1024 * 1024)).into_bytes();
    let shards = group_path(RouteId::AddShards, &group);
    let big_header = "x".repeat(rsc::http::router::HEAD_BYTES_MAX + 1);
    let names: Vec<String> = (0..=rsc::http::router::HEADERS_MAX).map(|i| format!("X-Extra-{i}")).collect();
    let many_headers: Vec<(&str, &str)> =
        std::iter::once(json).chain(names.iter().map(|name| (name.as_str(), "1"))).collect();
    let config = group_path(RouteId::ChangeConfig, &group);
    let cases: Vec<Case> = vec![
        ("POST", &heartbeat, vec![json], b"{not json".to_vec(), 400),
        ("POST", &heartbeat, vec![json], join.as_bytes()[..join.len() - 1].to_vec(), 400),
        ("POST", &heartbeat, vec![json], Vec::new(), 400),
        ("POST", &heartbeat, vec![json], join.replace("\"memberEpoch\":0", "\"memberEpoch\":\"0\"").into_bytes(), 400),
        ("POST", &heartbeat, vec![json], join.replace("\"memberId\"", "\"surprise\":1,\"memberId\"").into_bytes(), 400),
        ("POST", &heartbeat, vec![("Content-Type", "text/plain")], join.clone().into_bytes(), 415),
        // A content coding the coordinator does not decode: refused, not read as plain JSON.
        ("POST", &heartbeat, vec![json, ("Content-Encoding", "gzip")], join.clone().into_bytes(), 415),
        ("POST", &heartbeat, vec![json], huge.clone(), 413),
        ("POST", "/v1/admin/groups", vec![json, auth], b"{\"group\":".to_vec(), 400),
        ("POST", "/v1/admin/groups", vec![json, auth], huge.clone(), 413),
        ("POST", &shards, vec![json, auth], br#"{"expectedRevision":"2","newShardCount":4}"#.to_vec(), 400),
        ("PUT", &config, vec![json, auth], huge, 413),
        // Request heads over the router's limits: typed JSON 431, not hyper's empty one.
        ("POST", &heartbeat, vec![json, ("X-Padding", big_header.as_str())], join.clone().into_bytes(), 431),
        ("POST", &heartbeat, many_headers.clone(), join.clone().into_bytes(), 431),
        ("GET", "/no/such/route", many_headers, Vec::new(), 431),
    ];
    let count = cases.len();
    for (method, path, headers, body, expected) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).to_string();
        let answer = http(coordinator.addr(), method, path, &headers, body).await.expect("an answer");
        assert_eq!(answer.status, expected, "{method} {path} {shown}: {}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.header("content-type"), Some("application/json"), "{method} {path} {shown}");
        if expected == 415 {
            assert_eq!(answer.header("accept-encoding"), Some("identity"), "{method} {path} {shown}");
        }
        let error = answer.error();
        assert_eq!(error.code, ErrorCode::BadRequest, "{method} {path} {shown}");
        assert!(!error.message.is_empty() && error.message.len() < 1_024, "{method} {path}: {}", error.message);
    }
    assert_eq!(snapshot(), before, "no rejected request changed the metadata, the liveness counters or the index");
    let metrics = coordinator.metrics().await;
    let rejected: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("rsc_http_requests_total{")
                && ["\"400\"", "\"413\"", "\"415\"", "\"431\""].iter().any(|s| l.contains(s))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(rejected, count as f64, "every rejection is counted:\n{metrics}");
    // Still serving: a valid request goes through and writes (so the snapshot check can fail).
    assert_eq!(coordinator.get("/readyz").await.status, 200);
    let bravo = join.replace("alpha", "bravo").into_bytes();
    assert_eq!(http(coordinator.addr(), "POST", &heartbeat, &[json], bravo).await.expect("join").status, 200);
    assert_ne!(snapshot(), before);
}

/// Opens a connection and sends a request head announcing a body it never finishes.
async fn stall_a_body(addr: std::net::SocketAddr, path: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.expect("send a partial request");
    stream
}

/// Bad input in time rather than in bytes: clients that send a request head and then stall the
/// body. The global concurrency limit's permit is held while a body is read, so without a
/// deadline `concurrency_max` stalled bodies (1024 by default: one idle socket each) would stop
/// every heartbeat and `/healthz`; the body read is bounded by `header_read_timeout_ms` (1 s here,
/// answered 408).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_bodies_are_cut_off_and_do_not_starve_other_clients() {
    const SLOTS: usize = 4;
    let redis = RedisServer::start();
    let config = format!("concurrency_max = {SLOTS}\nheader_read_timeout_ms = 1000\n");
    let coordinator = CoordinatorProcess::start_with_config(&redis.url(), "e2e-stall", &config).await;
    let group = group("stall");
    coordinator.create_group(&group, 2, &fast_config()).await;
    let heartbeat = group_path(RouteId::Heartbeat, &group);
    // As many clients as the coordinator handles at once send a request head and one byte of a
    // body, then nothing (a slow or malicious client, or a half-dead network path).
    let mut stalled = Vec::new();
    for _ in 0..SLOTS {
        stalled.push(stall_a_body(coordinator.addr(), &heartbeat).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A well-behaved consumer must still get its heartbeat answered well within its lease, and
    // the probes must still answer (else Kubernetes restarts a healthy pod).
    let join = join_json(&group, "alpha").into_bytes();
    let asked = Instant::now();
    let json = ("Content-Type", "application/json");
    let answer =
        tokio::time::timeout(Duration::from_secs(5), http(coordinator.addr(), "POST", &heartbeat, &[json], join)).await;
    let waited = asked.elapsed();
    let healthz =
        tokio::time::timeout(Duration::from_secs(2), http(coordinator.addr(), "GET", "/healthz", &[], vec![])).await;
    // The stalled connections are answered or closed once a read deadline passes.
    let waits: Vec<_> = stalled
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut received = Vec::new();
                let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut received)).await;
                read.is_ok().then(|| parse_answer(&received).ok()).flatten()
            })
        })
        .collect();
    let mut cut_off = Vec::new();
    for wait in waits {
        cut_off.push(wait.await.expect("read task"));
    }
    let still_open = cut_off.iter().filter(|a| a.is_none()).count();
    let answer = answer.unwrap_or_else(|_| {
        panic!(
            "a heartbeat waited {waited:?} behind {SLOTS} stalled request bodies (concurrency_max = {SLOTS}, \
             header_read_timeout_ms = 1000); /healthz answered: {}; stalled connections not closed within 3 s \
             of the check: {still_open} of {SLOTS}",
            healthz.is_ok()
        )
    });
    assert_eq!(answer.expect("an answer").status, 200);
    assert!(waited < Duration::from_secs(3), "the heartbeat waited {waited:?}");
    assert!(healthz.is_ok(), "/healthz answers while bodies stall");
    assert_eq!(still_open, 0, "stalled request bodies are cut off");
    for answer in cut_off.into_iter().flatten() {
        assert_eq!(answer.status, 408, "{}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.error().code, ErrorCode::BadRequest);
    }
}

/// `Expect: 100-continue` with a declared body far over the limit: the coordinator answers 413
/// with the typed JSON error at once, without inviting the client to send 50 MiB (before, it
/// answered "100 Continue" and then 408 after the header read timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_announced_with_expect_100_continue_is_refused_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = RedisServer::start();
    let coordinator = CoordinatorProcess::start(&redis.url(), "e2e-expect").await;
    let group = group("expect");
    coordinator.create_group(&group, 2, &fast_config()).await;
    let path = group_path(RouteId::Heartbeat, &group);
    let mut stream = tokio::net::TcpStream::connect(coordinator.addr()).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 52428800\r\n\
         Expect: 100-continue\r\nConnection: close\r\n\r\n"
    );
    let asked = Instant::now();
    stream.write_all(head.as_bytes()).await.expect("write the head");
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut received)).await;
    assert!(read.is_ok(), "no answer within 3 s");
    let answer = parse_answer(&received).expect("an HTTP answer");
    assert_eq!(answer.status, 413, "{}", String::from_utf8_lossy(&received));
    assert!(!String::from_utf8_lossy(&received).contains("100 Continue"), "the body was not invited");
    assert_eq!(answer.error().code, ErrorCode::BadRequest);
    assert!(asked.elapsed() < Duration::from_secs(2), "answered at once: {:?}", asked.elapsed());
}
