//! Story: the compatibility rule of docs/DESIGN.md §6 on the wire, with raw heartbeats to the
//! previous release's coordinator (`tests/compat/OLD_RELEASE`) and this build's on one Redis: the
//! new top-level `fenced` field (refused by the old coordinator with the message the new client
//! recognises), a REVOKED report that names no revoke (it releases nothing: the reporter is fenced
//! at the rebalance timeout and the shard moves after its lease), `fencing: false` lost in an old
//! coordinator's rewrite, and the previous release's documented ACL users (the new coordinator
//! stops at startup under them).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::acl::readme_acl_commands_in;
use crate::e2e_support::old_release::OldRelease;
use crate::e2e_support::process::{serve_expecting_exit, CoordinatorProcess, Listener};
use crate::e2e_support::{fast_config, heartbeat_json};
use crate::mixed_versions::{aggregate, FENCED_REFUSED, SETTLE};
use crate::support::RedisServer;
use rsc::core::model::{GroupConfig, GroupId};

/// `member`'s heartbeats to one coordinator, as raw JSON (a client of any version).
struct RawMember<'a> {
    coordinator: &'a CoordinatorProcess,
    group: GroupId,
    member: &'static str,
    last: Option<Value>,
}

impl<'a> RawMember<'a> {
    fn new(coordinator: &'a CoordinatorProcess, group: &GroupId, member: &'static str) -> Self {
        Self { coordinator, group: group.clone(), member, last: None }
    }

    /// One heartbeat: the body its last answer leads to, changed by `edit`. Returns (status, body).
    async fn beat(&mut self, edit: impl FnOnce(&mut Value)) -> (u16, Value) {
        let mut body: Value =
            serde_json::from_slice(&heartbeat_json(&self.group, self.member, self.last.as_ref())).expect("JSON");
        edit(&mut body);
        let path = format!("/v1/groups/{}/{}/heartbeat", self.group.stream_prefix, self.group.consumer_group);
        let answer = self
            .coordinator
            .request("POST", &path, &[("Content-Type", "application/json")], body.to_string().into_bytes())
            .await
            .expect("heartbeat exchange");
        let value = answer.json();
        if answer.status == 200 {
            self.last = Some(value.clone());
        }
        (answer.status, value)
    }
}

fn shards_of(answer: &Value, field: &str) -> Vec<u64> {
    answer[field].as_array().map_or(Vec::new(), |a| a.iter().filter_map(Value::as_u64).collect())
}

/// How a drained shard reached the member waiting for it.
struct Handoff {
    /// From `b`'s join (the earliest moment the revoke can have been decided) until `b` was
    /// assigned the shard.
    waited: Duration,
    /// From that join until `a`'s heartbeat was refused as fenced (`None`: never).
    reporter_fenced: Option<Duration>,
    /// From that join until the end of the lease `a`'s last successful heartbeat gave it
    /// (sent time + assignment lease, as a client computes it).
    reporter_lease_end: Duration,
}

/// Drives `a` (owner of both shards) and `b` (joining) until `a` is told to revoke a shard; then
/// `a` reports it REVOKED, with the revoke id the answer gave when `name_the_revoke`, without one
/// (as a client older than revoke ids) otherwise, until `b` is assigned the shard or `a` is fenced
/// (then it stops, as a fenced client would before rejoining).
async fn handoff_after_revoked_report(
    coordinator: &CoordinatorProcess,
    group: &GroupId,
    name_the_revoke: bool,
) -> Handoff {
    let (mut a, mut b) = (RawMember::new(coordinator, group, "a"), RawMember::new(coordinator, group, "b"));
    let deadline = Instant::now() + SETTLE;
    while shards_of(a.last.as_ref().unwrap_or(&Value::Null), "assigned") != [0, 1] {
        assert!(Instant::now() < deadline, "a never owned both shards: {:?}", a.last);
        assert_eq!(a.beat(|_| {}).await.0, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let joined = Instant::now();
    assert_eq!(b.beat(|_| {}).await.0, 200, "b joins");
    let (shard, revoke_id) = loop {
        assert!(Instant::now() < deadline, "a was never told to revoke: {:?}", a.last);
        let (status, answer) = a.beat(|_| {}).await;
        assert_eq!(status, 200, "{answer}");
        if let Some(&shard) = shards_of(&answer, "revoke").first() {
            let drain = answer["drains"].as_array().and_then(|d| d.iter().find(|d| d["shard"] == shard)).cloned();
            break (shard, drain.map(|d| d["revokeId"].clone()).expect("this release names the revoke"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let lease = Duration::from_millis(a.last.as_ref().and_then(|l| l["assignmentLeaseMs"].as_u64()).expect("lease"));
    let mut reporter_fenced = None;
    let mut reporter_lease_end = lease;
    loop {
        assert!(joined.elapsed() < SETTLE, "b never got shard {shard}");
        if reporter_fenced.is_none() {
            let sent = joined.elapsed();
            let (status, answer) = a
                .beat(|body| {
                    let mut report = json!({"shard": shard, "inFlight": 0, "revoked": true});
                    if name_the_revoke {
                        report["revokeId"] = revoke_id.clone();
                    }
                    body["revoking"] = json!([report]);
                })
                .await;
            match (status, answer["code"].as_str()) {
                (200, _) => reporter_lease_end = sent + lease,
                (409, Some("FENCED_MEMBER_EPOCH")) => reporter_fenced = Some(sent),
                _ => panic!("a's report answered {status}: {answer}"),
            }
        }
        let (status, answer) = b.beat(|_| {}).await;
        assert_eq!(status, 200, "{answer}");
        if shards_of(&answer, "assigned").contains(&shard) {
            return Handoff { waited: joined.elapsed(), reporter_fenced, reporter_lease_end };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_releases_answer_the_other_releases_heartbeats_as_the_compatibility_rule_says() {
    let Some(release) = OldRelease::find() else { return };
    let redis = RedisServer::start();
    let url = redis.url();
    let old = CoordinatorProcess::start_binary(&release.coordinator, &url, "e2e-old", "", Listener::default()).await;
    let new = CoordinatorProcess::start(&url, "e2e-new").await;
    let config = GroupConfig { rebalance_timeout_ms: 3_000, ..fast_config() };
    // `fencing: false` does not survive a write by the old coordinator: its rewrite drops the field,
    // and absent reads as on (§6 names this cost).
    let unfenced = GroupId::new("e2e-unfenced", "workers");
    new.create_group(&unfenced, 2, &GroupConfig { fencing: false, ..config.clone() }).await;
    assert_eq!(new.describe(&unfenced).await["metadata"]["config"]["fencing"], json!(false));
    assert_eq!(RawMember::new(&old, &unfenced, "w").beat(|_| {}).await.0, 200, "joins through the old one");
    assert!(aggregate(&redis, &unfenced)["config"].get("fencing").is_none(), "the old write dropped `fencing`");
    assert_eq!(new.describe(&unfenced).await["metadata"]["config"]["fencing"], json!(true), "and it reads as on");

    let mut figures = Vec::new();
    for (name, coordinator) in [("old", &old), ("new", &new)] {
        // The new top-level field: the old coordinator refuses it with the message the new client
        // recognises (it then stops sending it); the new one answers a fence it never recorded
        // by changing nothing.
        let probe = GroupId::new(format!("e2e-probe-{name}"), "workers");
        coordinator.create_group(&probe, 2, &config).await;
        let mut member = RawMember::new(coordinator, &probe, "p");
        assert_eq!(member.beat(|_| {}).await.0, 200, "joins");
        let (status, answer) =
            member.beat(|body| body["fenced"] = json!([{"shard": 0, "fence": "7.00000000000000ff"}])).await;
        match name {
            "old" => {
                assert_eq!(status, 400, "{answer}");
                assert!(answer["message"].as_str().is_some_and(|m| m.contains(FENCED_REFUSED)), "{answer}");
            }
            _ => assert_eq!(status, 200, "{answer}"),
        }

        // A REVOKED report naming no revoke releases nothing: the shard moves only once the
        // rebalance timeout and a lease passed. Naming it releases the shard at once.
        let named = GroupId::new(format!("e2e-named-{name}"), "workers");
        coordinator.create_group(&named, 2, &config).await;
        let quick = handoff_after_revoked_report(coordinator, &named, true).await;
        let unnamed = GroupId::new(format!("e2e-unnamed-{name}"), "workers");
        coordinator.create_group(&unnamed, 2, &config).await;
        let slow = handoff_after_revoked_report(coordinator, &unnamed, false).await;
        let timeout = Duration::from_millis(config.rebalance_timeout_ms);
        assert!(quick.waited < timeout && quick.reporter_fenced.is_none(), "{name}: a named report releases at once");
        // Unnamed: the report is answered (REVOKE_PENDING) and releases nothing; at the rebalance
        // timeout the reporter is fenced (it must rejoin, losing its other shards too), and the
        // shard moves only after the lease the reporter last got has ended.
        let fenced = slow.reporter_fenced.unwrap_or_else(|| panic!("{name}: the reporter was never fenced"));
        assert!(fenced >= timeout, "{name}: fenced {fenced:?} after b joined, before the rebalance timeout");
        assert!(
            slow.waited >= slow.reporter_lease_end && slow.waited >= timeout,
            "{name}: the shard moved {:?} after b joined, the reporter's lease ended after {:?}",
            slow.waited,
            slow.reporter_lease_end
        );
        figures.push(format!(
            "{name}: shard moved {:.2} s after the joiner's first heartbeat with the revoke id; without it \
             the reporter is fenced after {:.2} s and the shard moves after {:.2} s",
            quick.waited.as_secs_f64(),
            fenced.as_secs_f64(),
            slow.waited.as_secs_f64()
        ));
    }
    old.assert_no_error_logged();
    new.assert_no_error_logged();
    eprintln!("heartbeats across releases (old {}): {}", &release.commit[..7], figures.join("; "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_releases_acl_users_are_extended_before_the_new_coordinator_can_start() {
    let Some(release) = OldRelease::find() else { return };
    let redis = RedisServer::start();
    let password = "e2e-mixed-acl";
    let url = format!("redis://rsc-coordinator:{password}@127.0.0.1:{}", redis.port());
    for args in readme_acl_commands_in(&release.readme(), password, "e2e-acl-mixed") {
        redis.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    // The old coordinator runs under the user its README documents; the new one needs PEXPIRE
    // (fence gates expire), XREAD and XINFO GROUPS besides (its probe covers the consumers'
    // doorbell) and stops at startup, naming the first of them its probe runs.
    let mut old =
        CoordinatorProcess::start_binary(&release.coordinator, &url, "e2e-old", "", Listener::default()).await;
    let failed = serve_expecting_exit(&url, Duration::from_secs(20)).await;
    assert_eq!(failed.status.code(), Some(3), "exit code 3 (store incompatible):\n{}", failed.stderr);
    let error_line = failed.stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_default().to_string();
    assert!(error_line.contains("PEXPIRE"), "the error names the first command denied:\n{}", failed.stderr);
    // The current README's users (applied over the old ones) serve both releases.
    let current = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    for args in readme_acl_commands_in(&current, password, "e2e-acl-mixed") {
        redis.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let new = CoordinatorProcess::start(&url, "e2e-new").await;
    old.restart(&url).await;
    old.assert_no_error_logged();
    new.assert_no_error_logged();
    eprintln!("the previous release's ACL users: the new coordinator stopped at startup with {error_line:?}");
}
