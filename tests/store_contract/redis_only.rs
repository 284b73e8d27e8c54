//! Behaviour only a real server can show: the exact key layout, restarts, failover, deadlines
//! against dead or hung servers, renamed commands and ACL users.

use std::time::{Duration, Instant};

use rsc::store::keys;
use rsc::store::redis::{RedisStore, RedisStoreOptions};
use rsc::store::{CasStamp, MetadataStore, ReadFrom, StoreError, StreamStore, WriteOutcome};

use crate::metadata::{cas, create, group, stored};
use crate::support::{RedisServer, ServerConfig, TcpProxy};

fn options(timeout_ms: u64) -> RedisStoreOptions {
    RedisStoreOptions { timeout_ms, ..RedisStoreOptions::default() }
}

async fn store_for(url: &str) -> RedisStore {
    RedisStore::connect(url, options(2_000)).await.expect("connect")
}

/// Calls `load` until it succeeds: the first call after a restart may fail on the dead connection.
async fn load_after_reconnect(store: &RedisStore) -> Option<rsc::store::StoredRecord> {
    let mut last = None;
    for _ in 0..3 {
        match store.load(&group()).await {
            Ok(record) => return record,
            Err(err) => {
                assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
                last = Some(err);
            }
        }
    }
    panic!("the store did not reconnect: {last:?}");
}

fn text(value: redis::Value) -> String {
    redis::from_redis_value(value).expect("text reply")
}

#[tokio::test]
async fn layout_matches_keys_rs_and_metadata_has_no_ttl() {
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    let g = group();
    assert_eq!(store.write(&g, create("{}")).await, Ok(WriteOutcome::Written { revision: 1 }));
    store.touch_and_load(&g, "m1").await.expect("touch");
    assert!(store.acquire_mutex(&g, "token", 30_000).await.expect("mutex"));

    let metadata = keys::metadata_key(&g);
    assert_eq!(metadata, "redis-stream:coord:{orders:v1:billing}:metadata");
    let mut fields: Vec<String> = redis::from_redis_value(server.cmd(&["HKEYS", &metadata])).expect("HKEYS");
    fields.sort();
    // The seed's five recommended fields, plus the per-write id that makes caching safe.
    assert_eq!(fields, ["aggregate", "layoutVersion", "revision", "schemaVersion", "updatedAt", "writeId"]);
    assert_eq!(text(server.cmd(&["HGET", &metadata, "revision"])), "1");
    assert_eq!(server.cmd(&["PTTL", &metadata]), redis::Value::Int(-1), "metadata must never expire");
    assert_eq!(text(server.cmd(&["HGET", &keys::liveness_key(&g), "m1"])), "1");
    assert_eq!(text(server.cmd(&["GET", &keys::mutex_key(&g)])), "token");
    assert!(matches!(server.cmd(&["PTTL", &keys::mutex_key(&g)]), redis::Value::Int(ms) if ms > 0));
    // A successful create also indexes the group (a separate SADD: the index has no hash tag).
    let members: Vec<String> = redis::from_redis_value(server.cmd(&["SMEMBERS", keys::INDEX_KEY])).expect("set");
    assert_eq!(members, ["orders:v1:billing"]);
    // A later CAS write keeps the metadata free of a TTL too.
    assert_eq!(store.write(&g, cas(&stored(&store, &g).await, "{}")).await, Ok(WriteOutcome::Written { revision: 2 }));
    assert_eq!(server.cmd(&["PTTL", &metadata]), redis::Value::Int(-1));
}

#[tokio::test]
async fn rebuild_restores_a_lost_index() {
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    store.write(&group(), create("{}")).await.expect("create");
    server.cmd(&["DEL", keys::INDEX_KEY]);
    assert_eq!(store.index_members().await, Ok(vec![]));
    assert_eq!(store.rebuild_index().await, Ok(vec![group()]));
    assert_eq!(store.index_members().await, Ok(vec![group()]));
}

/// The ticker checks the identity every pass: on Redis 7.0+ that is one `INFO server replication`
/// (it was `INFO server` then `INFO replication`, two commands and two round trips).
#[tokio::test]
async fn an_identity_check_is_one_info_command() {
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    let expected = store.identity().await.expect("identity (connects)");
    let calls = |server: &RedisServer| -> u64 {
        let stats = server.info_field("commandstats", "cmdstat_info").unwrap_or_default();
        stats.split(',').find_map(|kv| kv.strip_prefix("calls=")?.parse().ok()).unwrap_or(0)
    };
    // Redis 6.2 takes one section per INFO: two pipelined there.
    let version = server.info_field("server", "redis_version").expect("redis_version");
    let before = calls(&server);
    let identity = store.identity().await.expect("identity");
    // The INFO of `calls` itself is counted once: before reads its own call, after adds one.
    let per_check = if version.starts_with("6.") { 2 } else { 1 };
    assert_eq!(calls(&server) - before, per_check + 1, "the identity check's INFO and the reading one ({version})");
    assert_eq!(identity, expected);
    assert_eq!((identity.run_id, identity.replication_id), (server.run_id(), server.replication_id()));
}

#[tokio::test]
async fn restart_changes_identity_keeps_persisted_data_and_the_store_reconnects() {
    let mut server = RedisServer::start_with(ServerConfig { persistence: true, ..ServerConfig::default() });
    let store = store_for(&server.url()).await;
    store.write(&group(), create("kept")).await.expect("create");
    let before = store.identity().await.expect("identity");
    assert_eq!(before.run_id, server.run_id());

    server.kill(); // SIGKILL: AOF with appendfsync always keeps the acknowledged write.
    server.start_again();

    let record = load_after_reconnect(&store).await.expect("the record survived the restart");
    assert_eq!((record.revision, record.aggregate.as_str()), (1, "kept"));
    let after = store.identity().await.expect("identity");
    assert_ne!(after.run_id, before.run_id, "a restart is visible as a new run_id");
    assert_eq!(after.run_id, server.run_id());
    // Scripts are reloaded transparently (the new process has an empty script cache).
    assert_eq!(
        store.write(&group(), cas(&record.cas_stamp(), "after")).await,
        Ok(WriteOutcome::Written { revision: 2 })
    );
}

#[tokio::test]
async fn failover_to_a_lagging_replica_loses_the_suffix_and_changes_identity() {
    let primary = RedisServer::start();
    let (replica, link) = primary.start_replica_via_proxy();
    let front = TcpProxy::start(primary.port()); // the address clients use across the failover
    let store = store_for(&front.url()).await;
    store.write(&group(), create("v1")).await.expect("create");
    primary.wait_replicated(1);
    let before = store.identity().await.expect("identity");

    link.pause();
    let v1 = stored(&store, &group()).await;
    assert_eq!(store.write(&group(), cas(&v1, "v2")).await, Ok(WriteOutcome::Written { revision: 2 }));
    let lost = stored(&store, &group()).await;
    replica.promote();
    front.set_target(replica.port());
    front.cut();

    let record = load_after_reconnect(&store).await.expect("record");
    assert_eq!(record.revision, 1, "the acknowledged but unreplicated write is lost");
    let after = store.identity().await.expect("identity");
    assert_ne!(after.replication_id, before.replication_id);
    assert_ne!(after.run_id, before.run_id);
    assert_eq!(store.write(&group(), cas(&record.cas_stamp(), "v2'")).await, Ok(WriteOutcome::Written { revision: 2 }));

    // Revision 2 exists again, as another write: anything decided on the lost one is refused.
    let rewritten = store.load(&group()).await.expect("load").expect("record");
    assert_eq!((rewritten.revision, rewritten.aggregate.as_str()), (2, "v2'"));
    let conflict = Ok(WriteOutcome::RevisionConflict { current: Some(2) });
    assert_eq!(store.write(&group(), cas(&lost, "decided on the lost v2")).await, conflict);
    assert_eq!(store.delete(&group(), &lost).await, conflict);
    assert_eq!(store.load(&group()).await, Ok(Some(rewritten)), "nothing changed");
}

/// Records written before `writeId` existed (or by hand) have no `writeId` field. They stay
/// writable: an expected empty writeId matches an absent (or empty) field at the expected revision.
/// Every write by this build adds an id, so an id-less expectation never matches a write made
/// since, and an expected id never matches an id-less record.
#[tokio::test]
async fn a_record_without_a_write_id_is_written_and_deleted_on_its_revision_alone_until_rewritten() {
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    let g = group();
    let key = keys::metadata_key(&g);
    let conflict = |revision| Ok(WriteOutcome::RevisionConflict { current: Some(revision) });
    store.write(&g, create("v1")).await.expect("create");
    let with_id = stored(&store, &g).await;
    server.cmd(&["HDEL", &key, "writeId"]); // as a pre-writeId build left it
    let legacy = stored(&store, &g).await;
    assert_eq!(legacy, CasStamp { revision: 1, write_id: String::new() });

    assert_eq!(store.write(&g, cas(&with_id, "x")).await, conflict(1), "an id never matches an absent field");
    assert_eq!(store.delete(&g, &with_id).await, conflict(1));
    assert_eq!(store.write(&g, cas(&legacy, "v2")).await, Ok(WriteOutcome::Written { revision: 2 }));
    assert_eq!(text(server.cmd(&["HGET", &key, "writeId"])), stored(&store, &g).await.write_id, "now with an id");

    // The id-less revision 2 is lost and revision 2 written again by this build (with an id): a
    // writer that loaded the id-less record is refused.
    server.cmd(&["HDEL", &key, "writeId"]);
    let lost = stored(&store, &g).await;
    server.cmd(&["HSET", &key, "writeId", "rewritten", "aggregate", "v2, another write"]);
    let rewritten = store.load(&g).await.expect("load");
    assert_eq!(store.write(&g, cas(&lost, "computed from the lost v2")).await, conflict(2));
    assert_eq!(store.delete(&g, &lost).await, conflict(2));
    assert_eq!(store.load(&g).await.expect("load"), rewritten, "nothing changed");

    // An empty writeId field reads as no writeId, and the condition treats it the same way.
    server.cmd(&["HSET", &key, "writeId", ""]);
    assert_eq!(stored(&store, &g).await, CasStamp { revision: 2, write_id: String::new() });
    assert_eq!(store.delete(&g, &lost).await, Ok(WriteOutcome::Written { revision: 0 }));
    assert_eq!(store.load(&g).await, Ok(None));
}

/// Runs `call` and checks it failed as `Unavailable` within the deadline plus some slack.
async fn assert_unavailable_within<T: std::fmt::Debug>(
    deadline_ms: u64,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) {
    let started = Instant::now();
    let result = call.await;
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(StoreError::Unavailable(_))), "{result:?}");
    assert!(elapsed < Duration::from_millis(deadline_ms + 700), "took {elapsed:?}");
}

#[tokio::test]
async fn a_killed_server_is_unavailable_within_the_timeout() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), options(500)).await.expect("connect");
    store.load(&group()).await.expect("load");
    server.kill();
    assert_unavailable_within(500, store.load(&group())).await;
    assert_unavailable_within(500, store.write(&group(), create("x"))).await;
    assert_unavailable_within(500, store.identity()).await;
    // Connecting to a dead address fails the same way.
    assert_unavailable_within(500, RedisStore::connect(&server.url(), options(500))).await;
}

#[tokio::test]
async fn a_hung_server_is_unavailable_within_the_timeout_and_recovers() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), options(500)).await.expect("connect");
    store.ensure_group("s:0", "g").await.expect("ensure");
    server.freeze();
    assert_unavailable_within(500, store.load(&group())).await;
    let streams = [("s:0".to_string(), ReadFrom::New)];
    assert_unavailable_within(800, store.xreadgroup("g", "c", &streams, 10, Some(300))).await;
    assert_unavailable_within(500, RedisStore::connect(&server.url(), options(500))).await;
    server.thaw();
    assert_eq!(load_after_reconnect(&store).await, None);
}

/// Opening the shared connection is single-flight on a task of its own, with the whole deadline.
/// It ran inside the caller holding the checkout lock, under that caller's deadline: after an
/// outage in which each attempt hung for a whole deadline, each next caller in the queue held the
/// lock with only the gap since the one before it left, so while calls came faster than a
/// connect took (here 150 ms; TLS, a Sentinel lookup past a dead sentinel), every attempt was cut
/// off and the store stayed unavailable after Redis came back, for as long as the calls came.
#[tokio::test]
async fn a_slow_connect_succeeds_after_an_outage_while_calls_keep_coming_faster_than_it() {
    const TIMEOUT_MS: u64 = 400;
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    proxy.set_connect_delay_ms(150);
    let store = std::sync::Arc::new(RedisStore::connect(&proxy.url(), options(TIMEOUT_MS)).await.expect("connect"));
    // The outage: every connection cut, new ones hang (held by the pause) for a whole deadline.
    proxy.pause();
    proxy.cut();
    let started = Instant::now();
    let healed_at = Duration::from_millis(1_500);
    let (mut calls, mut resumed) = (Vec::new(), false);
    while started.elapsed() < healed_at + Duration::from_secs(3) {
        if !resumed && started.elapsed() >= healed_at {
            proxy.resume();
            resumed = true;
        }
        let store = std::sync::Arc::clone(&store);
        let sent = started.elapsed();
        calls.push(tokio::spawn(async move { (sent, store.load(&group()).await.is_ok()) }));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut first_ok = None;
    for call in calls {
        let (sent, ok) = call.await.expect("call task");
        if ok && sent >= healed_at {
            first_ok = Some(first_ok.map_or(sent, |f: Duration| f.min(sent)));
        }
    }
    let first_ok = first_ok.expect("no call succeeded in the 3 s after Redis came back");
    assert!(first_ok < healed_at + Duration::from_millis(3 * TIMEOUT_MS), "first success at {first_ok:?}");
}

/// A store used from two runtimes, the first dropped while the store's connect task ran on it:
/// the task went with its runtime without an outcome, and every later call failed with "the
/// connection attempt was abandoned" for good, since nothing cleared the attempt.
#[test]
fn a_connect_abandoned_with_its_runtime_is_started_again_by_a_later_call() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let store = RedisStore::open(&proxy.url(), options(2_000)).expect("open");
    proxy.pause();
    let first = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    first.block_on(async {
        let cut_short = tokio::time::timeout(Duration::from_millis(100), store.load(&group())).await;
        assert!(cut_short.is_err(), "the connect hangs while the proxy is paused");
    });
    drop(first);
    proxy.resume();
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    second.block_on(async {
        let mut last = None;
        for _ in 0..3 {
            match store.load(&group()).await {
                Ok(_) => return,
                Err(error) => last = Some(error),
            }
        }
        panic!("the store never connected again: {last:?}");
    });
}

/// Hostile review: an entry another writer added with a field name that is not UTF-8 failed every
/// read of its stream (the first one after XREADGROUP had delivered it, then every re-read of the
/// pending entry), so the shard stalled for good. It is now read, the name lossily decoded.
#[tokio::test]
async fn an_entry_with_a_non_utf8_field_name_is_read_and_acked_not_a_stalled_shard() {
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    store.ensure_group("s:0", "g").await.expect("ensure");
    let client = redis::Client::open(server.url()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let raw: String = redis::cmd("XADD")
        .arg("s:0")
        .arg("*")
        .arg(&b"na\xffme"[..])
        .arg(&b"\x00\xfe"[..])
        .query_async(&mut conn)
        .await
        .expect("xadd");
    let after = store.xadd("s:0", vec![("k".into(), b"v".to_vec())], None).await.expect("xadd");
    let streams = [("s:0".to_string(), ReadFrom::New)];
    let delivered = store.xreadgroup("g", "c", &streams, 10, None).await.expect("the read succeeds");
    let entries = &delivered[0].1;
    assert_eq!(entries.len(), 2, "both entries, the odd one included");
    assert_eq!(entries[0].id.to_string(), raw);
    assert_eq!(entries[0].fields, vec![("na\u{fffd}me".to_string(), b"\x00\xfe".to_vec())], "value bytes exact");
    assert_eq!(entries[1].id, after);
    let pending = [("s:0".to_string(), ReadFrom::OwnPending)];
    let again = store.xreadgroup("g", "c", &pending, 10, None).await.expect("the pending re-read succeeds");
    assert_eq!(again[0].1.len(), 2);
    let ids: Vec<_> = again[0].1.iter().map(|entry| entry.id).collect();
    assert_eq!(store.xack("s:0", "g", &ids).await, Ok(2), "and acked");
}

#[tokio::test]
async fn a_blocking_read_waits_its_block_time_without_stalling_other_calls() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), options(300)).await.expect("connect");
    store.ensure_group("s:0", "g").await.expect("ensure");
    let reader = store.clone();
    let started = Instant::now();
    let blocked = tokio::spawn(async move {
        let streams = [("s:0".to_string(), ReadFrom::New)];
        reader.xreadgroup("g", "c", &streams, 10, Some(1_000)).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The shared connection is not behind the blocked read.
    store.load(&group()).await.expect("load during a blocking read");
    assert!(started.elapsed() < Duration::from_millis(600));
    let id = store.xadd("s:0", vec![("k".into(), b"v".to_vec())], None).await.expect("xadd");
    let delivered = blocked.await.expect("task").expect("blocking read");
    assert_eq!(delivered[0].1[0].id, id, "the blocked read wakes up with the new entry");
    // With nothing to read it returns empty after its block time, not a timeout.
    let streams = [("s:0".to_string(), ReadFrom::New)];
    let started = Instant::now();
    assert_eq!(store.xreadgroup("g", "c", &streams, 10, Some(500)).await, Ok(vec![]));
    assert!(started.elapsed() >= Duration::from_millis(450));
}

/// A server whose `maxmemory-policy` evicts keys without a TTL fails the probe: an evicted fence
/// key accepts any fence, so a previous owner's late read or ack would run at Redis beside the
/// current owner. `volatile-*` policies (the coordinator's TTL keys are mutexes, relays and
/// gates, all re-created when needed) and `noeviction` pass.
#[tokio::test]
async fn an_evicting_maxmemory_policy_fails_the_probe() {
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
        server.cmd(&["CONFIG", "SET", "maxmemory-policy", policy]);
        match store.probe().await {
            Err(StoreError::Unsupported { command, detail }) => {
                assert_eq!(command, "maxmemory-policy");
                assert!(detail.contains(policy), "{detail}");
            }
            other => panic!("{policy}: the probe must refuse it, got {other:?}"),
        }
    }
    for policy in ["volatile-lru", "noeviction"] {
        server.cmd(&["CONFIG", "SET", "maxmemory-policy", policy]);
        store.probe().await.unwrap_or_else(|e| panic!("{policy}: {e}"));
    }
}

/// A replica fails the probe, a writable one (`replica-read-only no`) too: the coordinator's
/// writes there are invisible to consumers of the primary and lost at the next resync.
#[tokio::test]
async fn a_replica_fails_the_probe_even_a_writable_one() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(ServerConfig {
        replica_of: Some(primary.port()),
        extra_args: vec!["--replica-read-only".into(), "no".into()],
        ..ServerConfig::default()
    });
    let store = store_for(&replica.url()).await;
    match store.probe().await {
        Err(StoreError::Unsupported { command, detail }) => {
            assert_eq!(command, "role");
            assert!(detail.contains("slave") || detail.contains("replica"), "{detail}");
        }
        other => panic!("the probe must refuse a replica, got {other:?}"),
    }
    store_for(&primary.url()).await.probe().await.expect("the primary passes");
}

#[tokio::test]
async fn an_acl_denied_command_fails_the_probe_naming_it() {
    let server = RedisServer::start();
    server.cmd(&["ACL", "SETUSER", "coord", "on", ">pw", "~*", "&*", "+@all", "-hincrby"]);
    let store = store_for(&format!("redis://coord:pw@127.0.0.1:{}", server.port())).await;
    match store.probe().await {
        Err(StoreError::Unsupported { command, .. }) => assert_eq!(command, "HINCRBY"),
        other => panic!("probe must fail naming HINCRBY, got {other:?}"),
    }
    // The probe cleaned up after itself even though it failed.
    let left: Vec<String> = redis::from_redis_value(server.cmd(&["KEYS", "*"])).expect("keys");
    assert_eq!(left, Vec::<String>::new());
    // The same denial inside a script is still Unsupported (the script increments only for an
    // existing group, so create one first).
    let key = rsc::store::keys::metadata_key(&group());
    server.cmd(&[
        "HSET",
        &key,
        "aggregate",
        "{}",
        "revision",
        "1",
        "schemaVersion",
        "1",
        "layoutVersion",
        "1",
        "updatedAt",
        "0",
    ]);
    assert!(matches!(store.touch_and_load(&group(), "m").await, Err(StoreError::Unsupported { .. })));
}

#[tokio::test]
async fn a_least_privilege_user_runs_everything_and_cannot_flush() {
    let server = RedisServer::start();
    let url = server.create_acl_user("coordinator", "s3cret");
    let store = store_for(&url).await;
    store.probe().await.expect("probe as the least-privilege user");
    assert!(store.write(&group(), create("{}")).await.is_ok());
    let user = redis::Client::open(url.as_str()).expect("client");
    let mut conn = user.get_connection().expect("connect as the user");
    let denied: redis::RedisResult<()> = redis::cmd("FLUSHALL").query(&mut conn);
    assert_eq!(denied.map_err(|e| e.code().map(str::to_string)), Err(Some("NOPERM".to_string())));
    let denied: redis::RedisResult<()> = redis::cmd("FLUSHDB").query(&mut conn);
    assert!(denied.is_err());
}

#[tokio::test]
async fn wrong_credentials_are_unavailable_and_never_echo_the_password() {
    let server = RedisServer::start();
    server.create_acl_user("coordinator", "right");
    let url = format!("redis://coordinator:Wr0ngPassw0rd@127.0.0.1:{}", server.port());
    let err = RedisStore::connect(&url, options(1_000)).await.expect_err("bad password");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("Wr0ngPassw0rd"), "{err:?}");
    let store = RedisStore::open(&url, options(1_000)).expect("open");
    assert!(!format!("{store:?}").contains("Wr0ngPassw0rd"));
}

/// The harness's replication-link proxy: a paused link holds writes back, a resumed one delivers
/// them (what failover tests in other suites rely on).
#[tokio::test]
async fn harness_replication_link_pauses_and_resumes() {
    let primary = RedisServer::start();
    let (replica, link) = primary.start_replica_via_proxy();
    primary.cmd(&["SET", "k", "1"]);
    primary.wait_replicated(1);
    assert_eq!(replica_value_eventually(&replica, "k", "1").await.as_deref(), Some("1"));
    link.pause();
    primary.cmd(&["SET", "k", "2"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(text(replica.cmd(&["GET", "k"])), "1", "nothing passes a paused link");
    link.resume();
    primary.wait_replicated(1);
    assert_eq!(replica_value_eventually(&replica, "k", "2").await.as_deref(), Some("2"));
}

/// GETs `key` on the replica until it reads `want` (or 5 s pass) and returns the last value read.
/// WAIT's acknowledgement and the replica serving the value are close but not one instant (this
/// test once read nil right after WAIT under the full suite's load).
async fn replica_value_eventually(replica: &RedisServer, key: &str, want: &str) -> Option<String> {
    let mut last = None;
    for _ in 0..250 {
        last = redis::from_redis_value::<Option<String>>(replica.cmd(&["GET", key])).ok().flatten();
        if last.as_deref() == Some(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last
}

/// Fence gates (DESIGN §10): after every raise and every heal exactly one gate exists for a fence
/// key, that of the value the key holds, so a plain XREADGROUP naming a gate never passes for
/// another value; a gate that is gone (deleted by hand) is reopened by the fallback read.
#[tokio::test]
async fn exactly_the_fence_value_the_key_holds_has_a_gate() {
    use rsc::core::model::Fence;
    use rsc::store::{FenceCheck, FenceRaise};
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    let key = keys::fence_key(&group(), 0);
    let stream = group().stream_key(0);
    store.ensure_group(&stream, "billing").await.expect("group");
    for i in 0..4 {
        store.xadd(&stream, vec![("k".into(), format!("{i}").into_bytes())], None).await.expect("xadd");
    }
    let gate = |f: Fence| format!("{key}:gate:{}.{:016x}", f.counter, f.nonce);
    let gates = || {
        let mut found: Vec<String> =
            redis::from_redis_value(server.cmd(&["KEYS", &format!("{key}:gate:*")])).expect("KEYS");
        found.sort();
        found
    };
    let raise = |nonce| {
        let raises = vec![FenceRaise { key: key.clone(), nonce, floor: 0 }];
        let store = store.clone();
        async move { store.raise_fences(&raises).await }
    };
    let check = |fence| FenceCheck { key: key.clone(), fence };
    let f1 = raise(0x11).await.expect("raise")[0];
    assert_eq!(gates(), [gate(f1)]);
    let f2 = raise(0x22).await.expect("raise")[0];
    assert_eq!(gates(), [gate(f2)], "a raise closes the old value's gate");
    // A plain read naming the old gate, as a stale consumer would send it, moves nothing.
    let stale = server.try_cmd(&["XREADGROUP", "GROUP", "billing", "c9", "STREAMS", &gate(f1), &stream, ">", ">"]);
    assert!(format!("{stale:?}").contains("NOGROUP"), "{stale:?}");
    let healed = Fence { counter: 9, nonce: 0x99 };
    let read = store.fenced_xreadgroup(&check(healed), "billing", "c1", &stream, ReadFrom::New, 1).await;
    assert_eq!(read.map(|e| e.len()), Ok(1));
    assert_eq!(gates(), [gate(healed)], "a heal by a read moves the gate");
    let acked = Fence { counter: 12, nonce: 0xcc };
    store.fenced_xack(&check(acked), &stream, "billing", &[]).await.expect("heal by an ack");
    assert_eq!(gates(), [gate(acked)], "a heal by an ack moves the gate");
    let refused = store.fenced_xreadgroup(&check(f2), "billing", "c2", &stream, ReadFrom::New, 1).await;
    assert!(matches!(refused, Err(StoreError::Fenced { .. })), "{refused:?}");
    assert_eq!(gates(), [gate(acked)], "a refusal touches no gate");
    server.cmd(&["DEL", &gate(acked)]);
    let read = store.fenced_xreadgroup(&check(acked), "billing", "c1", &stream, ReadFrom::New, 1).await;
    assert_eq!(read.map(|e| e.len()), Ok(1), "a missing gate falls back to the script");
    assert_eq!(gates(), [gate(acked)], "and the script reopened it");
    let read = store.fenced_xreadgroup(&check(acked), "billing", "c1", &stream, ReadFrom::New, 5).await;
    assert_eq!(read.map(|e| e.len()), Ok(2), "the gated read delivers the rest");
}

/// A fence key whose counter is not a number (a hand edit, an application's `HSET`) is raised to
/// the floor like a key without one. Before, `HINCRBY` on it failed the raise, and with it the
/// batch of every grant of the group's next write: every write of the group failed until the key
/// was repaired by hand. The other keys of the batch are raised as usual.
#[tokio::test]
async fn a_fence_counter_that_is_not_a_number_is_raised_to_the_floor() {
    use rsc::core::model::Fence;
    use rsc::store::FenceRaise;
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    let g = group();
    let (bad, good) = (keys::fence_key(&g, 0), keys::fence_key(&g, 1));
    let raise = |key: &str, nonce| FenceRaise { key: key.to_string(), nonce, floor: 1_764_000_000_000 };
    store.raise_fences(&[raise(&bad, 1), raise(&good, 2)]).await.expect("first raises");
    server.cmd(&["HSET", &bad, "counter", "not-a-number"]);
    let raised = store.raise_fences(&[raise(&bad, 3), raise(&good, 4)]).await.expect("the batch is raised");
    assert_eq!(
        raised,
        vec![Fence { counter: 1_764_000_000_000, nonce: 3 }, Fence { counter: 1_764_000_000_001, nonce: 4 }]
    );
    assert_eq!(text(server.cmd(&["HGET", &bad, "counter"])), "1764000000000");
    // `0`, which a client's check installs on a key without a counter, is no counter either:
    // counted up, it restarted the key at 1, below the floor.
    server.cmd(&["HSET", &bad, "counter", "0"]);
    let raised = store.raise_fences(&[raise(&bad, 5)]).await.expect("raised");
    assert_eq!(raised, vec![Fence { counter: 1_764_000_000_000, nonce: 5 }]);
}

/// The doorbell resolves the last-delivered ids of the streams it does not know in pipelines of
/// 1,024, each under its own deadline (20 here, the last one partial): one `XINFO GROUPS` per
/// stream, one after another under one deadline, always timed out past a few thousand shards (a
/// scale review), so the doorbell of a large consumer never worked and each attempt dropped the
/// shared connection. Judged by the server's count of reads from its clients, not by time: one
/// after another is a read per command (20,000), a pipeline a few.
#[tokio::test]
async fn the_doorbell_resolves_twenty_thousand_unknown_streams_in_a_round_trip_per_1024() {
    let server = RedisServer::start();
    let store = store_for(&server.url()).await;
    let fields = || vec![("f".to_string(), b"v".to_vec())];
    let delivered_stream = "scale:0".to_string();
    let first = store.xadd(&delivered_stream, fields(), None).await.expect("xadd");
    store.ensure_group(&delivered_stream, "g").await.expect("group");
    let read = store.xreadgroup("g", "c", &[(delivered_stream.clone(), ReadFrom::New)], 10, None).await;
    assert_eq!(read.expect("read").len(), 1);
    // Shard 0 delivered up to `first`; the 19,999 others do not exist yet.
    let streams: Vec<(String, Option<rsc::store::EntryId>)> =
        (0..20_000).map(|i| (format!("scale:{i}"), None)).collect();
    let reads_before = reads_processed(&server);
    let bell = store.wait_for_entries("g", &streams, 10).await.expect("resolved");
    let reads = reads_processed(&server) - reads_before;
    assert!(reads < 2_000, "{reads} reads from clients for 20,000 XINFO GROUPS and one XREAD");
    assert!(!bell.rang);
    assert_eq!(bell.after.len(), 20_000);
    assert_eq!(bell.after[0], first);
    assert!(bell.after[1..].iter().all(|id| *id == rsc::store::EntryId { ms: 0, seq: 0 }));
    // A key of another type is still that stream's error, not an id: the server's own refusal.
    server.cmd(&["SET", "scale:7", "not a stream"]);
    let refused = store.wait_for_entries("g", &streams[..10], 10).await;
    assert!(matches!(&refused, Err(StoreError::Layout(text)) if text.contains("WRONGTYPE")), "{refused:?}");
}

/// The server's `total_reads_processed` (INFO stats): reads from client connections so far.
pub(crate) fn reads_processed(server: &RedisServer) -> u64 {
    let info = text(server.cmd(&["INFO", "stats"]));
    let line = info.lines().find_map(|line| line.strip_prefix("total_reads_processed:"));
    line.and_then(|n| n.trim().parse().ok()).expect("INFO stats has total_reads_processed")
}

/// The first grant of a 65,536-shard group raises every shard's fence at once: sent as one
/// pipeline under one store deadline, it could not finish within it (each raise creates the new
/// value's gate stream), so the group's first grant failed at every retry, each raising all of
/// them again (a scale review). Sent in bounded pipelines, each under its own deadline. One raise
/// more than 64 full pipelines, so the last pipeline holds one.
#[tokio::test]
async fn the_fences_of_a_65536_shard_grant_are_raised_within_the_store_deadline() {
    let server = RedisServer::start();
    // A deadline below what all 65,536 take (about 1 s here), far above what 1,024 take.
    let store = RedisStore::connect(&server.url(), options(400)).await.expect("connect");
    // The fence keys of a group named as consumers name them, one per shard.
    let group = rsc::core::model::GroupId::new("scale", "group");
    let raises: Vec<rsc::store::FenceRaise> = (0..65_537)
        .map(|shard| rsc::store::FenceRaise { key: keys::fence_key(&group, shard), nonce: u64::from(shard), floor: 0 })
        .collect();
    let started = Instant::now();
    let fences = store.raise_fences(&raises).await.expect("raised within the deadline");
    eprintln!("65,537 raises took {:?}", started.elapsed());
    assert_eq!(fences.len(), 65_537);
    assert!(fences.iter().enumerate().all(|(shard, fence)| fence.counter == 1 && fence.nonce == shard as u64));
    // Raised again: every key counts up by one, in order.
    let again = store.raise_fences(&raises[..3]).await.expect("raised again");
    assert!(again.iter().all(|fence| fence.counter == 2), "{again:?}");
}
