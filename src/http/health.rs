//! Operational endpoints: `/healthz` (the process is alive), `/readyz` (this instance should get
//! traffic), `/metrics` (Prometheus text) and the OpenAPI document; plus [`Readiness`], the
//! process-local record of the startup store probe and of warnings operators must see.
//!
//! Owns: the readiness decision. It never touches the store per request: a readiness probe that
//! called Redis would turn a store blip into every instance leaving the Service at once, while
//! requests already answer `STORE_UNAVAILABLE` on their own. Invariant: `/readyz` is 503 while the
//! coordinator is terminating, before the startup probe ran, and after it failed.

use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::router::AppState;
use crate::core::protocol::{ApiError, ErrorCode};
use crate::service::Coordinator;
use crate::store::{MetadataStore, ProbeReport};

/// The OpenAPI description of this API, served at `GET /v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../../docs/openapi.json");

/// Outcome of the startup store probe.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ProbeState {
    NotRun,
    Passed(ProbeReport),
    /// The full error stays in the log; `/readyz` names only its code.
    Failed(ErrorCode),
}

#[derive(Debug)]
struct ReadinessState {
    probe: ProbeState,
    warnings: Vec<String>,
}

/// Shared, cheap-to-clone readiness record of one coordinator process.
#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<Mutex<ReadinessState>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self { inner: Arc::new(Mutex::new(ReadinessState { probe: ProbeState::NotRun, warnings: Vec::new() })) }
    }
}

impl Readiness {
    fn lock(&self) -> MutexGuard<'_, ReadinessState> {
        // A poisoned lock only means a panic elsewhere; the record is still a consistent value.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs the coordinator's startup probe and records its outcome.
    pub async fn probe<S: MetadataStore>(&self, coordinator: &Coordinator<S>) -> Result<ProbeReport, ApiError> {
        let result = coordinator.start().await;
        self.record_probe(&result);
        result
    }

    /// Records the outcome of a startup probe run elsewhere.
    pub fn record_probe(&self, result: &Result<ProbeReport, ApiError>) {
        self.lock().probe = match result {
            Ok(report) => ProbeState::Passed(report.clone()),
            Err(error) => ProbeState::Failed(error.code),
        };
    }

    /// Adds a warning shown in every `/readyz` answer (e.g. "nothing is durable").
    pub fn add_warning(&self, warning: impl Into<String>) {
        self.lock().warnings.push(warning.into());
    }

    pub fn warnings(&self) -> Vec<String> {
        self.lock().warnings.clone()
    }
}

/// `/healthz` body.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Health {
    status: &'static str,
    terminating: bool,
}

/// `/readyz` body when ready.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Ready {
    status: &'static str,
    store_server_version: String,
    warnings: Vec<String>,
}

/// `GET /healthz`: 200 while the process serves HTTP at all (terminating included).
pub(super) async fn healthz<S: MetadataStore>(State(app): State<AppState<S>>) -> Response {
    Json(Health { status: "alive", terminating: app.coordinator.is_terminating() }).into_response()
}

/// `GET /readyz`: 200 with the store version and warnings, or 503 `ApiError` naming the reason.
pub(super) async fn readyz<S: MetadataStore>(State(app): State<AppState<S>>) -> Response {
    let (probe, warnings) = {
        let state = app.options.readiness.lock();
        (state.probe.clone(), state.warnings.clone())
    };
    let not_ready = |code: ErrorCode, reason: &str| {
        let mut message = format!("not ready: {reason}");
        for warning in &warnings {
            message.push_str("; warning: ");
            message.push_str(warning);
        }
        // Built here rather than through `HttpError`, whose 5xx bodies carry a fixed text: these
        // reasons are this module's own words and carry no internals.
        (StatusCode::SERVICE_UNAVAILABLE, Json(ApiError::new(code, message))).into_response()
    };
    if app.coordinator.is_terminating() {
        return not_ready(ErrorCode::CoordinatorTerminating, "coordinator is terminating");
    }
    match probe {
        ProbeState::NotRun => not_ready(ErrorCode::StoreUnavailable, "the startup store probe has not run"),
        ProbeState::Failed(code) => {
            not_ready(code, &format!("the startup store probe failed ({code:?}); see the coordinator log"))
        }
        ProbeState::Passed(report) => {
            Json(Ready { status: "ready", store_server_version: report.server_version, warnings }).into_response()
        }
    }
}

/// `GET /metrics`: the coordinator's registry (HTTP metrics included) in Prometheus text format.
pub(super) async fn metrics<S: MetadataStore>(State(app): State<AppState<S>>) -> Response {
    let text = app.coordinator.metrics().render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// `GET /v1/openapi.json`.
pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}
