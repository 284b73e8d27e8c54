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
//! Failover: the coordinator addresses are tried in turn, starting with the preferred one. A
//! connection failure, a timeout or any 503 (`COORDINATOR_TERMINATING`, `STORE_UNAVAILABLE`) moves
//! on to the next address; other answers are final. Both requests are idempotent (seed:
//! "Idempotent Retry"), so sending one again elsewhere is safe.
//!
//! The preferred address is the last one that answered, or the one after the address a call timed
//! out on or was dropped on (`Failover`). The callers bound a whole call by a deadline no longer
//! than one attempt (`heartbeat_timeout_ms`, `refresh_timeout_ms` and `request_timeout` are all
//! 2 s by default), so otherwise an address that hangs (a stopped process, a node that drops
//! packets, a full listen backlog) would take every call's whole budget and the next address would
//! never be tried. A hung address costs one failed call, and none when it never completes the
//! connection: while another address remains, connecting may take only half of `request_timeout`.
//! An answer that is slow but in time moves nothing, and no request goes to two addresses at once.
//!
//! TLS (`https://`, not in the simulation): [`HttpTransport::with_tls`] makes every connection a
//! TLS connection verified against [`ClientTls`]'s CA file (optionally presenting a client
//! certificate for mutual TLS); a transport with TLS never falls back to plain HTTP.
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
use crate::core::protocol::{ApiError, HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse};

/// Largest response body accepted: twice the largest answer a coordinator can give (a routing
/// view of `SHARD_COUNT_MAX` stream keys under the longest prefix is about 14 MB;
/// `the_largest_answers_a_coordinator_can_give_fit_the_body_limit`), so no group the admin API
/// accepts has answers its clients refuse.
const BODY_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Longest attempt on one address: a longer `request_timeout` is this (a century).
const ATTEMPT_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3_600);

/// Settings of [`HttpTransport`].
#[derive(Clone, PartialEq, Eq)]
pub struct HttpClientConfig {
    /// Coordinator base addresses (at least one).
    pub addrs: Vec<SocketAddr>,
    /// Per attempt (one address): connect, send, and read the whole response. While another
    /// address remains to try in the call, connecting (TCP, and TLS when configured) may take at
    /// most half of it, so an address that drops connection attempts leaves the other half to the
    /// next one.
    pub request_timeout: Duration,
    /// Idle keep-alive connections kept per address (0 disables reuse).
    pub idle_per_address_max: usize,
    /// The client token sent as `Authorization: Bearer` (coordinators started with
    /// `--client-token` require one). Never printed.
    pub client_token: Option<String>,
}

impl HttpClientConfig {
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        Self { addrs, request_timeout: Duration::from_secs(2), idle_per_address_max: 2, client_token: None }
    }

    /// These settings with `token` as the client token.
    pub fn with_client_token(self, token: impl Into<String>) -> Self {
        Self { client_token: Some(token.into()), ..self }
    }
}

impl std::fmt::Debug for HttpClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClientConfig")
            .field("addrs", &self.addrs)
            .field("request_timeout", &self.request_timeout)
            .field("idle_per_address_max", &self.idle_per_address_max)
            .field("client_token", &self.client_token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// The coordinator transport over HTTP/1.
#[derive(Debug)]
pub struct HttpTransport {
    config: HttpClientConfig,
    /// Index into `addrs` where the next call starts: the last address that answered, or the
    /// one after an address whose attempt timed out or was cancelled (`Failover`).
    preferred: AtomicUsize,
    idle: Mutex<BTreeMap<SocketAddr, Vec<SendRequest<Full<Bytes>>>>>,
    /// `Some`: speak `https://` (every connection is TLS).
    #[cfg(not(madsim))]
    tls: Option<super::tls::ClientTls>,
}

/// How one call moves `preferred` as it finds out. An answer (a 2xx or a final error) makes its
/// address preferred. The first address of the call that timed out, or on which the call was
/// dropped (the caller's own deadline passed first), is moved past: the next call starts with the
/// address after it instead of spending its whole budget on the same hung address again. An
/// address tried after one that timed out had only what was left of the caller's budget, so it
/// keeps its place. Refusals, resets and 503s move nothing: they come quickly, and the address
/// that answers next becomes preferred anyway.
struct Failover<'a> {
    preferred: &'a AtomicUsize,
    count: usize,
    /// The address whose attempt is in flight: dropped meanwhile, the call moves past it.
    waiting_on: Option<usize>,
    /// This call already moved `preferred` past an address.
    moved: bool,
}

impl<'a> Failover<'a> {
    fn new(preferred: &'a AtomicUsize, count: usize) -> Self {
        Self { preferred, count, waiting_on: None, moved: false }
    }

    fn waiting_on(&mut self, index: usize) {
        self.waiting_on = Some(index);
    }

    fn answered(&mut self, index: usize) {
        self.waiting_on = None;
        self.preferred.store(index, Ordering::Relaxed);
    }

    fn timed_out(&mut self, index: usize) {
        self.waiting_on = None;
        self.move_past(index);
    }

    fn failed(&mut self) {
        self.waiting_on = None;
    }

    fn move_past(&mut self, index: usize) {
        if !self.moved {
            self.moved = true;
            self.preferred.store((index + 1) % self.count, Ordering::Relaxed);
        }
    }
}

impl Drop for Failover<'_> {
    fn drop(&mut self) {
        if let Some(index) = self.waiting_on.take() {
            self.move_past(index);
        }
    }
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
        Self {
            config,
            preferred: AtomicUsize::new(0),
            idle: Mutex::new(BTreeMap::new()),
            #[cfg(not(madsim))]
            tls: None,
        }
    }

    /// Speaks `https://` to every address: TLS verified by `tls` (see [`super::tls::ClientTls`]).
    #[cfg(not(madsim))]
    pub fn with_tls(mut self, tls: super::tls::ClientTls) -> Self {
        self.tls = Some(tls);
        self
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
        let mut failover = Failover::new(&self.preferred, count);
        for offset in 0..count {
            let index = (first + offset) % count;
            let addr = self.config.addrs[index];
            let token = self.config.client_token.as_deref();
            let request = || build_request(&method, &path, addr, token, body.clone());
            // `Duration::MAX` ("no limit") overflowed the clock and panicked in the caller's task,
            // the consumer's heartbeat task included (a numbers review): a century is no limit.
            let give_up = tokio::time::Instant::now() + self.config.request_timeout.min(ATTEMPT_MAX);
            let connect_timeout = self.connect_timeout(offset + 1 < count);
            failover.waiting_on(index);
            let attempt = tokio::select! {
                biased;
                attempt = self.attempt(addr, request, connect_timeout) => attempt,
                _ = crate::time::sleep_until(give_up) => Attempt::Next(TransportError::Timeout),
            };
            match attempt {
                Attempt::Done(result) => {
                    failover.answered(index);
                    return result.and_then(|bytes| {
                        serde_json::from_slice(&bytes)
                            .map_err(|e| TransportError::Unreachable(format!("bad response body from {addr}: {e}")))
                    });
                }
                Attempt::Next(TransportError::Timeout) => {
                    failover.timed_out(index);
                    last = TransportError::Timeout;
                }
                Attempt::Next(error) => {
                    failover.failed();
                    last = error;
                }
            }
        }
        Err(last)
    }

    /// How long a fresh connection may take while another address remains: half the attempt (see
    /// [`HttpClientConfig::request_timeout`]). `None`: the call's last address, bounded by the
    /// attempt alone.
    fn connect_timeout(&self, another_remains: bool) -> Option<Duration> {
        another_remains.then(|| self.config.request_timeout / 2)
    }

    /// One address: a pooled connection first (retried once on a fresh one if it fails), else a
    /// fresh connection, connected within `connect_timeout` when one is given.
    async fn attempt(
        &self,
        addr: SocketAddr,
        request: impl Fn() -> Result<Request<Full<Bytes>>, String>,
        connect_timeout: Option<Duration>,
    ) -> Attempt {
        if let Some(sender) = self.take_idle(addr) {
            let Ok(req) = request() else { return Attempt::Done(Err(bad_request())) };
            if let Ok(attempt) = self.exchange(addr, sender, req).await {
                return attempt;
            }
        }
        let connected = match connect_timeout {
            Some(limit) => crate::time::timeout(limit, self.connect(addr)).await,
            None => Ok(self.connect(addr).await),
        };
        let sender = match connected {
            Ok(Ok(sender)) => sender,
            Ok(Err(error)) => return Attempt::Next(TransportError::Unreachable(format!("{addr}: {error}"))),
            Err(_) => return Attempt::Next(TransportError::Timeout),
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

    async fn routing(&self, group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, TransportError> {
        let mut params = Vec::new();
        if report.known_version > 0 {
            params.push(format!("knownVersion={}", report.known_version));
        }
        if report.known_shard_count > 0 {
            params.push(format!("knownShardCount={}", report.known_shard_count));
        }
        if let Some(proof) = report.known_version_proof {
            params.push(format!("knownVersionProof={proof}"));
        }
        if let Some(proof) = report.known_shard_count_proof {
            params.push(format!("knownShardCountProof={proof}"));
        }
        let mut path = group_path(group, "routing");
        if !params.is_empty() {
            path.push('?');
            path.push_str(&params.join("&"));
        }
        self.call(Method::GET, path, Bytes::new()).await
    }
}

impl HttpTransport {
    /// Opens a connection (TLS when configured) and spawns its driver task.
    async fn connect(&self, addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        #[cfg(not(madsim))]
        if let Some(tls) = &self.tls {
            let stream = tls.connect(addr, stream).await.map_err(|e| format!("TLS handshake: {e}"))?;
            return start_http1(stream).await;
        }
        start_http1(stream).await
    }
}

/// Runs the HTTP/1 client handshake on `stream` and spawns the connection's driver task (it ends
/// when the `SendRequest` is dropped or the peer closes).
async fn start_http1<S>(stream: S) -> Result<SendRequest<Full<Bytes>>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
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

fn build_request(
    method: &Method,
    path: &str,
    addr: SocketAddr,
    token: Option<&str>,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let mut builder = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "application/json");
    if let Some(token) = token {
        builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    builder.body(Full::new(body)).map_err(|e| e.to_string())
}

fn bad_request() -> TransportError {
    TransportError::Unreachable("could not build the request (invalid group name in path?)".into())
}

/// `/v1/groups/{streamPrefix}/{consumerGroup}/{action}` with percent-encoded segments.
pub fn group_path(group: &GroupId, action: &str) -> String {
    format!(
        "/v1/groups/{}/{}/{action}",
        super::routes::encode_segment(&group.stream_prefix),
        super::routes::encode_segment(&group.consumer_group)
    )
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
