//! The clients' multi-address failover with the library's default timeouts, over real loopback
//! TCP: the first coordinator address hangs (a listener bound and never accepted: connections
//! complete, requests are never read, as with a stopped process), the second is a coordinator
//! (`rsc::http::router::app` over a `MemoryStore`). With the defaults an attempt on one address
//! (2 s) is as long as the caller's deadline for the whole call (`heartbeat_timeout_ms`,
//! `refresh_timeout_ms`: 2 s), so the transport used to start every call again on the hung address
//! and neither client ever reached the healthy one. Now a call cancelled there moves the transport
//! past it.
//!
//! Run: `cargo test --test client_failover`. Real tokio; not built under `--cfg madsim`.

#![cfg(not(madsim))]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use rsc::client::{Consumer, ConsumerConfig, Producer, ProducerConfig};
use rsc::core::model::{GroupConfig, GroupId};
use rsc::core::protocol::AdminRequest;
use rsc::http::client::{HttpClientConfig, HttpTransport};
use rsc::http::router::{app, HttpOptions};
use rsc::service::{Coordinator, CoordinatorOptions};
use rsc::store::memory::MemoryStore;

fn group() -> GroupId {
    GroupId::new("orders", "billing")
}

/// A coordinator serving `group()` (two shards) on loopback, over `store`.
struct Served {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    server: JoinHandle<()>,
}

impl Served {
    async fn start(store: &MemoryStore) -> Self {
        let coordinator = Coordinator::new(store.connect(), CoordinatorOptions::default());
        coordinator.start().await.expect("the memory store passes the probe");
        let create = AdminRequest::CreateGroup { group: group(), shard_count: 2, config: GroupConfig::default() };
        coordinator.admin(create).await.expect("group created");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(rsc::http::serve::serve(listener, app(coordinator, HttpOptions::default()), async {
            let _ = stopped.await;
        }));
        Self { addr, stop, server }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.server.await.expect("server stops");
    }
}

/// An address that hangs: kept open while the returned listener lives.
async fn hung() -> (SocketAddr, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    (listener.local_addr().expect("addr"), listener)
}

#[tokio::test]
async fn a_consumer_with_default_timeouts_reads_past_a_hung_first_address() {
    let store = MemoryStore::new(1);
    let served = Served::start(&store).await;
    let (hung, _hung) = hung().await;
    let transport = HttpTransport::new(HttpClientConfig::new(vec![hung, served.addr]));
    let config = ConsumerConfig::new(group(), "m1");
    let budget = Duration::from_millis(3 * config.heartbeat_timeout_ms);
    let started = Instant::now();
    let consumer = Consumer::join(config, transport, store.connect());
    while consumer.status().readable.is_empty() {
        assert!(started.elapsed() < budget, "not readable after {budget:?}: {:?}", consumer.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(consumer.status().readable, vec![0, 1]);
    consumer.close().await.expect("the leave reaches the coordinator that answers");
    served.stop().await;
}

#[tokio::test]
async fn a_producer_with_default_timeouts_refreshes_past_a_hung_first_address() {
    let store = MemoryStore::new(1);
    let served = Served::start(&store).await;
    let (hung, _hung) = hung().await;
    let transport = HttpTransport::new(HttpClientConfig::new(vec![hung, served.addr]));
    let config = ProducerConfig::new(group(), "p1");
    let budget = Duration::from_millis(3 * config.refresh_timeout_ms);
    let started = Instant::now();
    // Its first refresh (the background task's) goes out at once, to the hung address.
    let producer = Producer::new(config, transport, store.connect());
    while let Err(error) = producer.refresh().await {
        assert!(started.elapsed() < budget, "no refresh succeeded in {budget:?}: {error}");
    }
    producer.publish(b"k", b"v".to_vec()).await.expect("publish on the refreshed route");
    served.stop().await;
}
