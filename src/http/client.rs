//! [`HttpTransport`]: the clients' [`CoordinatorTransport`] over HTTP/1, on hyper client
//! connections that work on tokio and on madsim's simulated TCP (see [`super::serve`]).
//!
//! Endpoints (the router must match them):
//! - `POST /v1/groups/{streamPrefix}/{consumerGroup}/heartbeat`, body `HeartbeatRequest` JSON;
//! - `GET /v1/groups/{streamPrefix}/{consumerGroup}/routing`.
//!
//! Path segments are percent-encoded. Success is any 2xx with the response JSON; any other status
//! with an `ApiError` JSON body is [`TransportError::Api`].
//!
//! Failover: the coordinator addresses are tried in turn, starting with the last one that
//! answered. A connection failure, a timeout or any 503 (`COORDINATOR_TERMINATING`,
//! `STORE_UNAVAILABLE`) moves on to the next address; other answers are final. Both requests are
//! idempotent (seed: "Idempotent Retry"), so sending one again elsewhere is safe.
//!
//! Connection reuse: at most `idle_per_address_max` idle keep-alive connections per address. A
//! request on a reused connection that fails is retried once on a fresh connection (the pooled one
//! may have been closed by the server). A connection goes back to the pool only after its response
//! body was read completely.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use super::serve::FlushOnWrite;
use crate::client::transport::{CoordinatorTransport, TransportError};
use crate::core::model::GroupId;
use crate::core::protocol::{ApiError, HeartbeatRequest, HeartbeatResponse, RoutingResponse};

/// Largest response body accepted.
const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Settings of [`HttpTransport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpClientConfig {
    /// Coordinator base addresses (at least one).
    pub addrs: Vec<SocketAddr>,
    /// Per attempt (one address): connect, send, and read the whole response.
    pub request_timeout: Duration,
    /// Idle keep-alive connections kept per address (0 disables reuse).
    pub idle_per_address_max: usize,
}

impl HttpClientConfig {
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        Self { addrs, request_timeout: Duration::from_secs(2), idle_per_address_max: 2 }
    }
}

/// The coordinator transport over HTTP/1.
#[derive(Debug)]
pub struct HttpTransport {
    config: HttpClientConfig,
    /// Index into `addrs` of the last address that answered.
    preferred: AtomicUsize,
    idle: Mutex<BTreeMap<SocketAddr, Vec<SendRequest<Full<Bytes>>>>>,
}

/// How one attempt on one address ended.
enum Attempt {
    /// Final: a 2xx body, or a non-503 error answer.
    Done(Result<Bytes, TransportError>),
    /// Try the next address with this error (kept if it is the last).
    Next(TransportError),
}

impl HttpTransport {
    pub fn new(config: HttpClientConfig) -> Self {
        Self { config, preferred: AtomicUsize::new(0), idle: Mutex::new(BTreeMap::new()) }
    }

    /// A transport with default settings for `addrs`.
    pub fn with_addrs(addrs: Vec<SocketAddr>) -> Self {
        Self::new(HttpClientConfig::new(addrs))
    }

    async fn call<R: DeserializeOwned>(&self, method: Method, path: String, body: Bytes) -> Result<R, TransportError> {
        let count = self.config.addrs.len();
        if count == 0 {
            return Err(TransportError::Unreachable("no coordinator address configured".into()));
        }
        let first = self.preferred.load(Ordering::Relaxed) % count;
        let mut last = TransportError::Unreachable("no attempt made".into());
        for offset in 0..count {
            let index = (first + offset) % count;
            let addr = self.config.addrs[index];
            let request = || build_request(&method, &path, addr, body.clone());
            let give_up = tokio::time::Instant::now() + self.config.request_timeout;
            let attempt = tokio::select! {
                biased;
                attempt = self.attempt(addr, request) => attempt,
                _ = tokio::time::sleep_until(give_up) => Attempt::Next(TransportError::Timeout),
            };
            match attempt {
                Attempt::Done(result) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return result.and_then(|bytes| {
                        serde_json::from_slice(&bytes)
                            .map_err(|e| TransportError::Unreachable(format!("bad response body from {addr}: {e}")))
                    });
                }
                Attempt::Next(error) => last = error,
            }
        }
        Err(last)
    }

    /// One address: a pooled connection first (retried once on a fresh one if it fails), else a
    /// fresh connection.
    async fn attempt(&self, addr: SocketAddr, request: impl Fn() -> Result<Request<Full<Bytes>>, String>) -> Attempt {
        if let Some(sender) = self.take_idle(addr) {
            let Ok(req) = request() else { return Attempt::Done(Err(bad_request())) };
            if let Ok(attempt) = self.exchange(addr, sender, req).await {
                return attempt;
            }
        }
        let sender = match connect(addr).await {
            Ok(sender) => sender,
            Err(error) => return Attempt::Next(TransportError::Unreachable(format!("{addr}: {error}"))),
        };
        let Ok(req) = request() else { return Attempt::Done(Err(bad_request())) };
        match self.exchange(addr, sender, req).await {
            Ok(attempt) => attempt,
            Err(error) => Attempt::Next(TransportError::Unreachable(format!("{addr}: {error}"))),
        }
    }

    /// Sends one request and reads the whole response. `Err`: the connection failed.
    async fn exchange(
        &self,
        addr: SocketAddr,
        mut sender: SendRequest<Full<Bytes>>,
        req: Request<Full<Bytes>>,
    ) -> Result<Attempt, String> {
        sender.ready().await.map_err(|e| e.to_string())?;
        let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), BODY_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| format!("reading body: {e}"))?
            .to_bytes();
        self.put_idle(addr, sender);
        Ok(classify(addr, status, body))
    }

    fn take_idle(&self, addr: SocketAddr) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let pool = idle.get_mut(&addr)?;
        while let Some(sender) = pool.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn put_idle(&self, addr: SocketAddr, sender: SendRequest<Full<Bytes>>) {
        if self.config.idle_per_address_max == 0 || sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let pool = idle.entry(addr).or_default();
        if pool.len() < self.config.idle_per_address_max {
            pool.push(sender);
        }
    }
}

impl CoordinatorTransport for HttpTransport {
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        let body = serde_json::to_vec(&req).map_err(|e| TransportError::Unreachable(format!("encoding: {e}")))?;
        self.call(Method::POST, group_path(&req.group, "heartbeat"), Bytes::from(body)).await
    }

    async fn routing(&self, group: &GroupId) -> Result<RoutingResponse, TransportError> {
        self.call(Method::GET, group_path(group, "routing"), Bytes::new()).await
    }
}

/// Opens a connection and spawns its driver task (it ends when the `SendRequest` is dropped or
/// the peer closes).
async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let (sender, connection) =
        http1::handshake(TokioIo::new(FlushOnWrite::new(stream))).await.map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "client connection ended with an error");
        }
    });
    Ok(sender)
}

fn classify(addr: SocketAddr, status: StatusCode, body: Bytes) -> Attempt {
    if status.is_success() {
        return Attempt::Done(Ok(body));
    }
    let error = match serde_json::from_slice::<ApiError>(&body) {
        Ok(api) => TransportError::Api(api),
        Err(_) => TransportError::Unreachable(format!("{addr} answered HTTP {status} without an error body")),
    };
    if status == StatusCode::SERVICE_UNAVAILABLE || (status.is_server_error() && error.code().is_none()) {
        Attempt::Next(error)
    } else {
        Attempt::Done(Err(error))
    }
}

fn build_request(method: &Method, path: &str, addr: SocketAddr, body: Bytes) -> Result<Request<Full<Bytes>>, String> {
    Request::builder()
        .method(method.clone())
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())
}

fn bad_request() -> TransportError {
    TransportError::Unreachable("could not build the request (invalid group name in path?)".into())
}

/// `/v1/groups/{streamPrefix}/{consumerGroup}/{action}` with percent-encoded segments.
pub fn group_path(group: &GroupId, action: &str) -> String {
    format!("/v1/groups/{}/{}/{action}", encode_segment(&group.stream_prefix), encode_segment(&group.consumer_group))
}

/// Percent-encodes a path segment: everything but RFC 3986 unreserved characters and ':'.
fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(all(test, not(madsim)))]
mod tests {
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
    use crate::core::protocol::{ErrorCode, HeartbeatStatus};
    use crate::http::serve::{serve, serve_with, ServeConfig};

    /// How the test coordinator answers.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Mode {
        Ok,
        Terminating,
        UnknownMember,
        Slow,
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
                tokio::time::sleep(Duration::from_millis(500)).await;
                None
            }
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
            status: HeartbeatStatus::Ok,
            member_id: req.member_id,
            member_epoch: req.member_epoch + 1,
            metadata_version: 4,
            assignment_epoch: 2,
            shard_count: 3,
            assigned: vec![1],
            pending: vec![],
            revoke: vec![],
            assignment_lease_ms: 8_000,
            heartbeat_interval_ms: 1_000,
            store_revision: 9,
        })
        .into_response()
    }

    async fn routing(State(state): State<Arc<TestState>>, Path((prefix, group)): Path<(String, String)>) -> Response {
        if let Some(response) = answer(&state).await {
            return response;
        }
        let group = GroupId::new(prefix, group);
        Json(RoutingResponse {
            stream_keys: vec![group.stream_key(0), group.stream_key(1)],
            group,
            metadata_version: 4,
            shard_count: 2,
            routing_cache_ttl_ms: 10_000,
            routing_refresh_interval_ms: 3_000,
            store_revision: 9,
        })
        .into_response()
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
            let router = Router::new()
                .route("/v1/groups/{prefix}/{group}/heartbeat", post(heartbeat))
                .route("/v1/groups/{prefix}/{group}/routing", get(routing))
                .with_state(Arc::clone(&state));
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
            group: group.clone(),
            member_id: "m1".into(),
            member_epoch: 3,
            metadata_version: 4,
            assignment_epoch: 2,
            owned: vec![1],
            revoking: vec![],
            leave: false,
        }
    }

    fn transport(addrs: Vec<SocketAddr>, timeout_ms: u64) -> HttpTransport {
        HttpTransport::new(HttpClientConfig {
            addrs,
            request_timeout: Duration::from_millis(timeout_ms),
            idle_per_address_max: 2,
        })
    }

    /// An address nobody listens on (a listener bound, then closed).
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
        let routing = t.routing(&group).await.expect("routing answered");
        assert_eq!(routing.group, group);
        assert_eq!(routing.stream_keys, vec![group.stream_key(0), group.stream_key(1)]);
        // Keep-alive: many sequential requests on the pooled connection stay correct.
        for _ in 0..20 {
            assert_eq!(t.routing(&group).await.expect("routing").shard_count, 2);
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

    #[tokio::test]
    async fn fails_over_past_dead_and_terminating_coordinators_and_sticks_to_the_one_that_answered() {
        let dead = dead_addr().await;
        let terminating = TestServer::start(Mode::Terminating).await;
        let ok = TestServer::start(Mode::Ok).await;
        let t = transport(vec![dead, terminating.addr, ok.addr], 2_000);
        let group = GroupId::new("p", "g");
        t.heartbeat(request(&group)).await.expect("third address answers");
        assert_eq!((terminating.requests(), ok.requests()), (1, 1));
        t.routing(&group).await.expect("answered");
        assert_eq!((terminating.requests(), ok.requests()), (1, 2), "starts with the last address that answered");
        terminating.stop().await;
        ok.stop().await;
    }

    #[tokio::test]
    async fn every_coordinator_terminating_returns_the_api_error() {
        let a = TestServer::start(Mode::Terminating).await;
        let b = TestServer::start(Mode::Terminating).await;
        let t = transport(vec![a.addr, b.addr], 2_000);
        let error = t.routing(&GroupId::new("p", "g")).await.expect_err("503 everywhere");
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
        assert_eq!(t.routing(&GroupId::new("p", "g")).await, Err(TransportError::Timeout));
        assert!(started.elapsed() < Duration::from_millis(450));
        slow.stop().await;
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable() {
        let t = transport(vec![dead_addr().await], 1_000);
        assert!(matches!(t.routing(&GroupId::new("p", "g")).await, Err(TransportError::Unreachable(_))));
    }

    #[tokio::test]
    async fn a_pooled_connection_closed_by_a_restart_is_replaced() {
        let first = TestServer::start(Mode::Ok).await;
        let addr = first.addr;
        let t = transport(vec![addr], 2_000);
        let group = GroupId::new("p", "g");
        t.routing(&group).await.expect("answered");
        first.stop().await;
        // Stopped: no longer accepting.
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "shutdown stops accepting");
        let second = TestServer::start_on(addr, Mode::Ok).await;
        t.routing(&group).await.expect("answered after restart");
        assert_eq!(second.requests(), 1);
        second.stop().await;
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
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "closed by the server");
        assert!(started.elapsed() >= Duration::from_millis(90));
        let _ = stop.send(());
        server.await.expect("serve returns");
    }
}
