//! Tests of [`super`]: serving a tiny router and calling it, over real loopback TCP (tokio) and
//! over madsim's simulated network (`--cfg madsim`, in the `sim` module).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode as AxumStatus;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::*;
use crate::core::protocol::{ErrorCode, HeartbeatStatus, RoutingReport};
use crate::http::serve::{serve, serve_with, ServeConfig};

/// How the test coordinator answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Ok,
    Terminating,
    UnknownMember,
    Slow,
    /// Reads the request and never answers (a coordinator stuck mid-request).
    Hang,
}

struct TestState {
    mode: Mode,
    requests: AtomicUsize,
}

fn error(status: AxumStatus, code: ErrorCode) -> Response {
    (status, Json(ApiError::new(code, "test"))).into_response()
}

async fn answer(state: &TestState) -> Option<Response> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    match state.mode {
        Mode::Ok => None,
        Mode::Terminating => Some(error(AxumStatus::SERVICE_UNAVAILABLE, ErrorCode::CoordinatorTerminating)),
        Mode::UnknownMember => Some(error(AxumStatus::CONFLICT, ErrorCode::UnknownMember)),
        Mode::Slow => {
            crate::time::sleep(Duration::from_millis(500)).await;
            None
        }
        Mode::Hang => std::future::pending().await,
    }
}

async fn heartbeat(
    State(state): State<Arc<TestState>>,
    Path((prefix, group)): Path<(String, String)>,
    Json(req): Json<HeartbeatRequest>,
) -> Response {
    if let Some(response) = answer(&state).await {
        return response;
    }
    assert_eq!(GroupId::new(prefix, group), req.group, "path segments round-trip");
    Json(HeartbeatResponse {
        metadata_version_proof: None,
        status: HeartbeatStatus::Ok,
        member_id: req.member_id,
        member_epoch: req.member_epoch + 1,
        metadata_version: 4,
        assignment_epoch: 2,
        shard_count: 3,
        assigned: vec![1],
        pending: vec![],
        revoke: vec![],
        drains: vec![],
        assignment_lease_ms: 8_000,
        heartbeat_interval_ms: 1_000,
        store_revision: 9,
        fences: Vec::new(),
    })
    .into_response()
}

async fn routing(State(state): State<Arc<TestState>>, Path((prefix, group)): Path<(String, String)>) -> Response {
    if let Some(response) = answer(&state).await {
        return response;
    }
    let group = GroupId::new(prefix, group);
    Json(RoutingResponse {
        metadata_version_proof: None,
        shard_count_proof: None,
        stream_keys: vec![group.stream_key(0), group.stream_key(1)],
        group,
        metadata_version: 4,
        shard_count: 2,
        routing_cache_ttl_ms: 10_000,
        routing_refresh_interval_ms: 3_000,
        store_revision: 9,
        lost_version: None,
        accepts_known_shard_count: true,
    })
    .into_response()
}

fn test_router(state: Arc<TestState>) -> Router {
    Router::new()
        .route("/v1/groups/{prefix}/{group}/heartbeat", post(heartbeat))
        .route("/v1/groups/{prefix}/{group}/routing", get(routing))
        .with_state(state)
}

struct TestServer {
    addr: SocketAddr,
    state: Arc<TestState>,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

impl TestServer {
    async fn start(mode: Mode) -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("addr"), mode).await
    }

    async fn start_on(addr: SocketAddr, mode: Mode) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(TestState { mode, requests: AtomicUsize::new(0) });
        let router = test_router(Arc::clone(&state));
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(serve(listener, router, async move {
            let _ = stopped.await;
        }));
        Self { addr, state, stop: Some(stop), done }
    }

    fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.done).await.expect("serve returns after shutdown");
    }
}

fn request(group: &GroupId) -> HeartbeatRequest {
    HeartbeatRequest {
        metadata_version_proof: None,
        group: group.clone(),
        member_id: "m1".into(),
        member_epoch: 3,
        metadata_version: 4,
        assignment_epoch: 2,
        owned: vec![1],
        revoking: vec![],
        leave: false,
        member_session: None,
        fenced: Vec::new(),
    }
}

fn transport(addrs: Vec<SocketAddr>, timeout_ms: u64) -> HttpTransport {
    HttpTransport::new(HttpClientConfig {
        addrs,
        request_timeout: Duration::from_millis(timeout_ms),
        idle_per_address_max: 2,
        client_token: None,
    })
}

/// An address nobody listens on (a listener bound, then closed).
#[cfg(not(madsim))]
async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("addr")
}

#[test]
fn paths_are_percent_encoded() {
    let group = GroupId::new("orders:v1/x%y", "bill?ing#");
    assert_eq!(group_path(&group, "routing"), "/v1/groups/orders:v1%2Fx%25y/bill%3Fing%23/routing");
}

#[tokio::test]
async fn heartbeat_and_routing_round_trip_with_awkward_group_names() {
    let server = TestServer::start(Mode::Ok).await;
    let t = transport(vec![server.addr], 2_000);
    let group = GroupId::new("orders:v1/x%y", "bill?ing#");
    let response = t.heartbeat(request(&group)).await.expect("heartbeat answered");
    assert_eq!((response.member_id.as_str(), response.member_epoch, response.assigned), ("m1", 4, vec![1]));
    let routing = t.routing(&group, RoutingReport::NONE).await.expect("routing answered");
    assert_eq!(routing.group, group);
    assert_eq!(routing.stream_keys, vec![group.stream_key(0), group.stream_key(1)]);
    // Keep-alive: many sequential requests on the pooled connection stay correct.
    for _ in 0..20 {
        assert_eq!(t.routing(&group, RoutingReport::NONE).await.expect("routing").shard_count, 2);
    }
    assert_eq!(server.requests(), 22);
    server.stop().await;
}

#[tokio::test]
async fn an_error_body_is_a_typed_api_error_and_is_final() {
    let unknown = TestServer::start(Mode::UnknownMember).await;
    let ok = TestServer::start(Mode::Ok).await;
    let t = transport(vec![unknown.addr, ok.addr], 2_000);
    let error = t.heartbeat(request(&GroupId::new("p", "g"))).await.expect_err("409");
    assert_eq!(error.code(), Some(ErrorCode::UnknownMember));
    assert_eq!(ok.requests(), 0, "a protocol error is not retried elsewhere");
    unknown.stop().await;
    ok.stop().await;
}

// Real sockets only: madsim reuses a freed port at once (even for the client's own
// ephemeral port), so "a closed address" is not stable on one simulated node.
#[cfg(not(madsim))]
#[tokio::test]
async fn fails_over_past_dead_and_terminating_coordinators_and_sticks_to_the_one_that_answered() {
    let dead = dead_addr().await;
    let terminating = TestServer::start(Mode::Terminating).await;
    let ok = TestServer::start(Mode::Ok).await;
    let t = transport(vec![dead, terminating.addr, ok.addr], 2_000);
    let group = GroupId::new("p", "g");
    t.heartbeat(request(&group)).await.expect("third address answers");
    assert_eq!((terminating.requests(), ok.requests()), (1, 1));
    t.routing(&group, RoutingReport::NONE).await.expect("answered");
    assert_eq!((terminating.requests(), ok.requests()), (1, 2), "starts with the last address that answered");
    terminating.stop().await;
    ok.stop().await;
}

#[tokio::test]
async fn every_coordinator_terminating_returns_the_api_error() {
    let a = TestServer::start(Mode::Terminating).await;
    let b = TestServer::start(Mode::Terminating).await;
    let t = transport(vec![a.addr, b.addr], 2_000);
    let error = t.routing(&GroupId::new("p", "g"), RoutingReport::NONE).await.expect_err("503 everywhere");
    assert_eq!(error.code(), Some(ErrorCode::CoordinatorTerminating));
    assert_eq!((a.requests(), b.requests()), (1, 1));
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_slow_coordinator_times_out() {
    let slow = TestServer::start(Mode::Slow).await;
    let t = transport(vec![slow.addr], 100);
    let started = tokio::time::Instant::now();
    assert_eq!(t.routing(&GroupId::new("p", "g"), RoutingReport::NONE).await, Err(TransportError::Timeout));
    assert!(started.elapsed() < Duration::from_millis(450));
    slow.stop().await;
}

#[cfg(not(madsim))]
#[tokio::test]
async fn nothing_listening_is_unreachable() {
    let t = transport(vec![dead_addr().await], 1_000);
    assert!(matches!(
        t.routing(&GroupId::new("p", "g"), RoutingReport::NONE).await,
        Err(TransportError::Unreachable(_))
    ));
}

// Real sockets only: madsim reuses a freed port at once (even for the client's own
// ephemeral port), so "a closed address" is not stable on one simulated node.
#[cfg(not(madsim))]
#[tokio::test]
async fn a_pooled_connection_closed_by_a_restart_is_replaced() {
    let first = TestServer::start(Mode::Ok).await;
    let addr = first.addr;
    let t = transport(vec![addr], 2_000);
    let group = GroupId::new("p", "g");
    t.routing(&group, RoutingReport::NONE).await.expect("answered");
    first.stop().await;
    // Stopped: no longer accepting.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "shutdown stops accepting");
    let second = TestServer::start_on(addr, Mode::Ok).await;
    t.routing(&group, RoutingReport::NONE).await.expect("answered after restart");
    assert_eq!(second.requests(), 1);
    second.stop().await;
}

/// An address whose kernel completes the connection but whose process never reads the request
/// (stopped, or stuck): a listener bound and never accepted, open while the listener returned lives.
async fn hung_addr() -> (SocketAddr, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    (listener.local_addr().expect("addr"), listener)
}

/// Whether a heartbeat was answered under the deadline the consumer gives one
/// (`heartbeat_timeout_ms`, 2 s by default, counted from before the call). The call is dropped
/// when the deadline passes first, as the consumer drops it.
async fn answered_within(t: &HttpTransport, deadline: Duration) -> bool {
    matches!(crate::time::timeout(deadline, t.heartbeat(request(&GroupId::new("p", "g")))).await, Ok(Ok(_)))
}

/// The consumer's and the producer's default deadline for one call.
const CALLER_DEADLINE: Duration = Duration::from_millis(2_000);

// With the library defaults an attempt's timeout (2 s) is never earlier than the caller's
// deadline (2 s): the address that hung used to keep every call's whole budget, and failover never
// reached the next one. Now the cancelled call moves past it.
#[tokio::test]
async fn a_hung_coordinator_costs_one_failed_call_with_the_default_timeouts() {
    let (hung, _hung) = hung_addr().await;
    let ok = TestServer::start(Mode::Ok).await;
    let t = HttpTransport::with_addrs(vec![hung, ok.addr]);
    assert!(!answered_within(&t, CALLER_DEADLINE).await, "the first call waits on the hung one");
    assert_eq!(ok.requests(), 0);
    let started = tokio::time::Instant::now();
    assert!(answered_within(&t, CALLER_DEADLINE).await, "the next call starts with the next address");
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    assert!(answered_within(&t, CALLER_DEADLINE).await, "and stays there");
    assert_eq!(ok.requests(), 2);
    ok.stop().await;
}

// A full listen backlog (or a node that drops packets) never completes the connection: while
// another address remains, connecting gets half the attempt, and the call itself answers.
#[cfg(not(madsim))]
#[tokio::test]
async fn an_address_that_never_connects_costs_no_failed_call_with_the_default_timeouts() {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let full = socket.listen(0).expect("listen");
    let full_addr = full.local_addr().expect("addr");
    // Fill the accept queue until the kernel drops further connection attempts.
    let mut queued = Vec::new();
    loop {
        assert!(queued.len() < 16, "the kernel kept completing connections to a full backlog");
        match crate::time::timeout(Duration::from_millis(300), tokio::net::TcpStream::connect(full_addr)).await {
            Ok(stream) => queued.push(stream.expect("connect while the queue has room")),
            Err(_) => break,
        }
    }
    let ok = TestServer::start(Mode::Ok).await;
    let t = HttpTransport::with_addrs(vec![full_addr, ok.addr]);
    let started = tokio::time::Instant::now();
    assert!(answered_within(&t, CALLER_DEADLINE).await, "the second address answers within the deadline");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(990) && elapsed < Duration::from_millis(1_500), "{elapsed:?}");
    assert_eq!(ok.requests(), 1);
    // The next call starts past the address that timed out.
    let started = tokio::time::Instant::now();
    assert!(answered_within(&t, CALLER_DEADLINE).await, "answered");
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    ok.stop().await;
}

// `request_timeout: Duration::MAX` ("no limit") overflowed the clock and panicked the caller (the
// consumer's heartbeat task): it is a century now.
#[tokio::test]
async fn an_attempt_without_a_limit_is_answered_rather_than_panicking() {
    let ok = TestServer::start(Mode::Ok).await;
    let t = HttpTransport::new(HttpClientConfig {
        addrs: vec![ok.addr],
        request_timeout: Duration::MAX,
        idle_per_address_max: 2,
        client_token: None,
    });
    assert!(answered_within(&t, CALLER_DEADLINE).await);
    ok.stop().await;
}

// Moving past an address needs a timeout or a cancellation: an answer that is slow but in time
// keeps its address preferred (no flapping on every slow answer).
#[tokio::test]
async fn a_slow_answer_in_time_keeps_its_address() {
    let slow = TestServer::start(Mode::Slow).await;
    let ok = TestServer::start(Mode::Ok).await;
    let t = HttpTransport::with_addrs(vec![slow.addr, ok.addr]);
    for _ in 0..2 {
        assert!(answered_within(&t, CALLER_DEADLINE).await, "answered in 500 ms");
    }
    assert_eq!((slow.requests(), ok.requests()), (2, 0));
    slow.stop().await;
    ok.stop().await;
}

// Three addresses, two hung (attempts of 200 ms, callers' deadlines of 300 ms). The first call
// moves past the first address, whose attempt timed out; the second had only the 100 ms left and
// keeps its place. The next call gives it a whole attempt, moves past it and reaches the third.
#[tokio::test]
async fn moves_past_the_first_address_that_timed_out() {
    let first = TestServer::start(Mode::Hang).await;
    let second = TestServer::start(Mode::Hang).await;
    let ok = TestServer::start(Mode::Ok).await;
    let t = transport(vec![first.addr, second.addr, ok.addr], 200);
    let requests = || (first.requests(), second.requests(), ok.requests());
    let deadline = Duration::from_millis(300);
    assert!(!answered_within(&t, deadline).await, "cancelled while on the second");
    assert_eq!(requests(), (1, 1, 0));
    assert!(answered_within(&t, deadline).await, "the second times out, the third answers");
    assert_eq!(requests(), (1, 2, 1));
    assert!(answered_within(&t, deadline).await, "starts with the third");
    assert_eq!(requests(), (1, 2, 2));
    ok.stop().await;
}

// A refused address costs no time, so the hung one after it had the caller's whole budget: the
// call cancelled there moves past it.
#[cfg(not(madsim))]
#[tokio::test]
async fn a_call_cancelled_on_a_hung_address_moves_past_it() {
    let dead = dead_addr().await;
    let hung = TestServer::start(Mode::Hang).await;
    let ok = TestServer::start(Mode::Ok).await;
    let t = transport(vec![dead, hung.addr, ok.addr], 2_000);
    let deadline = Duration::from_millis(300);
    assert!(!answered_within(&t, deadline).await, "cancelled on the hung one");
    assert_eq!((hung.requests(), ok.requests()), (1, 0));
    assert!(answered_within(&t, deadline).await, "starts with the third");
    assert_eq!((hung.requests(), ok.requests()), (1, 1));
    ok.stop().await;
}

#[tokio::test]
async fn header_read_timeout_closes_a_stalled_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = ServeConfig { header_read_timeout: Duration::from_millis(100), ..ServeConfig::default() };
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(serve_with(listener, Router::new(), config, async move {
        let _ = stopped.await;
    }));
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.expect("half a request head");
    let started = tokio::time::Instant::now();
    let mut buf = Vec::new();
    let read = crate::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "closed by the server");
    assert!(started.elapsed() >= Duration::from_millis(90));
    let _ = stop.send(());
    server.await.expect("serve returns");
}

/// The same code over madsim's simulated network: coordinators on their own nodes, killed and
/// clogged by the simulator.
/// The largest answers a coordinator can give fit the body this client accepts: a routing view of
/// `SHARD_COUNT_MAX` shards under the longest prefix lists every stream key, and a heartbeat of a
/// member asked to drain every shard names each with its drain and its fence at the largest
/// numbers, with room to spare. At a 4 MiB limit a group of ~20,000 shards under a 200-byte prefix
/// (which create-group and add-shards accept) had a routing answer no producer could read, and
/// every producer stopped once its cache expired.
#[test]
fn the_largest_answers_a_coordinator_can_give_fit_the_body_limit() {
    use crate::core::fence::{Fence, ShardFence};
    use crate::core::model::{GROUP_NAME_LEN_MAX, MEMBER_ID_LEN_MAX, REVOKE_ID_MAX, SHARD_COUNT_MAX};
    use crate::core::protocol::{Drain, HeartbeatStatus};
    let long = "p".repeat(GROUP_NAME_LEN_MAX);
    let group = GroupId::new(&long, "g".repeat(GROUP_NAME_LEN_MAX));
    let shards: Vec<u32> = (0..SHARD_COUNT_MAX).collect();
    let proof: crate::core::proof::ViewProof = "f".repeat(32).parse().expect("a proof");
    let routing = RoutingResponse {
        group: group.clone(),
        metadata_version: u64::MAX,
        shard_count: SHARD_COUNT_MAX,
        stream_keys: shards.iter().map(|&s| group.stream_key(s)).collect(),
        routing_cache_ttl_ms: u64::MAX,
        routing_refresh_interval_ms: u64::MAX,
        store_revision: u64::MAX,
        lost_version: Some(u64::MAX),
        accepts_known_shard_count: true,
        metadata_version_proof: Some(proof),
        shard_count_proof: Some(proof),
    };
    let routing_bytes = serde_json::to_vec(&routing).expect("serializes").len();
    let fence = Fence { counter: u64::MAX, nonce: u64::MAX };
    let heartbeat = HeartbeatResponse {
        status: HeartbeatStatus::RevokePending,
        member_id: "m".repeat(MEMBER_ID_LEN_MAX),
        member_epoch: u64::MAX,
        metadata_version: u64::MAX,
        assignment_epoch: u64::MAX,
        shard_count: SHARD_COUNT_MAX,
        assigned: Vec::new(),
        pending: Vec::new(),
        revoke: shards.clone(),
        drains: shards.iter().map(|&shard| Drain { shard, revoke_id: REVOKE_ID_MAX }).collect(),
        assignment_lease_ms: u64::MAX,
        heartbeat_interval_ms: u64::MAX,
        store_revision: u64::MAX,
        fences: shards.iter().map(|&shard| ShardFence { shard, fence }).collect(),
        metadata_version_proof: Some(proof),
    };
    let heartbeat_bytes = serde_json::to_vec(&heartbeat).expect("serializes").len();
    eprintln!("routing {routing_bytes} bytes, heartbeat {heartbeat_bytes} bytes, limit {BODY_BYTES_MAX}");
    assert!(routing_bytes < BODY_BYTES_MAX / 2, "routing answer of {routing_bytes} bytes");
    assert!(heartbeat_bytes < BODY_BYTES_MAX / 2, "heartbeat answer of {heartbeat_bytes} bytes");
}

#[cfg(madsim)]
mod sim {
    use super::*;
    use madsim::runtime::{Handle, NodeHandle};

    fn addr(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().expect("ip"), 8080)
    }

    /// A node serving the test router on `ip:8080` forever.
    fn coordinator_node(name: &str, ip: &str, mode: Mode) -> (NodeHandle, Arc<TestState>) {
        let state = Arc::new(TestState { mode, requests: AtomicUsize::new(0) });
        let node = Handle::current().create_node().name(name).ip(ip.parse().expect("ip")).build();
        let served = Arc::clone(&state);
        let bind = addr(ip);
        node.spawn(async move {
            let listener = TcpListener::bind(bind).await.expect("bind");
            serve(listener, test_router(served), std::future::pending()).await;
        });
        (node, state)
    }

    fn client_node() -> NodeHandle {
        Handle::current().create_node().name("client").ip("10.0.0.9".parse().expect("ip")).build()
    }

    #[madsim::test]
    async fn keep_alive_requests_cost_linear_simulated_time() {
        let (_node, state) = coordinator_node("a", "10.0.0.1", Mode::Ok);
        let (first, second) = client_node()
            .spawn(async move {
                crate::time::sleep(Duration::from_millis(10)).await;
                let t = HttpTransport::with_addrs(vec![addr("10.0.0.1")]);
                let group = GroupId::new("p", "g");
                let mut batches = Vec::new();
                for _ in 0..2 {
                    let started = tokio::time::Instant::now();
                    for _ in 0..300 {
                        t.routing(&group, RoutingReport::NONE).await.expect("routing");
                    }
                    batches.push(started.elapsed());
                }
                (batches[0], batches[1])
            })
            .await
            .expect("client task");
        assert_eq!(state.requests.load(Ordering::SeqCst), 600);
        // Quadratic behaviour would make the second batch much slower than the first.
        assert!(second <= first * 3 / 2, "first 300: {first:?}, next 300: {second:?}");
    }

    #[madsim::test]
    async fn a_killed_coordinator_fails_over_at_once() {
        let (a, state_a) = coordinator_node("a", "10.0.0.1", Mode::Ok);
        let (_b, state_b) = coordinator_node("b", "10.0.0.2", Mode::Ok);
        let a_id = a.id();
        let elapsed = client_node()
            .spawn(async move {
                crate::time::sleep(Duration::from_millis(10)).await;
                let t = HttpTransport::new(HttpClientConfig {
                    request_timeout: Duration::from_millis(500),
                    ..HttpClientConfig::new(vec![addr("10.0.0.1"), addr("10.0.0.2")])
                });
                let group = GroupId::new("p", "g");
                t.routing(&group, RoutingReport::NONE).await.expect("a answers");
                Handle::current().kill(a_id);
                let started = tokio::time::Instant::now();
                t.heartbeat(request(&group)).await.expect("b answers");
                started.elapsed()
            })
            .await
            .expect("client task");
        assert_eq!((state_a.requests.load(Ordering::SeqCst), state_b.requests.load(Ordering::SeqCst)), (1, 1));
        assert!(elapsed < Duration::from_millis(500), "no timeout needed after a kill: {elapsed:?}");
    }

    /// A node whose listener is bound but never accepts: connections complete, requests are
    /// never read (a stopped process).
    fn hung_node(name: &str, ip: &str) -> NodeHandle {
        let node = Handle::current().create_node().name(name).ip(ip.parse().expect("ip")).build();
        let bind = addr(ip);
        node.spawn(async move {
            let _listener = TcpListener::bind(bind).await.expect("bind");
            std::future::pending::<()>().await;
        });
        node
    }

    // The twin of the loopback test of the same name across simulated nodes: the default
    // timeouts, the consumer's deadline around each call.
    #[madsim::test]
    async fn a_hung_coordinator_costs_one_failed_call_with_the_default_timeouts() {
        let _a = hung_node("a", "10.0.0.1");
        let (_b, state_b) = coordinator_node("b", "10.0.0.2", Mode::Ok);
        let (first, second) = client_node()
            .spawn(async move {
                crate::time::sleep(Duration::from_millis(10)).await;
                let t = HttpTransport::with_addrs(vec![addr("10.0.0.1"), addr("10.0.0.2")]);
                let first = answered_within(&t, CALLER_DEADLINE).await;
                let started = tokio::time::Instant::now();
                assert!(answered_within(&t, CALLER_DEADLINE).await, "b answers");
                (first, started.elapsed())
            })
            .await
            .expect("client task");
        assert!(!first, "the first call waits on the hung one");
        assert_eq!(state_b.requests.load(Ordering::SeqCst), 1);
        assert!(second < Duration::from_millis(500), "{second:?}");
    }

    #[madsim::test]
    async fn a_clogged_coordinator_times_out_and_the_next_one_answers() {
        let (a, state_a) = coordinator_node("a", "10.0.0.1", Mode::Ok);
        let (_b, state_b) = coordinator_node("b", "10.0.0.2", Mode::Ok);
        let a_id = a.id();
        let elapsed = client_node()
            .spawn(async move {
                crate::time::sleep(Duration::from_millis(10)).await;
                let t = HttpTransport::new(HttpClientConfig {
                    request_timeout: Duration::from_millis(300),
                    ..HttpClientConfig::new(vec![addr("10.0.0.1"), addr("10.0.0.2")])
                });
                let group = GroupId::new("p", "g");
                t.routing(&group, RoutingReport::NONE).await.expect("a answers");
                madsim::net::NetSim::current().clog_node(a_id);
                let started = tokio::time::Instant::now();
                t.routing(&group, RoutingReport::NONE).await.expect("b answers");
                started.elapsed()
            })
            .await
            .expect("client task");
        assert_eq!(state_b.requests.load(Ordering::SeqCst), 1);
        assert!(state_a.requests.load(Ordering::SeqCst) >= 1);
        assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(600), "{elapsed:?}");
    }
}
