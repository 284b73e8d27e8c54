//! How a client reaches the coordinator: the [`CoordinatorTransport`] trait, implemented over HTTP
//! by [`crate::http::client::HttpTransport`] and, in tests and the simulation, by in-process fakes.
//!
//! A transport moves requests and responses; it never interprets them (no retries of its own
//! beyond trying another coordinator address, no state). The invariant it keeps: a call either
//! returns the response the coordinator produced for *this* request, or an error — never a
//! response to an earlier or later request.

use std::future::Future;

use crate::core::model::GroupId;
use crate::core::protocol::{ApiError, ErrorCode, HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse};

/// Why a coordinator call produced no successful response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The coordinator answered with a typed protocol error.
    #[error("coordinator error: {0}")]
    Api(ApiError),
    /// No coordinator could be reached, or the answer was not a valid response.
    #[error("coordinator unreachable: {0}")]
    Unreachable(String),
    /// No answer arrived within the request timeout.
    #[error("coordinator request timed out")]
    Timeout,
}

impl TransportError {
    /// The protocol error code, when the coordinator answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            TransportError::Api(error) => Some(error.code),
            TransportError::Unreachable(_) | TransportError::Timeout => None,
        }
    }
}

impl From<ApiError> for TransportError {
    fn from(error: ApiError) -> Self {
        TransportError::Api(error)
    }
}

/// A way to send heartbeats and routing requests to the coordinator.
pub trait CoordinatorTransport: Send + Sync + 'static {
    /// `POST /v1/groups/{streamPrefix}/{consumerGroup}/heartbeat`.
    fn heartbeat(
        &self,
        req: HeartbeatRequest,
    ) -> impl Future<Output = Result<HeartbeatResponse, TransportError>> + Send;

    /// `GET /v1/groups/{streamPrefix}/{consumerGroup}/routing[?knownVersion=N&knownShardCount=S]`:
    /// the metadataVersion of the caller's cached view and the highest shard count it published
    /// with (0: none; not sent).
    fn routing(
        &self,
        group: &GroupId,
        report: RoutingReport,
    ) -> impl Future<Output = Result<RoutingResponse, TransportError>> + Send;
}

impl<T: CoordinatorTransport> CoordinatorTransport for std::sync::Arc<T> {
    fn heartbeat(
        &self,
        req: HeartbeatRequest,
    ) -> impl Future<Output = Result<HeartbeatResponse, TransportError>> + Send {
        (**self).heartbeat(req)
    }

    fn routing(
        &self,
        group: &GroupId,
        report: RoutingReport,
    ) -> impl Future<Output = Result<RoutingResponse, TransportError>> + Send {
        (**self).routing(group, report)
    }
}
