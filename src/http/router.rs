//! The coordinator's HTTP API: [`app`] builds an axum [`Router`] over a [`Coordinator`], from the
//! route table in [`super::routes`]. Serve it with [`super::serve::serve`] (never `axum::serve`,
//! which does not run under madsim); tests drive it with `tower::ServiceExt::oneshot`.
//!
//! Owns: routing, the admin bearer token check, the request body limit, a global concurrency
//! limit, one tracing span per request (method, route, group, member, status) and the HTTP metrics
//! (`rsc_http_requests_total`, `rsc_http_request_duration_seconds`). Never: decides anything about
//! groups (the coordinator does), answers from state that is not in the store, or leaks internals
//! in a 5xx body (see [`super::error`]). Invariant: a request rejected here (auth, malformed input)
//! never reaches the coordinator, so it writes nothing.
//!
//! The admin token is compared in constant time; when none is configured, admin routes are open
//! (the binary warns about it at startup).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{DefaultBodyLimit, RawPathParams, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use bytes::BytesMut;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::limit::GlobalConcurrencyLimitLayer;
use tracing::Instrument;

use super::auth::{check_admin_token, ClientTokens};
use super::error::{HttpError, BODY_READ_TIMEOUT_DEFAULT};
use super::routes::{HttpMethod, RouteAuth, RouteId, RouteSpec, ROUTES};
use super::serve::BodyReadTimeout;
use super::{handlers, health};
use crate::core::model::GroupId;
use crate::metrics::Metrics;
use crate::service::Coordinator;
use crate::store::MetadataStore;

pub use super::health::Readiness;

/// Default request body limit: 1 MiB.
pub const BODY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// Default number of requests handled at once; more wait for a slot.
pub const CONCURRENCY_MAX_DEFAULT: usize = 1024;
/// Largest request head accepted: header names and values plus the URI, in bytes. Larger heads
/// get a typed JSON 431. (hyper's own limits, [`super::serve::HEADERS_MAX_HYPER`] headers and a
/// 400 KiB read buffer, are far above these and answer 431 with an empty body.)
pub const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Most request headers accepted; more get a typed JSON 431.
pub const HEADERS_MAX: usize = 64;

/// Settings of the HTTP edge.
#[derive(Clone)]
pub struct HttpOptions {
    /// Largest request body accepted (413 above it).
    pub body_bytes_max: usize,
    /// Requests handled at once across the API's routes; further ones wait. The probes and the
    /// scrapes have slots of their own ([`PROBE_CONCURRENCY_MAX`], [`SCRAPE_CONCURRENCY_MAX`]).
    pub concurrency_max: usize,
    /// Bearer token required by admin routes; `None`: admin routes are open.
    pub admin_token: Option<String>,
    /// Bearer tokens of the data plane (heartbeat, routing); empty: the data plane is open.
    pub client_tokens: ClientTokens,
    /// The startup probe outcome and operator warnings `/readyz` reports.
    pub readiness: Readiness,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            body_bytes_max: BODY_BYTES_MAX_DEFAULT,
            concurrency_max: CONCURRENCY_MAX_DEFAULT,
            admin_token: None,
            client_tokens: ClientTokens::default(),
            readiness: Readiness::default(),
        }
    }
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: only whether one is set is shown.
        f.debug_struct("HttpOptions")
            .field("body_bytes_max", &self.body_bytes_max)
            .field("concurrency_max", &self.concurrency_max)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("client_tokens", &self.client_tokens)
            .field("readiness", &self.readiness)
            .finish()
    }
}

/// What every handler sees.
pub struct AppState<S> {
    pub coordinator: Coordinator<S>,
    pub options: Arc<HttpOptions>,
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self { coordinator: self.coordinator.clone(), options: Arc::clone(&self.options) }
    }
}

/// Concurrent requests to the probes (`/healthz`, `/readyz`), apart from every other route's.
pub const PROBE_CONCURRENCY_MAX: usize = 16;
/// Concurrent requests to `/metrics` and the OpenAPI document, apart from every other route's.
pub const SCRAPE_CONCURRENCY_MAX: usize = 4;

/// The coordinator's HTTP API over `coordinator`.
pub fn app<S: MetadataStore>(coordinator: Coordinator<S>, options: HttpOptions) -> Router {
    let body_bytes_max = options.body_bytes_max;
    let concurrency_max = options.concurrency_max.max(1);
    let state = AppState { coordinator, options: Arc::new(options) };
    let budget = Arc::new(Semaphore::new(BODY_BUFFER_BYTES_MAX.max(body_bytes_max)));
    let body_gate = BodyGate { state: state.clone(), budget };
    // One pool of slots for the API's routes, and small ones of their own for the probes and for
    // the scrapes (metrics, the OpenAPI document): probes and scrapes queued behind heartbeats for
    // the same slots, so an overload failed liveness probes (restarts) and scrapes (gaps) exactly
    // when they mattered. Apart from each other too: `/metrics` is unauthenticated and costs a
    // render, so a flood of it must not hold the probes' slots (nor the API's).
    let slots = Arc::new(Semaphore::new(concurrency_max));
    let probe_slots = Arc::new(Semaphore::new(PROBE_CONCURRENCY_MAX));
    let scrape_slots = Arc::new(Semaphore::new(SCRAPE_CONCURRENCY_MAX));
    let mut router = Router::new();
    for spec in ROUTES {
        let context = RouteContext { spec, state: state.clone() };
        // From the outside in: the credential check (headers only), then the body read, then a
        // concurrency slot, then the handler. So a request without the route's credential is
        // refused before any of its body is read, and holds none of the body budget: a black-box
        // review filled that budget with unauthenticated slow bodies (64 of about 1 MiB each,
        // renewed every body read deadline), and every group's heartbeats waited behind them.
        let pool = match spec.id {
            RouteId::Healthz | RouteId::Readyz => &probe_slots,
            RouteId::Metrics | RouteId::OpenApi => &scrape_slots,
            _ => &slots,
        };
        let endpoint = endpoint::<S>(spec)
            .layer(GlobalConcurrencyLimitLayer::with_semaphore(Arc::clone(pool)))
            .route_layer(middleware::from_fn_with_state(body_gate.clone(), buffer_body::<S>))
            .route_layer(middleware::from_fn_with_state(context, around_request::<S>));
        router = router.route(spec.path, endpoint);
    }
    // Unmatched paths and methods are answered without reading their bodies.
    router
        .method_not_allowed_fallback(method_not_allowed::<S>)
        .fallback(not_found::<S>)
        .layer(DefaultBodyLimit::max(body_bytes_max))
        .layer(middleware::from_fn_with_state(state.clone(), limit_request_head::<S>))
        .with_state(state)
}

/// Marks a response [`buffer_body`] answered itself and counted under its own route label
/// (`body_timeout`, ...), so [`around_request`] does not count it a second time.
#[derive(Clone, Copy, Debug)]
struct CountedAlready;

/// Request body bytes buffered at once across all requests still reading theirs (at least one
/// body of the limit): memory stays bounded however many connections send bodies.
pub const BODY_BUFFER_BYTES_MAX: usize = 64 * 1024 * 1024;

/// State of [`buffer_body`]: the app, and the byte budget every buffered body draws from.
struct BodyGate<S> {
    state: AppState<S>,
    budget: Arc<Semaphore>,
}

impl<S> Clone for BodyGate<S> {
    fn clone(&self) -> Self {
        Self { state: self.state.clone(), budget: Arc::clone(&self.budget) }
    }
}

/// Reads a request's whole body *before* the request takes a concurrency slot, and after its
/// credential was checked (see [`app`]). A client that
/// sends its body slowly (or not at all) then holds a connection and the bytes that did arrive,
/// never one of the `concurrency_max` slots every group's heartbeats need: a thousand slow
/// bodies used to take every slot for the body read deadline, and every member of every group
/// expired meanwhile (found by a black-box review). The bytes buffered count against
/// [`BODY_BUFFER_BYTES_MAX`] as they arrive, so a slow body costs what it sent, and the read is
/// bounded by the connection's [`BodyReadTimeout`] (408). Over the body limit: 413.
async fn buffer_body<S: MetadataStore>(State(gate): State<BodyGate<S>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let deadline = parts.extensions.get::<BodyReadTimeout>().map_or(BODY_READ_TIMEOUT_DEFAULT, |t| t.0);
    let limit = gate.state.options.body_bytes_max;
    let method = method_label(&parts.method);
    let started = Instant::now();
    let read = async {
        let mut body = body;
        let mut buffered = BytesMut::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| (StatusCode::BAD_REQUEST, "body_unreadable"))?;
            // Trailers carry nothing a handler reads.
            let Ok(chunk) = frame.into_data() else { continue };
            if buffered.len() + chunk.len() > limit {
                return Err((StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"));
            }
            // `limit` is at most the budget, so this never asks for more than exists.
            let permits = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
            let permit = Arc::clone(&gate.budget).acquire_many_owned(permits).await;
            let permit = permit.map_err(|_| (StatusCode::SERVICE_UNAVAILABLE, "body_budget_closed"))?;
            match held.as_mut() {
                Some(held) => held.merge(permit),
                None => held = Some(permit),
            }
            buffered.extend_from_slice(&chunk);
        }
        Ok((buffered.freeze(), held))
    };
    let (bytes, _held) = match crate::time::timeout(deadline, read).await {
        Ok(Ok(read)) => read,
        Ok(Err((status, label))) => {
            record(&gate.state.coordinator.metrics(), method, label, status, started.elapsed().as_secs_f64());
            let message = match status {
                StatusCode::PAYLOAD_TOO_LARGE => format!("request body is over the limit of {limit} bytes"),
                _ => "the request body could not be read".to_string(),
            };
            let mut response = HttpError::rejected(status, message).into_response();
            response.extensions_mut().insert(CountedAlready);
            return response;
        }
        Err(_) => {
            let status = StatusCode::REQUEST_TIMEOUT;
            let elapsed_s = started.elapsed().as_secs_f64();
            record(&gate.state.coordinator.metrics(), method, "body_timeout", status, elapsed_s);
            let mut response = HttpError::rejected(status, "the request body did not arrive in time").into_response();
            response.extensions_mut().insert(CountedAlready);
            return response;
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Answers a request head over [`HEAD_BYTES_MAX`] or [`HEADERS_MAX`] with a typed JSON 431 before
/// any routing (unmatched paths included). Counted in `rsc_http_requests_total` with the route
/// label `head_too_large`.
async fn limit_request_head<S: MetadataStore>(
    State(state): State<AppState<S>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let header_bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    let head_bytes = header_bytes + request.uri().to_string().len();
    if headers.len() > HEADERS_MAX || head_bytes > HEAD_BYTES_MAX {
        let message = format!(
            "request head too large: {} headers, {head_bytes} bytes (limits: {HEADERS_MAX} headers, {HEAD_BYTES_MAX} \
             bytes)",
            headers.len()
        );
        let status = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
        record(&state.coordinator.metrics(), method_label(request.method()), "head_too_large", status, 0.0);
        return HttpError::rejected(status, message).into_response();
    }
    // A declared body over the limit is refused before anything reads it: with `Expect:
    // 100-continue` the client is then told 413 at once instead of being invited to send it.
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(bytes) = declared.filter(|bytes| *bytes > state.options.body_bytes_max as u64) {
        let status = StatusCode::PAYLOAD_TOO_LARGE;
        record(&state.coordinator.metrics(), method_label(request.method()), "body_too_large", status, 0.0);
        let message =
            format!("request body of {bytes} bytes is over the limit of {} bytes", state.options.body_bytes_max);
        return HttpError::rejected(status, message).into_response();
    }
    next.run(request).await
}

/// The handler of one route, on exactly the method the table names.
fn endpoint<S: MetadataStore>(spec: &RouteSpec) -> MethodRouter<AppState<S>> {
    let filter = match spec.method {
        HttpMethod::Get => MethodFilter::GET,
        HttpMethod::Post => MethodFilter::POST,
        HttpMethod::Put => MethodFilter::PUT,
        HttpMethod::Delete => MethodFilter::DELETE,
    };
    match spec.id {
        RouteId::Heartbeat => on(filter, handlers::heartbeat::<S>),
        RouteId::Routing => on(filter, handlers::routing::<S>),
        RouteId::Describe => on(filter, handlers::describe::<S>),
        RouteId::CreateGroup => on(filter, handlers::create_group::<S>),
        RouteId::AddShards => on(filter, handlers::add_shards::<S>),
        RouteId::ChangeConfig => on(filter, handlers::change_config::<S>),
        RouteId::DeleteGroup => on(filter, handlers::delete_group::<S>),
        RouteId::RebuildIndex => on(filter, handlers::rebuild_index::<S>),
        RouteId::Healthz => on(filter, health::healthz::<S>),
        RouteId::Readyz => on(filter, health::readyz::<S>),
        RouteId::Metrics => on(filter, health::metrics::<S>),
        RouteId::OpenApi => on(filter, health::openapi),
    }
}

/// State of the per-route middleware: the route's row and the app.
struct RouteContext<S> {
    spec: &'static RouteSpec,
    state: AppState<S>,
}

impl<S> Clone for RouteContext<S> {
    fn clone(&self) -> Self {
        Self { spec: self.spec, state: self.state.clone() }
    }
}

const REQUESTS: &str = "rsc_http_requests_total";
const REQUESTS_HELP: &str = "HTTP requests answered, by method, route template and status.";
const DURATION: &str = "rsc_http_request_duration_seconds";
const DURATION_HELP: &str = "Time to answer an HTTP request, by route template.";

/// Runs one matched request inside its span: the admin check, the handler, metrics.
async fn around_request<S: MetadataStore>(
    State(context): State<RouteContext<S>>,
    params: Result<RawPathParams, RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Response {
    let spec = context.spec;
    let span = tracing::info_span!(
        "http",
        method = spec.method.as_str(),
        route = spec.path,
        group = tracing::field::Empty,
        member = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    let started = Instant::now();
    let mut unanswered = Unanswered {
        metrics: context.state.coordinator.metrics(),
        method: spec.method.as_str(),
        route: spec.path,
        started,
        armed: true,
    };
    let response = async {
        let options = &context.state.options;
        let refused = match spec.auth {
            RouteAuth::Open => Ok(()),
            RouteAuth::Admin => check_admin_token(options.admin_token.as_deref(), request.headers()),
            RouteAuth::Client => match params.ok().as_ref().and_then(path_group) {
                Some(group) => options.client_tokens.check(request.headers(), &group),
                // No group in the path (a parameter that is not UTF-8 once percent-decoded): the
                // handler's path check would refuse it 400, but only after the body was read, with
                // no credential checked (a review of this change: 64 such slow bodies filled the
                // budget again). So it is refused here, before the body, as the handler would.
                None => return HttpError::bad_request("invalid path: it names no group").into_response(),
            },
        };
        if let Err(error) = refused {
            return HttpError::from(error).into_response();
        }
        next.run(request).await
    }
    .instrument(span.clone())
    .await;
    unanswered.armed = false;
    let status = response.status();
    span.record("status", status.as_u16());
    let elapsed_s = started.elapsed().as_secs_f64();
    span.in_scope(|| tracing::debug!(status = status.as_u16(), elapsed_s, "answered"));
    if response.extensions().get::<CountedAlready>().is_none() {
        record(&context.state.coordinator.metrics(), spec.method.as_str(), spec.path, status, elapsed_s);
    }
    response
}

/// The group named by the matched path's `{streamPrefix}` and `{consumerGroup}` (percent-decoded,
/// as the handlers see them).
fn path_group(params: &RawPathParams) -> Option<GroupId> {
    let (mut prefix, mut group) = (None, None);
    for (key, value) in params {
        match key {
            "streamPrefix" => prefix = Some(value.to_owned()),
            "consumerGroup" => group = Some(value.to_owned()),
            _ => {}
        }
    }
    Some(GroupId::new(prefix?, group?))
}

/// The `status` label of a request whose client went away before it was answered (nginx's 499).
const CLIENT_CLOSED: u16 = 499;

/// Counts a matched request whose future was dropped before it answered: the client closed the
/// connection (its timeout), so hyper dropped the handler. Such requests were counted nowhere,
/// and the latency histogram lost its tail, during exactly the slowdowns they come from. Counted
/// with status `499` and the time until the drop.
struct Unanswered {
    metrics: Arc<Metrics>,
    method: &'static str,
    route: &'static str,
    started: Instant,
    armed: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.armed {
            // Unwinding from a panic in the handler is a server error, not a client that left.
            let status = if std::thread::panicking() {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::from_u16(CLIENT_CLOSED).unwrap_or(StatusCode::REQUEST_TIMEOUT)
            };
            record(&self.metrics, self.method, self.route, status, self.started.elapsed().as_secs_f64());
        }
    }
}

fn record(metrics: &Metrics, method: &str, route: &'static str, status: StatusCode, elapsed_s: f64) {
    let labels = vec![("method", method.to_owned()), ("route", route.to_owned()), ("status", status.as_str().into())];
    metrics.inc(REQUESTS, REQUESTS_HELP, labels);
    metrics.observe(DURATION, DURATION_HELP, vec![("route", route.to_owned())], elapsed_s);
}

/// Any path not in the route table: 404 `BAD_REQUEST`.
async fn not_found<S: MetadataStore>(State(state): State<AppState<S>>, request: Request) -> Response {
    let method = request.method().as_str().to_owned();
    record(&state.coordinator.metrics(), method_label(request.method()), "unmatched", StatusCode::NOT_FOUND, 0.0);
    let message = format!("no route for {method} {}", request.uri().path());
    HttpError::rejected(StatusCode::NOT_FOUND, message).into_response()
}

/// A known path with a method it does not serve: 405 `BAD_REQUEST` with an `Allow` header.
async fn method_not_allowed<S: MetadataStore>(State(state): State<AppState<S>>, request: Request) -> Response {
    let method = request.method().as_str().to_owned();
    let label = method_label(request.method());
    record(&state.coordinator.metrics(), label, "unmatched", StatusCode::METHOD_NOT_ALLOWED, 0.0);
    let path = request.uri().path().to_owned();
    let allowed: Vec<&str> =
        ROUTES.iter().filter(|r| template_matches(r.path, &path)).map(|r| r.method.as_str()).collect();
    let message = format!("{method} is not allowed on {path}; allowed: {}", allowed.join(", "));
    let mut response = HttpError::rejected(StatusCode::METHOD_NOT_ALLOWED, message).into_response();
    if let Ok(value) = allowed.join(", ").parse() {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

/// A bounded metric label for a request method: clients choose methods freely, and every
/// distinct label value would be a new series.
fn method_label(method: &axum::http::Method) -> &'static str {
    const KNOWN: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];
    KNOWN.into_iter().find(|known| *known == method.as_str()).unwrap_or("OTHER")
}

/// True when `path` fits `template` segment by segment (`{x}` matches any one segment).
fn template_matches(template: &str, path: &str) -> bool {
    let (t, p): (Vec<_>, Vec<_>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| (t.starts_with('{') && !p.is_empty()) || t == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(method_label(&axum::http::Method::PATCH), "PATCH");
        let junk = axum::http::Method::from_bytes(b"XYZZY").expect("extension method");
        assert_eq!(method_label(&junk), "OTHER");
    }

    #[test]
    fn templates() {
        assert!(template_matches("/v1/groups/{streamPrefix}/{consumerGroup}", "/v1/groups/a/b"));
        assert!(!template_matches("/v1/groups/{streamPrefix}/{consumerGroup}", "/v1/groups/a/b/c"));
        assert!(!template_matches("/v1/groups/{streamPrefix}/{consumerGroup}", "/v1/groups//b"));
        assert!(template_matches("/healthz", "/healthz"));
    }
}
