//! `RedisStore` on a TLS-only Redis Cluster (`RedisCluster::start_tls`: `port 0`, a TLS port per
//! node, TLS on the cluster bus and the replication links, one CA made by `openssl` at test time).
//! The contract suite runs there too (module `redis_tls_cluster_store`, mutual TLS); this file
//! holds what the suite cannot show: replicas behind optional client certificates, refusal of a
//! store without a client certificate or with an untrusted CA, and the typed errors of Cluster TLS
//! settings.

use std::time::{Duration, Instant};

use rsc::store::redis::{RedisStore, RedisStoreOptions, RedisTlsOptions};
use rsc::store::{MetadataStore, ReadFrom, StoreError, StreamStore};

use crate::support::redis_cluster::RedisCluster;
use crate::support::redis_server::TlsClientAuth;
use crate::support::tls as certs;

/// The deadline of one round trip in these tests; a refused connection must fail within it.
const TIMEOUT_MS: u64 = 1_500;

fn options(tls: RedisTlsOptions) -> RedisStoreOptions {
    RedisStoreOptions { timeout_ms: TIMEOUT_MS, tls, ..RedisStoreOptions::default() }
}

/// Trusts the cluster's CA; no client certificate.
fn trusting_ca(cluster: &RedisCluster) -> RedisTlsOptions {
    let files = cluster.tls_files().expect("a TLS cluster");
    RedisTlsOptions { ca_file: Some(files.ca_cert.clone()), ..RedisTlsOptions::default() }
}

/// Trusts the cluster's CA and presents the client certificate it signed (the contract suite's
/// store on a TLS cluster).
pub fn mutual_tls_options(cluster: &RedisCluster) -> RedisStoreOptions {
    let files = cluster.tls_files().expect("a TLS cluster");
    let tls = RedisTlsOptions {
        client_cert_file: Some(files.client_cert.clone()),
        client_key_file: Some(files.client_key.clone()),
        ..trusting_ca(cluster)
    };
    RedisStoreOptions { tls, ..RedisStoreOptions::default() }
}

/// `connect_cluster` must fail fast with a typed transport error (never hang, never panic).
async fn refused(nodes: &[String], tls: RedisTlsOptions) -> String {
    let started = Instant::now();
    let result = RedisStore::connect_cluster(nodes, options(tls)).await;
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(TIMEOUT_MS + 1_000), "refused only after {elapsed:?}");
    match result {
        Err(StoreError::Unavailable(text)) => text,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_tls_cluster_with_replicas_serves_a_store_that_trusts_its_ca() {
    // Replicas sync over TLS (the harness waits for every link); clients may omit a certificate.
    let cluster = RedisCluster::start_tls(3, 1, TlsClientAuth::Optional);
    let nodes = cluster.nodes();
    assert!(nodes.iter().all(|n| n.starts_with("rediss://127.0.0.1:")), "{nodes:?}");
    // The nodes speak TLS only: plain seeds on the same ports get nowhere.
    let plain: Vec<String> = nodes.iter().map(|n| n.replacen("rediss://", "redis://", 1)).collect();
    refused(&plain, RedisTlsOptions::default()).await;

    let store = RedisStore::connect_cluster(&nodes, options(trusting_ca(&cluster))).await.expect("connect over TLS");
    // The identity asks every primary by the address CLUSTER SLOTS announces (its TLS port).
    let identity = store.identity().await.expect("identity");
    for primary in cluster.primaries() {
        assert!(identity.run_id.contains(&format!("127.0.0.1:{}/", primary.port())), "{identity:?}");
    }
    // Streams on all three primaries; each blocking read runs on a dedicated TLS connection and is
    // woken by an entry added while it waits.
    let mut owners = std::collections::BTreeSet::new();
    let streams: Vec<String> = (0..)
        .map(|i| format!("{{tls-cluster-{i}}}:0"))
        .filter(|s| owners.insert(cluster.node_for_key(s).port()))
        .take(3)
        .collect();
    for stream in &streams {
        store.ensure_group(stream, "g").await.expect("ensure");
        let writer = store.clone();
        let key = stream.clone();
        let add = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            writer.xadd(&key, vec![("k".into(), b"v".to_vec())], None).await
        });
        let started = Instant::now();
        let read = [(stream.clone(), ReadFrom::New)];
        let got = store.xreadgroup("g", "c", &read, 10, Some(5_000)).await.expect("blocking read");
        let added = add.await.expect("task").expect("xadd");
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].1.iter().map(|e| e.id).collect::<Vec<_>>(), vec![added]);
        assert!(started.elapsed() < Duration::from_secs(4), "the read was woken, not timed out");
    }
}

#[tokio::test]
async fn a_mutual_tls_cluster_refuses_a_store_without_a_client_certificate_or_with_an_untrusted_ca() {
    let cluster = RedisCluster::start_tls(3, 0, TlsClientAuth::Yes);
    let nodes = cluster.nodes();
    let text = refused(&nodes, trusting_ca(&cluster)).await;
    eprintln!("without a client certificate: {text}");
    let dir = cluster.tls_files().expect("TLS").ca_cert.parent().expect("a directory").join("foreign");
    let foreign = certs::generate(&dir);
    let untrusted = RedisTlsOptions {
        ca_file: Some(foreign.ca_cert),
        client_cert_file: Some(foreign.client_cert),
        client_key_file: Some(foreign.client_key),
    };
    let text = refused(&nodes, untrusted).await;
    eprintln!("with a foreign CA: {text}");
    assert!(text.contains("certificate"), "the error says why: {text}");

    let store = RedisStore::connect_cluster(&nodes, mutual_tls_options(&cluster)).await.expect("mutual TLS");
    assert!(store.identity().await.is_ok());
}

/// `open_cluster` does no network I/O; these fail before any connection.
fn open_error(nodes: &[&str], tls: RedisTlsOptions) -> StoreError {
    let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    match RedisStore::open_cluster(&nodes, options(tls)) {
        Ok(_) => panic!("{nodes:?}: expected an error"),
        Err(error) => error,
    }
}

#[tokio::test]
async fn bad_cluster_tls_settings_are_typed_errors() {
    let dir = std::env::temp_dir().join(format!("rsc-tls-cluster-files-{}", std::process::id()));
    let files = certs::generate(&dir);
    let ca = RedisTlsOptions { ca_file: Some(files.ca_cert.clone()), ..RedisTlsOptions::default() };

    // Mixed schemes: the crate speaks one way to every node, so which seeds are which is named.
    let mixed = ["rediss://app:open-sesame@127.0.0.1:7001", "redis://app:open-sesame@127.0.0.1:7002"];
    for tls in [RedisTlsOptions::default(), ca.clone()] {
        let error = open_error(&mixed, tls);
        let text = error.to_string();
        assert!(matches!(&error, StoreError::Config(t) if t.contains("mix")), "{error:?}");
        assert!(text.contains("rediss:// seeds #1; redis:// seeds #2"), "{text}");
        assert!(!text.contains("open-sesame"), "no password: {text}");
    }
    // TLS files with plain seeds: refused rather than silently connecting without TLS.
    let plain = open_error(&["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"], ca.clone());
    assert!(matches!(&plain, StoreError::Config(t) if t.contains("not rediss://")), "{plain:?}");
    // Turning verification off is not compiled in.
    let insecure = open_error(&["rediss://127.0.0.1:7001/#insecure"], RedisTlsOptions::default());
    assert!(
        matches!(&insecure, StoreError::Unsupported { command, .. } if command.contains("#insecure")),
        "{insecure:?}"
    );
    // The files are read and checked as on one server.
    let missing = dir.join("missing.pem");
    let error = open_error(&["rediss://127.0.0.1:7001"], RedisTlsOptions { ca_file: Some(missing.clone()), ..ca });
    assert!(
        matches!(&error, StoreError::Config(t) if t.contains(&missing.display().to_string())),
        "names the file: {error:?}"
    );
    // Valid files and rediss:// seeds open fine (no I/O yet).
    let tls = RedisTlsOptions {
        client_cert_file: Some(files.client_cert.clone()),
        client_key_file: Some(files.client_key.clone()),
        ca_file: Some(files.ca_cert.clone()),
    };
    RedisStore::open_cluster(&["rediss://127.0.0.1:7001".into(), "REDISS://127.0.0.1:7002".into()], options(tls))
        .expect("valid files and rediss:// seeds");
    let _ = std::fs::remove_dir_all(&dir);
}
