//! Story 4: least privilege. The coordinator and its clients run under ACL users without FLUSHDB /
//! FLUSHALL — among them the two users the README documents, read from its text — and a server
//! with a command renamed away makes `coordinator serve` fail fast.

use std::time::Duration;

use crate::cluster::asking_calls;
use crate::e2e_support::checks::shares_all;
use crate::e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::{cluster_target, serve_expecting_exit, CoordinatorProcess};
use crate::e2e_support::{fast_config, group, wait_until};
use crate::support::{RedisServer, ServerConfig};

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
    /// coordinator, `rsc-client` (its shard streams and their fence keys only) for the consumers
    /// and the producer, with fencing on.
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

/// The `redis-cli ACL SETUSER` commands of the README's Redis section, as argument lists (shell
/// quoting and line continuations undone), with the README's password and stream prefix replaced.
fn readme_acl_commands(password: &str, stream_prefix: &str) -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    readme_acl_commands_in(&readme, password, stream_prefix)
}

/// [`readme_acl_commands`] of a given README text (e.g. the previous release's).
pub(crate) fn readme_acl_commands_in(readme: &str, password: &str, stream_prefix: &str) -> Vec<Vec<String>> {
    let joined = readme.replace("\\\n", " ");
    let commands: Vec<Vec<String>> = joined
        .lines()
        .filter_map(|line| line.trim().strip_prefix("redis-cli ACL SETUSER "))
        .map(|rest| {
            let mut args = vec!["ACL".to_string(), "SETUSER".to_string()];
            args.extend(shell_words(rest).into_iter().map(|arg| {
                arg.replace(">CHANGE-ME", &format!(">{password}"))
                    .replace("~orders:", &format!("~{stream_prefix}:"))
                    .replace("{orders:", &format!("{{{stream_prefix}:"))
            }));
            args
        })
        .collect();
    assert_eq!(commands.len(), 2, "the README documents a coordinator user and a client user");
    commands
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
            for args in readme_acl_commands(password, &group.stream_prefix) {
                redis.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
            }
            (user_url("rsc-coordinator"), user_url("rsc-client"))
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
        for args in readme_acl_commands(password, &group.stream_prefix) {
            node.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
        }
        for user in ["rsc-coordinator", "rsc-client"] {
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
