//! Story: a mixed-version pair on one Redis (docs/DESIGN.md §6). The previous release's
//! `coordinator` (the commit in `tests/compat/OLD_RELEASE`, which predates fencing, §10) and this
//! build's run against the same Redis at once, behind one load balancer that spreads every request
//! over the coordinators in its list, through a rolling update and back:
//! old only → both → new only → both → old only → new only.
//!
//! Consumers of this build's library (in-process) and one old consumer (the old
//! `examples/consumer` binary) process what a producer publishes all along. Checked from ground
//! truth (the consumers' read calls, the ledger of what each consumer received and acked, Redis's
//! pending lists and the stored record, every answer on the wire): no shard read by two consumers
//! at once, nothing acknowledged lost or delivered again after its ack, every shard owned at every
//! step, no 5xx but the documented 503, and the stored record crosses the versions as §6 says
//! (the old binary drops the fences and the `fencing` flag; the new one reads that as fencing on
//! and raises new fences before answering again).
//!
//! The wire rule probed with raw heartbeats, and the ACL users, are in `mixed_wire.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::e2e_support::fleet::{abandoned_entries, Acked, ConsumerApp, EntryKey, Fleet, Ledger};
use crate::e2e_support::ground_truth::{assert_no_split, ReadLog};
use crate::e2e_support::http_tap::{HttpTap, TapAnswer};
use crate::e2e_support::old_release::{OldConsumer, OldRelease};
use crate::e2e_support::process::{CoordinatorProcess, Listener};
use crate::e2e_support::spread::Spreader;
use crate::e2e_support::{fast_config, group, wait_until, wait_until_explained};
use crate::support::RedisServer;
use rsc::client::events::{ClientEvent, StopReason};
use rsc::core::model::{GroupId, ShardId};
use rsc::core::protocol::ErrorCode;
use rsc::store::keys;

const SHARDS: u32 = 8;
const MESSAGES: usize = 6_000;
/// Publishing rate: MESSAGES span the whole update (about 24 s).
const PER_SECOND: usize = 250;
/// How long each phase of the update runs once its consumers settled.
const PHASE: Duration = Duration::from_secs(3);
pub(crate) const SETTLE: Duration = Duration::from_secs(20);
/// The message the new consumer recognises as an older coordinator refusing `fenced`
/// (`src/client/consumer/core/apply.rs`).
pub(crate) const FENCED_REFUSED: &str = "unknown field `fenced`";
/// An older coordinator refusing the proof a new consumer sends back with its version (DESIGN §8).
const PROOF_REFUSED: &str = "unknown field `metadataVersionProof`";
/// The proofs a new producer sends back with its routing report; an older coordinator refuses
/// them, and the producer sends the same report once more (another instance may read it) and
/// drops the proofs only after a second refusal in a row.
const PROOF_PARAMETERS: [&str; 2] = ["knownVersionProof", "knownShardCountProof"];

/// The stored aggregate of `group` (the metadata hash's `aggregate` field, as JSON).
pub(crate) fn aggregate(redis: &RedisServer, group: &GroupId) -> Value {
    let reply = redis.cmd(&["HGET", &keys::metadata_key(group), "aggregate"]);
    let text: String = redis::from_redis_value(reply).expect("the aggregate field");
    serde_json::from_str(&text).expect("aggregate JSON")
}

/// Per owned shard of a stored aggregate, its recorded fence (`None`: recorded without one).
fn owned_fences(aggregate: &Value) -> BTreeMap<ShardId, Option<String>> {
    let current = aggregate["current"].as_object().expect("current");
    current
        .iter()
        .filter(|(_, owner)| owner["kind"] == "owned")
        .map(|(shard, owner)| (shard.parse().expect("shard"), owner["fence"].as_str().map(str::to_owned)))
        .collect()
}

/// True when no entry of the aggregate carries a fence.
fn no_fence_recorded(aggregate: &Value) -> bool {
    let current = aggregate["current"].as_object().expect("current");
    current.values().all(|owner| owner.get("fence").is_none())
}

/// The fence key's counter of every shard (0: never raised).
fn fence_counters(redis: &RedisServer, group: &GroupId) -> Vec<u64> {
    (0..SHARDS)
        .map(|shard| {
            let reply = redis.cmd(&["HGET", &keys::fence_key(group, shard), keys::FENCE_FIELD_COUNTER]);
            let counter: Option<String> = redis::from_redis_value(reply).expect("fence counter");
            counter.map_or(0, |c| c.parse().expect("counter"))
        })
        .collect()
}

/// The consumers' readable shards (the old one's as its listener printed them) are disjoint and
/// cover every shard, each consumer holding at least one.
fn shares_all(apps: &[&ConsumerApp], old: &OldConsumer) -> bool {
    let mut seen = BTreeSet::new();
    let mut sets: Vec<BTreeSet<ShardId>> = apps.iter().map(|a| a.status().readable.into_iter().collect()).collect();
    sets.push(old.reading());
    for set in sets {
        if set.is_empty() || set.iter().any(|s| !seen.insert(*s)) {
            return false;
        }
    }
    seen == (0..SHARDS).collect()
}

/// Everything the old consumer received that a consumer of this build was reading at the same
/// moment (a read call on that shard's stream open when the old consumer's line arrived).
fn old_reads_inside_new_reads(ledger: &Ledger, reads: &ReadLog, group: &GroupId, old: &str) -> Vec<String> {
    let calls = reads.calls();
    let inner = ledger.lock();
    let mut found = Vec::new();
    for d in inner.delivered.iter().filter(|d| d.member == old) {
        let stream = group.stream_key(d.shard);
        for c in calls.iter().filter(|c| c.stream == stream && c.member != old) {
            if c.start <= d.at && d.at <= c.end {
                found.push(format!("{old} received {}/{} at {:.1} ms inside {c:?}", d.shard, d.entry, reads.ms(d.at)));
            }
        }
    }
    found
}

/// Delivery from ground truth: every produced entry was received with its payload, Redis holds no
/// pending entry of the group, no entry came back after its first successful ack (the old
/// consumer's ack counts at the moment its line arrived unless it printed that the ack failed),
/// and every redelivery is explained (abandoned by a consumer of this build, or an ack of the old
/// consumer that failed). Returns a summary.
fn check_delivery_mixed(
    ledger: &Ledger,
    redis: &RedisServer,
    group: &GroupId,
    old: &str,
    abandoned: &BTreeSet<EntryKey>,
) -> String {
    let inner = ledger.lock();
    let failed_old_acks: BTreeSet<String> = inner
        .ack_failures
        .iter()
        .filter_map(|f| f.strip_prefix(&format!("{old}: ack "))?.split(' ').next().map(str::to_owned))
        .collect();
    let mut acks: Vec<Acked> = inner.acked.clone();
    for d in inner.delivered.iter().filter(|d| d.member == old && !failed_old_acks.contains(&d.entry.to_string())) {
        acks.push(Acked { entry: (d.shard, d.entry), member: old.into(), at: d.at });
    }
    let mut first_ack: BTreeMap<EntryKey, &Acked> = BTreeMap::new();
    for a in &acks {
        first_ack.entry(a.entry).and_modify(|f| *f = if a.at < f.at { a } else { f }).or_insert(a);
    }
    let mut deliveries: BTreeMap<EntryKey, Vec<_>> = BTreeMap::new();
    for d in &inner.delivered {
        deliveries.entry((d.shard, d.entry)).or_default().push(d);
    }
    for p in &inner.produced {
        let received = deliveries.get(&(p.shard, p.entry));
        let received = received.unwrap_or_else(|| panic!("entry {}/{} was never received", p.shard, p.entry));
        assert!(received.iter().all(|d| d.payload == p.payload), "entry {}/{} arrived altered", p.shard, p.entry);
    }
    assert_eq!(deliveries.len(), inner.produced.len(), "entries received that nobody produced");
    for (id, ack) in &first_ack {
        for d in &deliveries[id] {
            assert!(d.at <= ack.at, "entry {id:?} acked by {} came back to {} afterwards", ack.member, d.member);
        }
    }
    let redelivered: Vec<EntryKey> = deliveries.iter().filter(|(_, ds)| ds.len() > 1).map(|(id, _)| *id).collect();
    let unexplained: Vec<&EntryKey> = redelivered
        .iter()
        .filter(|id| !abandoned.contains(id) && !failed_old_acks.contains(&id.1.to_string()))
        .collect();
    assert!(unexplained.is_empty(), "redelivered without a lost shard to explain it: {unexplained:?}");
    let pending: i64 = (0..SHARDS).map(|s| crate::e2e_support::checks::pending_count(redis, group, s)).sum();
    assert_eq!(pending, 0, "entries delivered and never acknowledged at Redis");
    let by_old = inner.delivered.iter().filter(|d| d.member == old).count();
    format!(
        "{} produced, {} received ({by_old} by the old consumer), {} redelivered, {} acks failed",
        inner.produced.len(),
        inner.delivered.len(),
        redelivered.len(),
        inner.ack_failures.len()
    )
}

/// The answers on the wire that were not 2xx, as `status code` → count. Panics on a 5xx other
/// than 503 COORDINATOR_TERMINATING, and on a 4xx other than the old coordinator's 400 refusing
/// `fenced` or a view proof (which only the old coordinator may answer).
fn non_success(old: &[TapAnswer], new: &[TapAnswer]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (answers, is_old) in [(old, true), (new, false)] {
        for a in answers.iter().filter(|a| a.status >= 300) {
            let body = String::from_utf8_lossy(&a.body);
            let code = a.error_code().unwrap_or_default();
            let documented = match a.status {
                503 => code == "COORDINATOR_TERMINATING",
                400 => {
                    let heartbeat = a.request.ends_with("/heartbeat")
                        && (body.contains(FENCED_REFUSED) || body.contains(PROOF_REFUSED));
                    let routing = a.request.contains("/routing")
                        && PROOF_PARAMETERS.iter().any(|p| body.contains(&format!("unknown field `{p}`")));
                    is_old && (heartbeat || routing)
                }
                _ => false,
            };
            let who = if is_old { "old" } else { "new" };
            assert!(documented, "the {who} coordinator answered {} {}: {body}", a.request, a.status);
            *counts.entry(format!("{who} {} {code}", a.status)).or_default() += 1;
        }
    }
    counts
}

/// The fleet's state and the old consumer's last lines, for a failure message.
fn explain(fleet: &Fleet, old: &OldConsumer) -> String {
    let tail: Vec<String> = old.output().iter().rev().take(30).rev().map(|l| l.text.clone()).collect();
    format!("{}\nold consumer:\n{}", fleet.explain(), tail.join("\n"))
}

/// Waits until `apps` and `old` share every shard ([`shares_all`]).
async fn settle(what: &str, apps: &[&ConsumerApp], old: &OldConsumer, fleet: &Fleet) {
    wait_until_explained(what, SETTLE, || shares_all(apps, old), || explain(fleet, old)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_from_the_previous_release_and_back_loses_nothing_and_splits_no_shard() {
    let Some(release) = OldRelease::find() else { return };
    let started = Instant::now();
    let redis = RedisServer::start();
    let url = redis.url();
    let mut old =
        CoordinatorProcess::start_binary(&release.coordinator, &url, "e2e-old", "", Listener::default()).await;
    let tap_old = HttpTap::start(old.addr());
    let spreader = Spreader::start(vec![tap_old.addr()]);
    let group = group("mixed");
    // This build's admin CLI creates the group through the old coordinator: the old one ignores
    // the `fencing` field it does not know.
    old.create_group(&group, SHARDS, &fast_config()).await;
    let mut fleet = Fleet::new(group.clone(), vec![spreader.addr()], url.clone());
    fleet.idle_per_address_max = 0;
    let ledger = fleet.ledger.clone();
    let c1 = fleet.consumer("c1", Default::default()).await;
    let mut old_consumer = OldConsumer::start(&release, "old-c1", spreader.addr(), &url, &group, ledger.clone());

    // 1. Old only.
    settle("old only: c1 and the old consumer share the shards", &[&c1], &old_consumer, &fleet).await;
    let producer = fleet.producer("producer").await;
    let production = tokio::spawn(async move {
        producer.publish_paced(0..MESSAGES, PER_SECOND).await;
        producer
    });
    let stored = aggregate(&redis, &group);
    assert!(no_fence_recorded(&stored), "the old coordinator records no fence: {stored}");
    assert!(stored["config"].get("fencing").is_none(), "the old coordinator dropped `fencing`: {stored}");
    tokio::time::sleep(PHASE).await;

    // 2. Both: the new coordinator starts and takes half the requests; a consumer joins.
    let mut new = CoordinatorProcess::start(&url, "e2e-new").await;
    let tap_new = HttpTap::start(new.addr());
    spreader.set_backends(vec![tap_old.addr(), tap_new.addr()]);
    let c2 = fleet.consumer("c2", Default::default()).await;
    settle("both: c1, c2 and the old consumer share the shards", &[&c1, &c2], &old_consumer, &fleet).await;
    // A raise that no record holds (as after a lost metadata write, §10): Redis refuses the
    // fenced consumers' operations, and they report `fenced`. Reports that reach the old
    // coordinator are refused (400); the consumer drops the field there and the new coordinator
    // raises a new fence when a report reaches it. Repeated until the old one refused one.
    let refused_fenced = |tap: &HttpTap| {
        tap.answers()
            .iter()
            .filter(|a| a.status == 400 && String::from_utf8_lossy(&a.body).contains(FENCED_REFUSED))
            .count()
    };
    let deadline = Instant::now() + SETTLE;
    let mut injected_raises = 0;
    while refused_fenced(&tap_old) == 0 {
        assert!(Instant::now() < deadline, "no `fenced` report reached the old coordinator");
        for shard in 0..SHARDS {
            redis.cmd(&["HINCRBY", &keys::fence_key(&group, shard), keys::FENCE_FIELD_COUNTER, "1"]);
        }
        injected_raises += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    settle("both, after the unrecorded raises: the shards are shared again", &[&c1, &c2], &old_consumer, &fleet).await;
    tokio::time::sleep(PHASE).await;

    // 3. New only: the old coordinator shuts down; the new one fences every grant.
    spreader.set_backends(vec![tap_new.addr()]);
    old.sigterm();
    assert!(old.wait_exit(Duration::from_secs(15)).await.is_some_and(|s| s.success()), "{}", old.log());
    wait_until("new only: every owned shard recorded with a fence", SETTLE, || {
        let fences = owned_fences(&aggregate(&redis, &group));
        fences.len() == SHARDS as usize && fences.values().all(Option::is_some)
    })
    .await;
    let fenced_by_new = fence_counters(&redis, &group);
    settle("new only: the shards stay shared", &[&c1, &c2], &old_consumer, &fleet).await;
    tokio::time::sleep(PHASE).await;

    // 4. Both again (a rollback starts): the old coordinator is back; c2 leaves.
    old.restart(&url).await;
    spreader.set_backends(vec![tap_old.addr(), tap_new.addr()]);
    c2.close(Duration::from_secs(10)).await;
    settle("rollback, both: c1 and the old consumer share the shards", &[&c1], &old_consumer, &fleet).await;
    tokio::time::sleep(PHASE).await;

    // 5. Old only: the new coordinator shuts down; a consumer joins through the old one, whose
    // write drops every fence and the `fencing` flag.
    spreader.set_backends(vec![tap_old.addr()]);
    new.sigterm();
    assert!(new.wait_exit(Duration::from_secs(15)).await.is_some_and(|s| s.success()), "{}", new.log());
    let c3 = fleet.consumer("c3", Default::default()).await;
    settle("old only again: c1, c3 and the old consumer share the shards", &[&c1, &c3], &old_consumer, &fleet).await;
    let rewritten = aggregate(&redis, &group);
    assert!(no_fence_recorded(&rewritten), "the old coordinator's write dropped the fences: {rewritten}");
    assert!(rewritten["config"].get("fencing").is_none(), "and `fencing`: {rewritten}");
    tokio::time::sleep(PHASE).await;

    // 6. New only for good: absent `fencing` reads as on, and every grant gets a new fence (a
    // newer counter than any it had before: a dropped fence is superseded, never reused).
    new.restart(&url).await;
    spreader.set_backends(vec![tap_new.addr()]);
    old.sigterm();
    assert!(old.wait_exit(Duration::from_secs(15)).await.is_some_and(|s| s.success()), "{}", old.log());
    assert_eq!(new.describe(&group).await["metadata"]["config"]["fencing"], json!(true), "absent `fencing` is on");
    wait_until("new only again: every owned shard fenced anew", SETTLE, || {
        let fences = owned_fences(&aggregate(&redis, &group));
        let counters = fence_counters(&redis, &group);
        fences.len() == SHARDS as usize
            && fences.values().all(Option::is_some)
            && counters.iter().zip(&fenced_by_new).all(|(now, before)| now > before)
    })
    .await;
    settle("new only again: the shards stay shared", &[&c1, &c3], &old_consumer, &fleet).await;

    let _producer = production.await.expect("producer task");
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    let produced = ledger.lock().produced.len();
    wait_until_explained(
        "every published entry received and none pending at Redis",
        Duration::from_secs(30),
        || {
            let pending: i64 = (0..SHARDS).map(|s| crate::e2e_support::checks::pending_count(&redis, &group, s)).sum();
            let inner = ledger.lock();
            let received: BTreeSet<EntryKey> = inner.delivered.iter().map(|d| (d.shard, d.entry)).collect();
            received.len() >= produced && pending == 0
        },
        || explain(&fleet, &old_consumer),
    )
    .await;
    for app in [c1, c3] {
        app.close(Duration::from_secs(10)).await;
    }
    let status = old_consumer.leave(Duration::from_secs(15)).await;
    assert!(status.success(), "the old consumer left cleanly: {status}");
    assert_eq!(new.describe(&group).await["metadata"]["members"], json!({}), "every member left");

    // Safety from ground truth.
    assert_no_split(&fleet.reads);
    let crossed = old_reads_inside_new_reads(&ledger, &fleet.reads, &group, "old-c1");
    assert!(crossed.is_empty(), "a shard read by the old and a new consumer at once:\n{}", crossed.join("\n"));
    let events = fleet.events();
    let summary = check_delivery_mixed(&ledger, &redis, &group, "old-c1", &abandoned_entries(&events));

    // What the clients saw.
    let mut stops: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    for event in &events {
        match event {
            ClientEvent::ShardStopped { reason, .. } => {
                assert!(
                    matches!(reason, StopReason::Revoked | StopReason::FencedAtStore | StopReason::Closing),
                    "a shard stopped for {reason:?}:\n{}",
                    explain(&fleet, &old_consumer)
                );
                *stops.entry(format!("{reason:?}")).or_default() += 1;
            }
            ClientEvent::HeartbeatFailed { error, .. } | ClientEvent::RoutingRefreshFailed { error, .. } => {
                let text = error.to_string();
                let allowed = match error.code() {
                    Some(ErrorCode::CoordinatorTerminating) => true,
                    // The old coordinator refusing `fenced` or the proof sent back with a version
                    // (the consumer sends the refused field once more in the prompt retry, which
                    // may reach the new coordinator, and leaves it out only after two refusals in
                    // a row, until an answer gives fences or a proof again).
                    Some(ErrorCode::BadRequest) => text.contains(FENCED_REFUSED) || text.contains(PROOF_REFUSED),
                    Some(_) => false,
                    // A connection the load balancer cut when its list changed.
                    None => true,
                };
                assert!(allowed, "a client saw {text}");
                let kind = error.code().map_or("unreachable".to_string(), |c| format!("{c:?}"));
                *failures.entry(kind).or_default() += 1;
            }
            _ => {}
        }
    }
    let wire = non_success(&tap_old.answers(), &tap_new.answers());
    assert!(stops.contains_key("FencedAtStore"), "the unrecorded raises stopped fenced reads: {stops:?}");
    let has_fences = |a: &TapAnswer| {
        let body: Option<Value> = serde_json::from_slice(&a.body).ok();
        body.is_some_and(|b| b["fences"].as_array().is_some_and(|f| !f.is_empty()))
    };
    let fenced_answers =
        tap_new.answers().iter().filter(|a| a.request.ends_with("/heartbeat") && has_fences(a)).count();
    assert!(fenced_answers > 0, "the new coordinator answered fences");
    let heartbeats = |answers: &[TapAnswer]| answers.iter().filter(|a| a.request.ends_with("/heartbeat")).count();
    let (old_heartbeats, new_heartbeats) = (heartbeats(&tap_old.answers()), heartbeats(&tap_new.answers()));
    assert!(old_heartbeats > 0 && new_heartbeats > 0, "both coordinators answered heartbeats");
    old.assert_no_error_logged();
    new.assert_no_error_logged();
    eprintln!(
        "mixed versions (old {}): {summary}; heartbeats answered old {old_heartbeats} / new {new_heartbeats} \
         ({fenced_answers} with fences); \
         non-2xx on the wire {wire:?}; client failures {failures:?}; shard stops {stops:?}; \
         fences the new coordinator raised per shard {:?} (besides {injected_raises} injected); {:.1} s",
        &release.commit[..7],
        fence_counters(&redis, &group).iter().map(|c| c - injected_raises).collect::<Vec<_>>(),
        started.elapsed().as_secs_f64()
    );
}
