//! [`Link`]: how the bench's consumers reach the coordinator — in-process (the consumer's
//! heartbeat task calls `Coordinator::heartbeat` directly; no serialization) or over loopback HTTP
//! (the clients' `HttpTransport` against `rsc::http::serve` on the same runtime).
//! Never interprets a request or a response: it only moves them, like any transport.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::rig::BenchCoordinator;
use rsc::client::{CoordinatorTransport, TransportError};
use rsc::core::model::GroupId;
use rsc::core::protocol::{HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse};
use rsc::http::client::{HttpClientConfig, HttpTransport};
use rsc::http::router::{app, HttpOptions};

/// Idle keep-alive connections the shared HTTP client keeps (one per concurrent heartbeat).
const HTTP_IDLE_MAX: usize = 256;

#[derive(Clone)]
pub enum Link {
    InProcess(BenchCoordinator),
    Http(Arc<HttpTransport>),
}

impl Link {
    pub fn in_process(coordinator: BenchCoordinator) -> Link {
        Link::InProcess(coordinator)
    }

    /// Serves `coordinator` on a free loopback port; returns the link and the server task.
    pub async fn http(coordinator: BenchCoordinator) -> Result<(Link, JoinHandle<()>), String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let server = tokio::spawn(rsc::http::serve::serve(
            listener,
            app(coordinator, HttpOptions::default()),
            std::future::pending(),
        ));
        let transport = HttpTransport::new(HttpClientConfig {
            addrs: vec![addr],
            request_timeout: Duration::from_secs(2),
            idle_per_address_max: HTTP_IDLE_MAX,
            client_token: None,
        });
        Ok((Link::Http(Arc::new(transport)), server))
    }
}

impl CoordinatorTransport for Link {
    fn heartbeat(
        &self,
        req: HeartbeatRequest,
    ) -> impl Future<Output = Result<HeartbeatResponse, TransportError>> + Send {
        let link = self.clone();
        async move {
            match link {
                Link::InProcess(coordinator) => coordinator.heartbeat(req).await.map_err(TransportError::Api),
                Link::Http(transport) => transport.heartbeat(req).await,
            }
        }
    }

    fn routing(
        &self,
        group: &GroupId,
        report: RoutingReport,
    ) -> impl Future<Output = Result<RoutingResponse, TransportError>> + Send {
        let (link, group) = (self.clone(), group.clone());
        async move {
            match link {
                Link::InProcess(coordinator) => coordinator.routing(&group, report).await.map_err(TransportError::Api),
                Link::Http(transport) => transport.routing(&group, report).await,
            }
        }
    }
}
