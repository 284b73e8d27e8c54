//! Story 4: least privilege. The coordinator and its clients run under ACL users without FLUSHDB /
//! FLUSHALL — among them the two users the README documents, read from its text — the README's
//! application user of one stream prefix is refused the streams and fence keys of a prefix that
//! extends it and of another consumer group, and a server with a command renamed away makes
//! `coordinator serve` fail fast.

use std::time::Duration;

use crate::cluster::asking_calls;
use crate::e2e_support::checks::shares_all;
use crate::e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::{cluster_target, serve_expecting_exit, CoordinatorProcess};
use crate::e2e_support::{fast_config, group, wait_until};
use crate::support::{RedisServer, ServerConfig};
use rsc::core::fence::Fence;
use rsc::core::GroupId;
use rsc::store::keys::fence_key;
use rsc::store::redis::{RedisStore, RedisStoreOptions};
use rsc::store::{EntryId, FenceCheck, FenceRaise, FencedAck, MetadataStore, ReadFrom, StoreError, StreamStore};

/// Every command the coordinator's startup probe checks, plus COMMAND (the probe's own): what a
/// least-privilege user of the coordinator and its clients is granted, and nothing else.
const PROBED_COMMANDS: &[&str] = &[
    "ping",
    "info",
    "hget",
    "hmget",
    "hset",
    "hdel",
    "hincrby",
    "hgetall",
    "exists",
    "pexpire",
    "del",
    "get",
    "set",
    "sadd",
    "srem",
    "smembers",
    "scan",
    "evalsha",
    "script",
    "xadd",
    "xgroup",
    "xreadgroup",
    "xack",
    "xautoclaim",
    "xread",
    "xinfo",
    "multi",
    "exec",
    "watch",
    "command",
];

/// Which ACL user [`acl_story`] runs under.
#[derive(Clone, Copy, Debug)]
enum AclUser {
    /// The harness's user: every command but FLUSHDB and FLUSHALL (the seed's advice).
    AllButFlush,
    /// Only [`PROBED_COMMANDS`]: proves the probe's list is complete for the coordinator and the
    /// clients (a command missing from it would pass the probe and fail in production).
    ProbedCommandsOnly,
    /// The two users the README documents, taken from its text: `rsc-coordinator` for the
    /// coordinator, `rsc-client` (its shard streams and its consumer group's fence keys only) for
    /// the consumers and the producer, with fencing on.
    Documented,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acl_user_without_flush_commands_runs_the_whole_flow_and_nothing_is_denied() {
    acl_story(AclUser::AllButFlush).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acl_user_with_only_the_probed_commands_runs_the_whole_flow_and_nothing_is_denied() {
    acl_story(AclUser::ProbedCommandsOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_users_run_the_whole_fenced_flow_and_nothing_is_denied() {
    acl_story(AclUser::Documented).await;
}

/// The README's application user is exact (review F4): stream prefixes may contain ':', so a
/// `~orders:*` would also grant the prefix `orders:eu` — another tenant's streams, and through the
/// fenced scripts (they HSET a fence presented with a larger counter) its fence keys, keeping its
/// owners FENCED. Two applications, on `orders` and `orders:eu`, each under its own README user:
/// each works on its own shard, and the `orders` user is refused `orders:eu`'s streams and fence
/// keys, as raw commands and through the fenced scripts, and the fence keys of group `audit` on
/// its own streams; nothing it tried reads, acks or moves a fence. What the README says Redis
/// cannot separate holds too: that user can read as group `audit` on its own streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_user_of_a_prefix_is_refused_the_streams_and_fences_of_a_prefix_extending_it_and_of_other_groups() {
    const STALE_COUNTER: u64 = 1_000;
    let redis = RedisServer::start();
    let password = "e2e-acl-secret";
    let orders = GroupId::new("orders", "billing");
    let orders_eu = GroupId::new("orders:eu", "billing");
    let audit = GroupId::new("orders", "audit");
    let readme = readme_text();
    apply_readme_users(&redis, &readme, password, &orders, "app-orders");
    apply_readme_users(&redis, &readme, password, &orders_eu, "app-orders-eu");
    let user_url = |name: &str| format!("redis://{name}:{password}@127.0.0.1:{}", redis.port());
    let connect =
        |url: String| async move { RedisStore::connect(&url, RedisStoreOptions::default()).await.expect("connect") };

    // Arrange, as the administrator: shard 0 of each group holds an entry, its consumer group and
    // a fence raised by the coordinator's own script (which also opens the fence's gate).
    let admin = connect(redis.url()).await;
    let mut fences = Vec::new();
    for group in [&orders, &orders_eu, &audit] {
        let stream = group.stream_key(0);
        admin.ensure_group(&stream, &group.consumer_group).await.expect("XGROUP CREATE");
        let raise = FenceRaise { key: fence_key(group, 0), nonce: 7, floor: 100 };
        let fence = admin.raise_fences(&[raise]).await.expect("raise")[0];
        fences.push(FenceCheck { key: fence_key(group, 0), fence });
    }
    let [orders_fence, eu_fence, audit_fence] = <[FenceCheck; 3]>::try_from(fences).expect("three fences");
    let xadd = |stream: String| {
        let admin = admin.clone();
        async move { admin.xadd(&stream, vec![("n".into(), b"1".to_vec())], None).await.expect("XADD") }
    };
    let (orders_stream, eu_stream) = (orders.stream_key(0), orders_eu.stream_key(0));
    xadd(orders_stream.clone()).await;
    xadd(eu_stream.clone()).await;
    redis.cmd(&["ACL", "LOG", "RESET"]);

    // Each application reads and acks its own shard under its fence, through the gate and the
    // scripts: the users grant what the fenced flow needs.
    let orders_app = connect(user_url("app-orders")).await;
    let eu_app = connect(user_url("app-orders-eu")).await;
    for (app, check, stream) in [(&orders_app, &orders_fence, &orders_stream), (&eu_app, &eu_fence, &eu_stream)] {
        let read = app.fenced_xreadgroup(check, "billing", "c", stream, ReadFrom::New, 10).await.expect("own read");
        assert_eq!(read.len(), 1, "{stream}: the entry is read");
        let acked = app.fenced_xack(check, stream, "billing", &[read[0].id]).await.expect("own ack");
        assert_eq!(acked, 1, "{stream}: the entry is acked");
        let claimed = app.fenced_claim_all_pending(check, stream, "billing", "c", 0).await.expect("own claim");
        assert_eq!(claimed, vec![], "{stream}: nothing is pending");
    }
    // Batched acks: the first through the script (it leaves the fence watched), the next by a
    // transaction (the README user may run MULTI, EXEC and WATCH).
    let exec_before = exec_calls(&redis);
    for (app, check, stream) in [(&orders_app, &orders_fence, &orders_stream), (&eu_app, &eu_fence, &eu_stream)] {
        let two = [xadd(stream.clone()).await, xadd(stream.clone()).await];
        let read = app.fenced_xreadgroup(check, "billing", "c", stream, ReadFrom::New, 10).await.expect("own read");
        assert_eq!(read.iter().map(|e| e.id).collect::<Vec<_>>(), two, "{stream}: both entries are read");
        for id in two {
            let ack = FencedAck { fence: check.clone(), stream: stream.clone(), ids: vec![id] };
            let acked = app.fenced_xack_many("billing", &[ack]).await.expect("own batched ack");
            assert_eq!(acked, vec![Ok(1)], "{stream}: the entry is acked");
        }
    }
    assert_eq!(exec_calls(&redis) - exec_before, 2, "each application's second batched ack was a transaction");
    assert_eq!(redis.cmd(&["ACL", "LOG"]), redis::Value::Array(vec![]), "nothing of the own flows was denied");

    // Act: the `orders` user tries `orders:eu`'s shard 0 and group `audit`'s fence, presenting a
    // larger counter than the fence holds (which the scripts would install), with a fresh entry
    // to read on `orders:eu:0`.
    let waiting = xadd(eu_stream.clone()).await;
    let stale =
        |check: &FenceCheck| FenceCheck { key: check.key.clone(), fence: Fence { counter: STALE_COUNTER, nonce: 1 } };
    let mut outcomes: Vec<(String, Result<(), String>)> = Vec::new();
    let nopermed = |what: &str, result: Result<String, StoreError>| {
        let outcome = match result {
            Err(StoreError::Unsupported { detail, .. }) if detail.starts_with("NOPERM") => Ok(()),
            other => Err(format!("{other:?}")),
        };
        (what.to_string(), outcome)
    };
    let (eu_stale, audit_stale) = (stale(&eu_fence), stale(&audit_fence));
    let debug = |r: Result<Vec<rsc::store::StreamEntry>, StoreError>| r.map(|e| format!("{e:?}"));
    // Through the fenced scripts first, as a client library would (the gated read of new entries
    // included), then as raw commands.
    for from in [ReadFrom::New, ReadFrom::OwnPending] {
        let read = orders_app.fenced_xreadgroup(&eu_stale, "billing", "c", &eu_stream, from, 10).await;
        outcomes.push(nopermed(&format!("fenced read {from:?} of {eu_stream}"), debug(read)));
        let read = orders_app.fenced_xreadgroup(&audit_stale, "audit", "c", &orders_stream, from, 10).await;
        outcomes.push(nopermed(&format!("fenced read {from:?} of {orders_stream} as audit"), debug(read)));
    }
    let ack = orders_app.fenced_xack(&eu_stale, &eu_stream, "billing", &[waiting]).await;
    outcomes.push(nopermed(&format!("fenced ack on {eu_stream}"), ack.map(|n| n.to_string())));
    let batched = FencedAck { fence: eu_stale.clone(), stream: eu_stream.clone(), ids: vec![waiting] };
    for _ in 0..2 {
        // Twice: the first refusal must not leave the fence watched for a transaction.
        let ack = orders_app.fenced_xack_many("billing", std::slice::from_ref(&batched)).await;
        let ack = ack.and_then(|mut results| results.pop().unwrap_or(Ok(0)));
        outcomes.push(nopermed(&format!("batched fenced ack on {eu_stream}"), ack.map(|n| n.to_string())));
    }
    let ack = orders_app.fenced_xack(&audit_stale, &orders_stream, "audit", &[]).await;
    outcomes.push(nopermed(&format!("fenced ack on {orders_stream} as audit"), ack.map(|n| n.to_string())));
    let claim = orders_app.fenced_claim_all_pending(&eu_stale, &eu_stream, "billing", "c", 0).await;
    outcomes.push(nopermed(&format!("fenced claim on {eu_stream}"), debug(claim)));
    let claim = orders_app.fenced_claim_all_pending(&audit_stale, &orders_stream, "audit", "c", 0).await;
    outcomes.push(nopermed(&format!("fenced claim on {orders_stream} as audit"), debug(claim)));

    let raw = redis::Client::open(user_url("app-orders")).expect("URL");
    let mut raw = raw.get_connection_with_timeout(Duration::from_secs(2)).expect("app-orders connects");
    let commands: Vec<Vec<String>> = [
        vec!["XREADGROUP", "GROUP", "billing", "c", "COUNT", "10", "STREAMS", &eu_stream, ">"],
        vec!["XREADGROUP", "GROUP", "billing", "c", "COUNT", "10", "STREAMS", &eu_stream, "0"],
        vec!["XACK", &eu_stream, "billing", &waiting.to_string()],
        vec!["XAUTOCLAIM", &eu_stream, "billing", "c", "0", "0-0"],
        vec!["XADD", &eu_stream, "*", "n", "forged"],
        vec!["HSET", &eu_fence.key, "counter", &STALE_COUNTER.to_string()],
        vec!["HSET", &audit_fence.key, "counter", &STALE_COUNTER.to_string()],
        vec!["HMGET", &audit_fence.key, "counter", "nonce"],
    ]
    .into_iter()
    .map(|args| args.into_iter().map(String::from).collect())
    .collect();
    for args in commands {
        let result = redis::cmd(&args[0]).arg(&args[1..]).query::<redis::Value>(&mut raw);
        let outcome = match result {
            Err(e) if e.code() == Some("NOPERM") => Ok(()),
            other => Err(format!("{other:?}")),
        };
        outcomes.push((args.join(" "), outcome));
    }

    // Assert: every attempt was refused by the ACL, ...
    let allowed: Vec<_> = outcomes.iter().filter(|(_, outcome)| outcome.is_err()).collect();
    assert!(allowed.is_empty(), "the `orders` user was not refused:\n{allowed:#?}");
    // ... no fence moved ...
    let keys = [orders_fence.key.clone(), eu_fence.key.clone(), audit_fence.key.clone()];
    let held = admin.read_fences(&keys).await.expect("read fences");
    assert_eq!(held, vec![Some(orders_fence.fence), Some(eu_fence.fence), Some(audit_fence.fence)]);
    // ... and the waiting entry is still `orders:eu`'s to read, under its unchanged fence.
    let read = eu_app.fenced_xreadgroup(&eu_fence, "billing", "c", &eu_stream, ReadFrom::New, 10).await;
    let ids: Vec<EntryId> = read.expect("orders:eu still reads").iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![waiting], "the entry waiting on {eu_stream} was delivered to nobody else");
    // The `orders:eu` user, for its part, is refused `orders`'s streams.
    let eu_raw = redis::Client::open(user_url("app-orders-eu")).expect("URL");
    let mut eu_raw = eu_raw.get_connection_with_timeout(Duration::from_secs(2)).expect("app-orders-eu connects");
    let denied = redis::cmd("XREADGROUP")
        .arg(&["GROUP", "billing", "c", "STREAMS", &orders_stream, ">"])
        .query::<redis::Value>(&mut eu_raw)
        .unwrap_err();
    assert_eq!(denied.code(), Some("NOPERM"), "{denied}");
    // What Redis cannot separate (README): stream commands are not scoped per consumer group, so
    // the `billing` application may read as group `audit` on its own prefix's streams.
    let foreign = redis::cmd("XREADGROUP")
        .arg(&["GROUP", "audit", "c", "COUNT", "10", "STREAMS", &orders_stream, ">"])
        .query::<redis::Value>(&mut raw);
    assert!(foreign.is_ok(), "groups on one prefix share its streams: {foreign:?}");
    eprintln!("README users of `orders` and `orders:eu`: {} attempts refused", outcomes.len());
}

/// `EXEC` calls the server has run (INFO commandstats).
fn exec_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::from_redis_value(redis.cmd(&["INFO", "commandstats"])).expect("INFO");
    let Some(line) = info.lines().find(|l| l.starts_with("cmdstat_exec:")) else { return 0 };
    line.split(['=', ',']).nth(1).and_then(|n| n.parse().ok()).expect("calls")
}

/// The stream prefix, consumer group and application user the README's ACL block is written for;
/// [`readme_acl_commands_for`] replaces them.
const README_STREAM_PREFIX: &str = "orders";
const README_CONSUMER_GROUP: &str = "billing";
const README_CLIENT_USER: &str = "rsc-client";

fn readme_text() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md")
}

/// The `redis-cli ACL SETUSER` commands of the README's Redis section for `group`, with the
/// README's password replaced.
fn readme_acl_commands(password: &str, group: &GroupId) -> Vec<Vec<String>> {
    readme_acl_commands_for(&readme_text(), password, group, README_CLIENT_USER)
}

/// [`readme_acl_commands_for`] of a given README text (e.g. the previous release's) for its own
/// consumer group under `stream_prefix`.
pub(crate) fn readme_acl_commands_in(readme: &str, password: &str, stream_prefix: &str) -> Vec<Vec<String>> {
    let group = GroupId::new(stream_prefix, README_CONSUMER_GROUP);
    readme_acl_commands_for(readme, password, &group, README_CLIENT_USER)
}

/// The `redis-cli ACL SETUSER` commands of `readme`'s Redis section, as argument lists (shell
/// quoting and line continuations undone), with the password, the stream prefix and the consumer
/// group replaced, and the application's user named `client_user`.
fn readme_acl_commands_for(readme: &str, password: &str, group: &GroupId, client_user: &str) -> Vec<Vec<String>> {
    let joined = readme.replace("\\\n", " ");
    let substitute = |arg: String| {
        let (prefix, consumer_group) = (&group.stream_prefix, &group.consumer_group);
        match arg.as_str() {
            README_CLIENT_USER => client_user.to_string(),
            _ => arg
                .replace(">CHANGE-ME", &format!(">{password}"))
                .replace(&format!("~{README_STREAM_PREFIX}:"), &format!("~{prefix}:"))
                .replace(&format!("{{{README_STREAM_PREFIX}:"), &format!("{{{prefix}:"))
                .replace(&format!(":fence:{README_CONSUMER_GROUP}"), &format!(":fence:{consumer_group}")),
        }
    };
    let commands: Vec<Vec<String>> = joined
        .lines()
        .filter_map(|line| line.trim().strip_prefix("redis-cli ACL SETUSER "))
        .map(|rest| {
            let mut args = vec!["ACL".to_string(), "SETUSER".to_string()];
            args.extend(shell_words(rest).into_iter().map(substitute));
            args
        })
        .collect();
    assert_eq!(commands.len(), 2, "the README documents a coordinator user and a client user");
    commands
}

/// Applies the README's users for `group` on `server`, the application's named `client_user`.
fn apply_readme_users(server: &RedisServer, readme: &str, password: &str, group: &GroupId, client_user: &str) {
    for args in readme_acl_commands_for(readme, password, group, client_user) {
        server.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

/// Splits a shell command line on blanks, honouring single quotes (all the README uses).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '\'' => (quoted, any) = (!quoted, true),
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    words
}

async fn acl_story(user: AclUser) {
    const SHARDS: u32 = 4;
    const MESSAGES: usize = 1_000;
    let redis = RedisServer::start();
    let password = "e2e-acl-secret";
    let group = group("acl");
    let user_url = |name: &str| format!("redis://{name}:{password}@127.0.0.1:{}", redis.port());
    let (url, client_url) = match user {
        AclUser::AllButFlush => {
            let url = redis.create_acl_user("coordinator", password);
            (url.clone(), url)
        }
        AclUser::ProbedCommandsOnly => {
            let secret = format!(">{password}");
            let mut args = vec!["ACL", "SETUSER", "coordinator", "reset", "on", &secret, "~*", "-@all"];
            let grants: Vec<String> = PROBED_COMMANDS.iter().map(|c| format!("+{c}")).collect();
            args.extend(grants.iter().map(String::as_str));
            redis.cmd(&args);
            (user_url("coordinator"), user_url("coordinator"))
        }
        AclUser::Documented => {
            apply_readme_users(&redis, &readme_text(), password, &group, README_CLIENT_USER);
            (user_url("rsc-coordinator"), user_url(README_CLIENT_USER))
        }
    };
    for user_url in [&url, &client_url] {
        let client = redis::Client::open(user_url.as_str()).expect("ACL URL");
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2)).expect("ACL user connects");
        for command in ["FLUSHALL", "FLUSHDB"] {
            let denied = redis::cmd(command).query::<redis::Value>(&mut conn).unwrap_err();
            assert_eq!(denied.code(), Some("NOPERM"), "{command}: {denied}");
        }
    }
    redis.cmd(&["ACL", "LOG", "RESET"]);

    let coordinator = CoordinatorProcess::start(&url, "e2e-acl").await;
    let config = fast_config();
    assert!(config.fencing, "the story runs with fencing on (the default)");
    coordinator.create_group(&group, SHARDS, &config).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], client_url.clone());
    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    wait_until("two consumers share the shards", Duration::from_secs(15), || shares_all(&[&a, &b], SHARDS)).await;
    let producer = fleet.producer("producer").await;
    producer.publish_paced(0..MESSAGES, 2_000).await;
    let ledger = fleet.ledger.clone();
    fleet.wait_all_acked(MESSAGES, Duration::from_secs(20)).await;
    assert_no_split(&fleet.reads);
    let summary = check_delivery(&ledger, &abandoned_entries(&fleet.events()));
    a.close(Duration::from_secs(10)).await;
    b.close(Duration::from_secs(10)).await;
    assert_eq!(coordinator.describe(&group).await["metadata"]["members"], serde_json::json!({}));

    let denials = redis.cmd(&["ACL", "LOG"]);
    assert_eq!(denials, redis::Value::Array(vec![]), "no command of the coordinator or the clients was denied");
    assert!(!coordinator.log().contains(password), "the password never reaches the log");
    // Fencing ran: every shard's fence key was raised (by the coordinator) and used (by clients
    // whose reads, acks and claims all went through the fenced scripts).
    let fence_keys: Vec<String> = (0..SHARDS).map(|s| rsc::store::keys::fence_key(&group, s)).collect();
    for key in &fence_keys {
        assert_ne!(redis.cmd(&["HGET", key, "counter"]), redis::Value::Nil, "{key} was raised");
    }
    coordinator.assert_no_error_logged();
    eprintln!("ACL user {user:?}: {summary}");
}

/// The README's two users on a Redis Cluster, created on every node as the README says, with
/// `+cluster|slots`, `+asking` and `+eval` added to both and `+cluster|nodes` to the coordinator's: the
/// coordinator and the clients run the fenced flow, while the group's metadata slot and a shard
/// stream's slot (onto a new, empty primary) move under them, with nothing denied on any node
/// (without `+asking` every ASK redirect of a slot move is refused). (Without `+cluster|slots` the
/// coordinator cannot read the slot map and exits 3; without `+cluster|nodes` it warns and falls
/// back to CLUSTER SLOTS, `store_contract::cluster`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_users_run_the_whole_fenced_flow_on_a_cluster() {
    const SHARDS: u32 = 6;
    const MESSAGES: usize = 600;
    let mut cluster = crate::support::redis_cluster::RedisCluster::start(3, 0);
    // A new, empty primary, which one shard stream's slot moves onto below (a scale-out).
    let empty = cluster.add_empty_primary().port();
    let password = "e2e-acl-secret";
    let group = group("acl-cluster");
    for node in cluster.servers() {
        for args in readme_acl_commands(password, &group) {
            node.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
        }
        for user in ["rsc-coordinator", README_CLIENT_USER] {
            node.cmd(&["ACL", "SETUSER", user, "+cluster|slots", "+asking", "+eval"]);
        }
        node.cmd(&["ACL", "SETUSER", "rsc-coordinator", "+cluster|nodes"]);
        node.cmd(&["ACL", "LOG", "RESET"]);
    }
    // The seeds are the nodes that serve slots: the new primary is learnt from the cluster (the
    // clients load their scripts on the seeds and on the nodes the slot map names).
    let seeds = |user: &str| -> Vec<String> {
        let serving = cluster.servers().iter().filter(|n| n.port() != empty);
        serving.map(|n| format!("redis://{user}:{password}@127.0.0.1:{}", n.port())).collect()
    };
    let streams: Vec<String> = (0..SHARDS).map(|s| group.stream_key(s)).collect();
    let primaries: std::collections::BTreeSet<u16> = streams.iter().map(|k| cluster.node_for_key(k).port()).collect();
    assert!(primaries.len() >= 2, "the shards span primaries");

    let coordinator = CoordinatorProcess::start(&cluster_target(&seeds("rsc-coordinator")), "e2e-acl-cluster").await;
    coordinator.create_group(&group, SHARDS, &fast_config()).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], cluster_target(&seeds("rsc-client")));
    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    wait_until("two consumers share the shards", Duration::from_secs(15), || shares_all(&[&a, &b], SHARDS)).await;
    let producer = fleet.producer("producer").await;
    // While the messages are published, the group's metadata slot moves to another primary and
    // one shard stream's slot onto the empty one, a key at a time: the coordinator and the
    // clients follow ASK redirects (ASKING) there. (A script the empty primary lacks is run as
    // EVAL, `store_contract::cluster`; here the scripts were found there.)
    let metadata_slot = rsc::store::keys::group_slot(&group);
    let stream_slot = cluster.slot_of(&streams[0]);
    let metadata_owner = cluster.owner_of_slot(metadata_slot).port();
    let metadata_target = cluster
        .primaries()
        .into_iter()
        .find(|p| ![metadata_owner, empty].contains(&p.port()))
        .expect("another serving primary");
    let moves = [
        cluster.begin_slot_move(metadata_slot, metadata_target).expect("the slot is elsewhere"),
        cluster.begin_slot_move(stream_slot, cluster.server(empty)).expect("the slot is elsewhere"),
    ];
    let migrate = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut report = Vec::new();
        for slot_move in moves {
            let target = slot_move.target_port;
            let asking_before = tokio::task::block_in_place(|| asking_calls(cluster.server(target)));
            let mut moved = 0;
            loop {
                let batch = tokio::task::block_in_place(|| cluster.migrate_slot_keys(&slot_move, 1));
                if batch == 0 {
                    break;
                }
                moved += batch;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Every key of the slot is on the target now, reached only through ASK, for a second.
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            let asking = tokio::task::block_in_place(|| asking_calls(cluster.server(target))) - asking_before;
            tokio::task::block_in_place(|| cluster.finish_slot_move(slot_move));
            report.push((target, moved, asking));
        }
        report
    };
    let ((), moved) = tokio::join!(producer.publish_paced(0..MESSAGES, 2_000), migrate);
    // Each move migrated keys, and the coordinator or the clients followed ASK to its target
    // (ASKING there) while the slot was split: else the migration part tested nothing.
    eprintln!("ACL cluster slot moves (target port, keys migrated, ASKING there): {moved:?}");
    for (target, keys, asking) in &moved {
        assert!(*keys > 0 && *asking > 0, "move to port {target}: {keys} keys migrated, {asking} ASKING: {moved:?}");
    }
    let ledger = fleet.ledger.clone();
    fleet.wait_all_acked(MESSAGES, Duration::from_secs(20)).await;
    assert_no_split(&fleet.reads);
    let summary = check_delivery(&ledger, &abandoned_entries(&fleet.events()));
    a.close(Duration::from_secs(10)).await;
    b.close(Duration::from_secs(10)).await;
    for node in cluster.servers() {
        let denials = node.cmd(&["ACL", "LOG"]);
        assert_eq!(denials, redis::Value::Array(vec![]), "nothing denied on node {}", node.port());
    }
    for shard in 0..SHARDS {
        let key = rsc::store::keys::fence_key(&group, shard);
        assert_ne!(cluster.node_for_key(&key).cmd(&["HGET", &key, "counter"]), redis::Value::Nil, "{key} raised");
    }
    assert!(!coordinator.log().contains(password), "the password never reaches the log");
    coordinator.assert_no_error_logged();
    eprintln!("README users on a 3-primary Cluster ({} primaries hold the shards): {summary}", primaries.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_fails_fast_naming_a_command_the_server_renamed_away() {
    for command in ["XAUTOCLAIM", "EVALSHA"] {
        let extra_args = vec!["--rename-command".to_string(), command.to_string(), String::new()];
        let redis = RedisServer::start_with(ServerConfig { extra_args, ..ServerConfig::default() });
        let unknown = redis.try_cmd(&[command]).unwrap_err();
        assert!(unknown.to_string().contains("unknown command"), "{command} is renamed away: {unknown}");
        let failed = serve_expecting_exit(&redis.url(), Duration::from_secs(20)).await;
        assert_eq!(failed.status.code(), Some(3), "{command}: exit code 3 (store incompatible):\n{}", failed.stderr);
        assert!(failed.elapsed < Duration::from_secs(10), "{command}: failed after {:?}", failed.elapsed);
        let error_line = failed.stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
        assert!(
            error_line.contains("compatibility probe") && error_line.contains(command),
            "{command}: the error names the command:\n{}",
            failed.stderr
        );
        eprintln!("{command} renamed away: exit 3 after {:?}: {error_line}", failed.elapsed);
    }
}
