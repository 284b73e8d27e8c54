//! `RedisStore` through Redis Sentinel, against real processes: a primary, one replica and one
//! sentinel (quorum 1, `down-after-milliseconds` 1000). The primary is killed, Sentinel promotes
//! the replica, and the store — which asks Sentinel for the master at every connection — reports
//! `Unavailable` (never a hang) until it reaches the new master, whose identity differs.

use std::time::{Duration, Instant};

use rsc::store::keys;
use rsc::store::redis::{RedisSentinelOptions, RedisStore, RedisStoreOptions, RedisTlsOptions};
use rsc::store::{MetadataStore, StoreError, StreamStore, WriteOutcome};

use crate::metadata::{cas, create, group};
use crate::support::redis_server::TlsClientAuth;
use crate::support::sentinel::{SentinelConfig, SentinelServer};
use crate::support::RedisServer;
use crate::support::ServerConfig;

const TIMEOUT_MS: u64 = 1_000;
/// Bound on the whole failover as the store sees it (Sentinel needs ~1 s to notice + a promotion).
const FAILOVER_MAX: Duration = Duration::from_secs(30);

fn options(sentinel: &SentinelServer, password: Option<&str>) -> RedisStoreOptions {
    RedisStoreOptions {
        timeout_ms: TIMEOUT_MS,
        sentinel: Some(RedisSentinelOptions {
            sentinels: vec![sentinel.address()],
            master_name: "mymaster".into(),
            sentinel_password: password.map(str::to_string),
        }),
        ..RedisStoreOptions::default()
    }
}

/// Runs `call` and checks it finished within the store's deadline (plus a Sentinel lookup and
/// scheduling slack): no call may hang during a failover.
async fn bounded<T>(call: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = call.await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(TIMEOUT_MS + 1_000), "a store call took {took:?}");
    result
}

/// How the primary is taken away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outage {
    /// SIGKILL: connections break at once.
    Crash,
    /// SIGSTOP: connections hang (only deadlines help); SIGCONT after the failover brings the old
    /// primary back, which Sentinel then demotes to a replica of the new master.
    Hang,
}

#[tokio::test]
async fn the_store_follows_a_sentinel_failover_and_sees_a_new_identity() {
    follow_failover(Outage::Crash, Transport::Plain).await;
}

#[tokio::test]
async fn the_store_follows_a_sentinel_failover_away_from_a_hung_primary() {
    follow_failover(Outage::Hang, Transport::Plain).await;
}

/// `rediss://<master name>`: TLS to the sentinel and to each master it names, the same files.
#[tokio::test]
async fn the_store_follows_a_failover_through_a_tls_sentinel_to_a_tls_replica() {
    follow_failover(Outage::Crash, Transport::Tls).await;
}

/// Plain TCP or TLS everywhere (servers, replication, the sentinel and the store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Plain,
    Tls,
}

/// A primary, one replica and a sentinel over `transport`, and the store's URL and options.
struct Deployment {
    primary: RedisServer,
    replica: RedisServer,
    sentinel: SentinelServer,
    url: &'static str,
    options: RedisStoreOptions,
}

impl Deployment {
    fn start(transport: Transport) -> Self {
        if transport == Transport::Plain {
            let primary = RedisServer::start();
            let replica = primary.start_replica();
            let sentinel = SentinelServer::start(&primary, SentinelConfig::default());
            let options = options(&sentinel, None);
            return Deployment { primary, replica, sentinel, url: "redis://mymaster", options };
        }
        let tls_replication = vec!["--tls-replication".to_string(), "yes".to_string()];
        let primary = RedisServer::start_with(ServerConfig {
            tls: Some(TlsClientAuth::No),
            extra_args: tls_replication.clone(),
            ..ServerConfig::default()
        });
        let files = primary.tls_files().cloned().expect("the primary's TLS files");
        let replica = RedisServer::start_with(ServerConfig {
            tls: Some(TlsClientAuth::No),
            tls_files: Some(files.clone()),
            replica_of: Some(primary.port()),
            extra_args: tls_replication,
            ..ServerConfig::default()
        });
        replica.wait_link_up();
        let config = SentinelConfig { tls: Some(files.clone()), ..SentinelConfig::default() };
        let sentinel = SentinelServer::start(&primary, config);
        let mut options = options(&sentinel, None);
        options.tls = RedisTlsOptions { ca_file: Some(files.ca_cert), ..RedisTlsOptions::default() };
        Deployment { primary, replica, sentinel, url: "rediss://mymaster", options }
    }
}

async fn follow_failover(outage: Outage, transport: Transport) {
    let Deployment { mut primary, replica, sentinel, url, options } = Deployment::start(transport);
    sentinel.wait_replicas(1);

    let store = RedisStore::connect(url, options).await.expect("connect via Sentinel");
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(WriteOutcome::Written { revision: 1 }));
    let v1 = store.load(&g).await.expect("load").expect("record");
    assert_eq!(v1.revision, 1);
    let before = store.identity().await.expect("identity");
    assert_eq!(before.run_id, primary.run_id(), "Sentinel led the store to the primary");
    // Replication is asynchronous: wait until the replica holds the record, so the test is about
    // following the failover and not about a lost write.
    primary.wait_replicated(1);
    let key = keys::metadata_key(&g);
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.cmd(&["EXISTS", &key]) != redis::Value::Int(1) {
        assert!(Instant::now() < deadline, "the replica never received the record");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    match outage {
        Outage::Crash => primary.kill(),
        Outage::Hang => primary.freeze(),
    }
    let killed = Instant::now();
    // Every call fails Unavailable (bounded) until Sentinel names the promoted replica.
    let mut failures = 0u32;
    let mut first_success = None;
    while killed.elapsed() < FAILOVER_MAX {
        match bounded(store.load(&g)).await {
            Ok(record) => {
                let Some(record) = record else {
                    let now = store.identity().await;
                    panic!(
                        "record lost; store now on {now:?}; replica {} dbsize {:?}; primary was {}\n{}",
                        replica.run_id(),
                        replica.cmd(&["DBSIZE"]),
                        before.run_id,
                        sentinel.log_tail()
                    );
                };
                assert_eq!(record.revision, 1);
                first_success = Some(killed.elapsed());
                break;
            }
            Err(err) => {
                assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
                failures += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let Some(recovered_after) = first_success else {
        panic!("no success within {FAILOVER_MAX:?} of the kill:\n{}", sentinel.log_tail());
    };
    assert!(failures > 0, "the kill must be visible as at least one Unavailable");
    eprintln!(
        "sentinel failover ({outage:?}, {transport:?}): {failures} Unavailable answers, first success {recovered_after:?} after \
         the outage began"
    );
    assert_eq!(sentinel.master_port(), Some(replica.port()), "Sentinel promoted the replica");

    let after = bounded(store.identity()).await.expect("identity");
    assert_eq!(after.run_id, replica.run_id(), "the store now talks to the promoted replica");
    assert_ne!(after.run_id, before.run_id);
    assert_ne!(after.replication_id, before.replication_id, "promotion starts a new replication history");
    assert_eq!(bounded(store.write(&g, cas(&v1.cas_stamp(), "v2"))).await, Ok(WriteOutcome::Written { revision: 2 }));
    let v2 = bounded(store.load(&g)).await.expect("load").expect("record").cas_stamp();
    store.ensure_group("orders:v1:0", "billing").await.expect("streams work on the new master");

    if outage == Outage::Hang {
        // The old primary wakes up as a master with stale data; Sentinel demotes it. The store
        // keeps going to the new master (it never reuses an address it learned earlier).
        primary.thaw();
        let deadline = Instant::now() + FAILOVER_MAX;
        while primary.info_field("replication", "role").as_deref() != Some("slave") {
            assert!(Instant::now() < deadline, "Sentinel never demoted the old primary:\n{}", sentinel.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(bounded(store.write(&g, cas(&v2, "v3"))).await, Ok(WriteOutcome::Written { revision: 3 }));
        assert_eq!(bounded(store.identity()).await.expect("identity").run_id, replica.run_id());
    }
}

#[tokio::test]
async fn a_password_protected_sentinel_needs_its_password_and_errors_never_show_it() {
    let primary = RedisServer::start();
    let config = SentinelConfig { password: Some("sentinel-secret-1".into()), ..SentinelConfig::default() };
    let sentinel = SentinelServer::start(&primary, config);

    let store = RedisStore::connect("redis://mymaster", options(&sentinel, Some("sentinel-secret-1")))
        .await
        .expect("connect with the sentinel password");
    assert_eq!(store.identity().await.expect("identity").run_id, primary.run_id());

    let started = Instant::now();
    let err = RedisStore::connect("redis://mymaster", options(&sentinel, Some("wrong-secret-2")))
        .await
        .expect_err("a wrong sentinel password is refused");
    assert!(started.elapsed() < Duration::from_millis(TIMEOUT_MS + 1_000), "{:?}", started.elapsed());
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("Sentinel lookup"), "{text}");
    assert!(!text.contains("wrong-secret-2") && !text.contains("sentinel-secret-1"), "{text}");

    let mut wrong_name = options(&sentinel, Some("sentinel-secret-1"));
    if let Some(s) = wrong_name.sentinel.as_mut() {
        s.master_name = "othermaster".into();
    }
    let err = RedisStore::connect("redis://othermaster", wrong_name).await.expect_err("unknown master name");
    assert!(matches!(&err, StoreError::Unavailable(text) if text.contains("othermaster")), "{err:?}");
}

#[tokio::test]
async fn a_url_that_names_a_server_is_refused_with_sentinel() {
    let primary = RedisServer::start();
    let sentinel = SentinelServer::start(&primary, SentinelConfig::default());
    let err = RedisStore::open(&primary.url(), options(&sentinel, None)).expect_err("ambiguous");
    assert!(matches!(err, StoreError::Config(_)), "{err:?}");
}
