//! A datagram protocol between clients and coordinator processes on the simulated network — the
//! simulation's stand-in for the HTTP edge until it is wired in, and a fast mode afterwards.
//!
//! Requests go to the coordinator Service address (a madsim IPVS virtual server, like a
//! Kubernetes Service: each request goes to one of the instances currently behind it), replies come
//! back tagged with a run-unique call id. A lost request or reply, a dead or clogged instance, or a
//! slow one is a `Timeout` after the client's timeout. A terminating instance answers 503
//! `COORDINATOR_TERMINATING` like the HTTP edge, and the client tries again (up to
//! `ATTEMPTS_MAX` times within its timeout), as `HttpTransport` moves on to another address.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use madsim::net::Endpoint;
use rsc::client::{CoordinatorTransport, TransportError};
use rsc::core::model::GroupId;
use rsc::core::protocol::{
    AdminRequest, AdminResponse, ApiError, ErrorCode, HeartbeatRequest, HeartbeatResponse, RoutingReport,
    RoutingResponse,
};
use rsc::http::auth::ClientTokens;
use rsc::service::{Coordinator, GroupDescription};

use crate::records::Recorder;
use crate::redis_node::RemoteStore;

/// The port coordinator instances listen on.
pub const COORDINATOR_PORT: u16 = 8080;
const REQUEST_TAG: u64 = u64::MAX - 0x0043_4f4f_5244;
/// Sends of one call to the Service before giving up (each to whichever instance IPVS picks).
const ATTEMPTS_MAX: usize = 3;

enum Call {
    Heartbeat(HeartbeatRequest),
    Routing(GroupId, RoutingReport),
    Admin(AdminRequest),
    Describe(GroupId),
}

struct Envelope {
    reply_tag: u64,
    call: Call,
    /// The client token, checked like the HTTP edge checks `Authorization: Bearer`.
    client_token: Option<String>,
    /// The operator's record of this admin call (`Recorder::admins` index), so the server can note
    /// when it worked on it.
    admin_record: Option<usize>,
}

type Reply = Box<dyn Any + Send + Sync>;

/// Serves `coordinator` on this node until the node dies.
pub async fn serve(coordinator: Coordinator<RemoteStore>, recorder: Recorder, client_tokens: ClientTokens) {
    let client_tokens = Arc::new(client_tokens);
    let endpoint = match Endpoint::bind(("0.0.0.0", COORDINATOR_PORT)).await {
        Ok(endpoint) => Arc::new(endpoint),
        Err(e) => panic!("coordinator cannot bind port {COORDINATOR_PORT}: {e}"),
    };
    loop {
        let Ok((payload, from)) = endpoint.recv_from_raw(REQUEST_TAG).await else { return };
        let Ok(envelope) = payload.downcast::<Envelope>() else { continue };
        let (endpoint, coordinator, recorder) = (Arc::clone(&endpoint), coordinator.clone(), recorder.clone());
        let client_tokens = Arc::clone(&client_tokens);
        tokio::spawn(async move {
            let Envelope { reply_tag, call, admin_record, client_token } = *envelope;
            let token = client_token.as_deref();
            let reply: Reply = match call {
                Call::Heartbeat(req) => match client_tokens.check_presented(token, &req.group) {
                    Ok(()) => Box::new(coordinator.heartbeat(req).await),
                    Err(refused) => Box::new(Err::<HeartbeatResponse, _>(refused)),
                },
                Call::Routing(group, report) => match client_tokens.check_presented(token, &group) {
                    Ok(()) => Box::new(coordinator.routing(&group, report).await),
                    Err(refused) => Box::new(Err::<RoutingResponse, _>(refused)),
                },
                Call::Admin(req) => {
                    let attempt = admin_record.map(|i| {
                        let mut records = recorder.lock();
                        let start = recorder.now_us();
                        records.admins[i].handled.push((start, None));
                        (i, records.admins[i].handled.len() - 1)
                    });
                    let result = coordinator.admin(req).await;
                    if let Some((i, a)) = attempt {
                        let end = recorder.now_us();
                        recorder.lock().admins[i].handled[a].1 = Some(end);
                    }
                    Box::new(result)
                }
                Call::Describe(group) => Box::new(coordinator.describe(&group).await),
            };
            let _ = endpoint.send_to_raw(from, reply_tag, reply).await;
        });
    }
}

/// A client of the coordinator Service.
#[derive(Clone)]
pub struct RpcTransport {
    endpoint: Arc<Endpoint>,
    service: SocketAddr,
    timeout: Duration,
    recorder: Recorder,
    client_token: Option<String>,
}

impl RpcTransport {
    /// This transport sending `token` as its client token.
    pub fn with_client_token(self, token: impl Into<String>) -> Self {
        Self { client_token: Some(token.into()), ..self }
    }

    /// Binds this process's endpoint (call on the process's node).
    pub async fn connect(service: SocketAddr, timeout_ms: u64, recorder: Recorder) -> Self {
        let endpoint = match Endpoint::bind("0.0.0.0:0").await {
            Ok(endpoint) => Arc::new(endpoint),
            Err(e) => panic!("cannot bind a client endpoint: {e}"),
        };
        Self { endpoint, service, timeout: Duration::from_millis(timeout_ms), recorder, client_token: None }
    }

    async fn call<T: Send + Sync + 'static>(
        &self,
        make: impl Fn() -> (Call, Option<usize>),
    ) -> Result<T, TransportError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut last = TransportError::Timeout;
        for _ in 0..ATTEMPTS_MAX {
            let reply_tag = self.recorder.next_id();
            let exchange = async {
                let (call, admin_record) = make();
                let envelope = Envelope { reply_tag, call, admin_record, client_token: self.client_token.clone() };
                self.endpoint
                    .send_to_raw(self.service, REQUEST_TAG, Box::new(envelope))
                    .await
                    .map_err(|e| TransportError::Unreachable(e.to_string()))?;
                let (reply, _) = self
                    .endpoint
                    .recv_from_raw(reply_tag)
                    .await
                    .map_err(|e| TransportError::Unreachable(e.to_string()))?;
                match reply.downcast::<Result<T, ApiError>>() {
                    Ok(result) => (*result).map_err(TransportError::Api),
                    Err(_) => Err(TransportError::Unreachable("reply of the wrong type".into())),
                }
            };
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            match rsc::time::timeout(remaining, exchange).await {
                Err(_) => return Err(TransportError::Timeout),
                // A terminating instance: like a 503 over HTTP, try whichever instance is next.
                Ok(Err(TransportError::Api(e))) if e.code == ErrorCode::CoordinatorTerminating => {
                    last = TransportError::Api(e);
                }
                Ok(result) => return result,
            }
        }
        Err(last)
    }

    /// An admin mutation through the Service; `record` is the operator's `AdminCall` index.
    pub async fn admin(&self, req: AdminRequest, record: usize) -> Result<AdminResponse, TransportError> {
        self.call(|| (Call::Admin(req.clone()), Some(record))).await
    }

    /// The recorded metadata of a group through the Service.
    pub async fn describe(&self, group: &GroupId) -> Result<GroupDescription, TransportError> {
        self.call(|| (Call::Describe(group.clone()), None)).await
    }
}

impl CoordinatorTransport for RpcTransport {
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        self.call(|| (Call::Heartbeat(req.clone()), None)).await
    }

    async fn routing(&self, group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, TransportError> {
        self.call(|| (Call::Routing(group.clone(), report), None)).await
    }
}
