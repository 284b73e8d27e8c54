//! Fencing at the resource (DESIGN §10, issue #10) on the real binary and a real Redis: a consumer
//! *process* is stopped (`kill -STOP`) while it holds un-acked entries, its member expires, its
//! shards move to another consumer (the coordinator raises their fence keys), then it is resumed
//! (`kill -CONT`) and tries to read, ack and claim on those shards with the fences of its old
//! grants. None of it may succeed at Redis.
//!
//! Why the stale process issues its operations itself instead of leaving them to the library's
//! poll loop: a resumed consumer's own lease check (on the suspend-aware clock) stops it before it
//! sends anything new. What that check cannot stop are operations already past it when the
//! process paused — in flight, reaching Redis after the pause. The child sends exactly those: the
//! reads, claim and acks its old grants would make, with their fences, right after it resumes.
//! Only the fence check at Redis stands between them and the stream.
//!
//! The stale consumer is this test binary re-run as a child process (the ignored test
//! [`stale_consumer_child`], selected by `--exact`), talking to the parent on stdin/stdout.
//! Ground truth comes from Redis, not from the child's report: the stale consumer's entry in
//! XINFO CONSUMERS (its seen-time did not move, so no XREADGROUP/XAUTOCLAIM of its ran; it owns
//! nothing), the entries it held are still pending to the new owner (none of its acks landed),
//! and the fence keys are as the coordinator raised them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rsc::client::transport::{CoordinatorTransport, TransportError};
use rsc::client::{Consumer, ConsumerConfig};
use rsc::core::model::{Fence, GroupId, ShardId};
use rsc::core::protocol::{HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse};
use rsc::http::client::{HttpClientConfig, HttpTransport};
use rsc::store::redis::{RedisStore, RedisStoreOptions};
use rsc::store::{keys, EntryId, FenceCheck, ReadFrom, StoreError, StreamStore};

use crate::e2e_support::checks::pending_count;
use crate::e2e_support::fleet::{AppSettings, Fleet};
use crate::e2e_support::process::CoordinatorProcess;
use crate::e2e_support::{fast_config, group, wait_until_explained};
use crate::support::RedisServer;

/// Set (to the child's settings) only in the child process.
const CHILD_ENV: &str = "RSC_E2E_FENCING_CHILD";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_stopped_past_its_lease_reads_acks_and_claims_nothing_after_its_shards_moved() {
    const SHARDS: u32 = 4;
    const MESSAGES: usize = 400;
    let started = Instant::now();
    let redis = RedisServer::start();
    let coordinator = CoordinatorProcess::start(&redis.url(), "e2e-fencing").await;
    let group = group("fencing");
    let config = fast_config();
    assert!(config.fencing, "fencing is on (the default)");
    coordinator.create_group(&group, SHARDS, &config).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], redis.url());

    // The stale consumer alone owns every shard and reads under fences.
    let mut stale = ChildConsumer::spawn(&redis.url(), &coordinator, &group, "stale");
    let producer = fleet.producer("producer").await;
    let production = tokio::spawn(async move {
        producer.publish_paced(0..MESSAGES, 100).await;
        producer
    });
    wait_until_explained(
        "the stale consumer read on every shard",
        Duration::from_secs(20),
        || stale.delivered_shards().len() == SHARDS as usize,
        || stale.output(),
    )
    .await;

    // Freeze it while it holds entries: no heartbeat goes out from now on (it could not send one
    // while stopped either), and it parks before acking the batch in hand. Then SIGSTOP.
    stale.send("FREEZE");
    wait_until_explained(
        "the stale consumer parked holding entries",
        Duration::from_secs(10),
        || stale.parked(),
        || stale.output(),
    )
    .await;
    stale.signal("STOP");
    let stopped_at = Instant::now();
    let held = stale.held();
    assert!(!held.is_empty(), "the stale consumer was stopped holding un-acked entries");
    let stale_fences = stale.fences();
    let held_shards: BTreeSet<ShardId> = held.iter().map(|(s, _)| *s).collect();

    // Its member expires and the shards move: the coordinator raises the fences of the new
    // grants, and the new owner claims what the stopped consumer held.
    let fresh = fleet.consumer("fresh", AppSettings { batch: 500, process_ms: 3_000 }).await;
    let moved = || {
        let now = read_fence_keys(&redis, &group, SHARDS);
        stale_fences.iter().all(|(shard, old)| now[shard].is_some_and(|f| f.counter > old.counter))
            && held.iter().all(|(shard, id)| pending_owner(&redis, &group, *shard, *id).as_deref() == Some("fresh"))
    };
    wait_until_explained(
        "the fences were raised and the new owner claimed every entry the stopped consumer held",
        Duration::from_secs(20),
        moved,
        || format!("held {held:?}; fences {:?}; {}", read_fence_keys(&redis, &group, SHARDS), fleet.explain()),
    )
    .await;
    let fences_after_move = read_fence_keys(&redis, &group, SHARDS);

    // Resume it; it sends what its old grants would: reads, a claim and acks of what it held.
    stale.signal("CONT");
    let resumed_at = Instant::now();
    stale.send("REPLAY");
    wait_until_explained(
        "the stale consumer tried everything",
        Duration::from_secs(10),
        || stale.replay_done(),
        || stale.output(),
    )
    .await;
    let checked_at = Instant::now();

    // Ground truth at Redis, taken before the new owner acks anything it claimed (it holds each
    // batch 3 s): the stale consumer's XINFO CONSUMERS entry did not move since it was stopped,
    // everything it held is still pending to the new owner, and the fence keys are unchanged.
    for shard in 0..SHARDS {
        let (pending, idle_ms) = consumer_info(&redis, &group, shard, "stale").expect("stale is a consumer");
        assert_eq!(pending, 0, "shard {shard}: nothing was read into or left with the stale consumer");
        let since_resume_ms = (Instant::now() - resumed_at).as_millis() as u64;
        assert!(
            idle_ms > since_resume_ms,
            "shard {shard}: the stale consumer was seen by Redis after it resumed (idle {idle_ms} ms, resumed \
             {since_resume_ms} ms ago): one of its reads or claims ran"
        );
    }
    for (shard, id) in &held {
        assert_eq!(
            pending_owner(&redis, &group, *shard, *id).as_deref(),
            Some("fresh"),
            "entry {shard}/{id} held by the stale consumer: its stale ack must not land"
        );
    }
    assert_eq!(read_fence_keys(&redis, &group, SHARDS), fences_after_move, "refusals write no fence");
    {
        let ledger = fleet.ledger.lock();
        let early: Vec<_> = ledger.acked.iter().filter(|a| held.contains(&a.entry) && a.at < checked_at).collect();
        assert!(early.is_empty(), "inconclusive: the new owner acked held entries before the check: {early:?}");
    }
    // The child's own view agrees: every operation was refused as FENCED.
    let attempts = stale.stale_results();
    let ops: BTreeSet<&str> = attempts.iter().map(|(op, _, _)| op.as_str()).collect();
    assert_eq!(ops, ["ack", "claim", "read-new", "read-own"].into_iter().collect(), "{attempts:?}");
    assert_eq!(attempts.iter().map(|(_, s, _)| *s).collect::<BTreeSet<_>>(), held_shards, "every shard it held on");
    for (op, shard, result) in &attempts {
        assert_eq!(result, "fenced", "{op} on shard {shard} after the move");
    }

    // Liveness and delivery: everything published is acked exactly once (by the stale consumer
    // before it stopped, or by the new owner), and the new owner got nothing twice.
    let _producer = production.await.expect("producer task");
    let ledger = fleet.ledger.clone();
    let stale_acked = stale.acked();
    let produced: BTreeSet<(ShardId, EntryId)> = ledger.lock().produced.iter().map(|p| (p.shard, p.entry)).collect();
    assert_eq!(produced.len(), MESSAGES, "{:?}", ledger.lock().publish_failures);
    wait_until_explained(
        "every message acked",
        Duration::from_secs(30),
        || ledger.acked_distinct() + stale_acked.len() >= MESSAGES,
        || fleet.explain(),
    )
    .await;
    {
        let inner = ledger.lock();
        let mut acks: BTreeMap<(ShardId, EntryId), usize> = stale_acked.iter().map(|e| (*e, 1)).collect();
        for a in &inner.acked {
            *acks.entry(a.entry).or_default() += 1;
        }
        let not_once: Vec<_> = acks.iter().filter(|(_, n)| **n != 1).collect();
        assert!(not_once.is_empty(), "entries acked more than once: {not_once:?}");
        assert_eq!(acks.keys().copied().collect::<BTreeSet<_>>(), produced, "every published entry acked");
        let mut fresh_deliveries: BTreeMap<(ShardId, EntryId), usize> = BTreeMap::new();
        for d in inner.delivered.iter().filter(|d| d.member == "fresh") {
            *fresh_deliveries.entry((d.shard, d.entry)).or_default() += 1;
        }
        let twice: Vec<_> = fresh_deliveries.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "the new owner got entries twice: {twice:?}");
        assert_eq!(inner.ack_failures, Vec::<String>::new(), "no ack of the new owner was refused");
    }
    for shard in 0..SHARDS {
        assert_eq!(pending_count(&redis, &group, shard), 0, "shard {shard} has un-acked entries in Redis");
    }
    fresh.close(Duration::from_secs(10)).await;
    drop(stale);
    coordinator.assert_no_error_logged();
    eprintln!(
        "fencing story: stale consumer stopped holding {} entries for {:.1} s; {} stale operations refused; {:.1} s",
        held.len(),
        (resumed_at - stopped_at).as_secs_f64(),
        attempts.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The consumer that owns `(shard, id)` in the pending list, if it is pending.
fn pending_owner(redis: &RedisServer, group: &GroupId, shard: ShardId, id: EntryId) -> Option<String> {
    let id = id.to_string();
    let reply = redis.cmd(&["XPENDING", &group.stream_key(shard), &group.consumer_group, &id, &id, "1"]);
    let rows: Vec<(String, String, u64, u64)> = redis::from_redis_value(reply).expect("XPENDING range");
    rows.into_iter().next().map(|(_, consumer, _, _)| consumer)
}

/// `(pending, idle ms)` of `consumer` in XINFO CONSUMERS of `shard`'s stream.
fn consumer_info(redis: &RedisServer, group: &GroupId, shard: ShardId, consumer: &str) -> Option<(u64, u64)> {
    let reply = redis.cmd(&["XINFO", "CONSUMERS", &group.stream_key(shard), &group.consumer_group]);
    let rows: Vec<BTreeMap<String, redis::Value>> = redis::from_redis_value(reply).expect("XINFO CONSUMERS");
    let row = rows.into_iter().find(|r| {
        r.get("name").and_then(|v| redis::from_redis_value::<String>(v.clone()).ok()).as_deref() == Some(consumer)
    })?;
    let field = |name: &str| redis::from_redis_value::<u64>(row[name].clone()).expect("XINFO CONSUMERS field");
    Some((field("pending"), field("idle")))
}

/// Every shard's fence key as Redis holds it.
fn read_fence_keys(redis: &RedisServer, group: &GroupId, shards: u32) -> BTreeMap<ShardId, Option<Fence>> {
    (0..shards)
        .map(|shard| {
            let reply = redis.cmd(&["HMGET", &keys::fence_key(group, shard), "counter", "nonce"]);
            let (counter, nonce): (Option<String>, Option<String>) = redis::from_redis_value(reply).expect("HMGET");
            let fence = counter.map(|c| format!("{c}.{}", nonce.unwrap_or_default()).parse().expect("fence"));
            (shard, fence)
        })
        .collect()
}

/// The stale consumer: this binary re-run as [`stale_consumer_child`], killed on drop.
struct ChildConsumer {
    child: Child,
    stdin: ChildStdin,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChildConsumer {
    fn spawn(redis_url: &str, coordinator: &CoordinatorProcess, group: &GroupId, member: &str) -> Self {
        let settings =
            [redis_url, &coordinator.addr().to_string(), &group.stream_prefix, &group.consumer_group, member];
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["fencing::stale_consumer_child", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, settings.join("\n"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the stale consumer");
        let stdin = child.stdin.take().expect("child stdin");
        let stdout = child.stdout.take().expect("child stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Self { child, stdin, lines }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush()).expect("write to the child");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{name}");
    }

    /// The child's protocol lines, split in words.
    fn words(&self) -> Vec<Vec<String>> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
    }

    fn output(&self) -> String {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
    }

    fn entries(&self, tag: &str) -> BTreeSet<(ShardId, EntryId)> {
        self.words()
            .iter()
            .filter(|w| w.first().map(String::as_str) == Some(tag) && w.len() >= 3)
            .map(|w| (w[1].parse().expect("shard"), w[2].parse().expect("entry id")))
            .collect()
    }

    fn delivered_shards(&self) -> BTreeSet<ShardId> {
        self.entries("DELIVERED").into_iter().map(|(s, _)| s).collect()
    }

    fn acked(&self) -> BTreeSet<(ShardId, EntryId)> {
        self.entries("ACKED")
    }

    /// Delivered and never acked.
    fn held(&self) -> BTreeSet<(ShardId, EntryId)> {
        let acked = self.acked();
        self.entries("DELIVERED").into_iter().filter(|e| !acked.contains(e)).collect()
    }

    /// The last fence each shard was read under.
    fn fences(&self) -> BTreeMap<ShardId, Fence> {
        let mut fences = BTreeMap::new();
        for w in self.words().iter().filter(|w| w.first().map(String::as_str) == Some("DELIVERED") && w.len() == 4) {
            fences.insert(w[1].parse().expect("shard"), w[3].parse().expect("the shard is read fenced"));
        }
        fences
    }

    fn parked(&self) -> bool {
        self.words().iter().any(|w| w.first().map(String::as_str) == Some("PARKED"))
    }

    fn replay_done(&self) -> bool {
        self.words().iter().any(|w| w.first().map(String::as_str) == Some("STALE-DONE"))
    }

    /// `(operation, shard, result)` of every stale attempt.
    fn stale_results(&self) -> Vec<(String, ShardId, String)> {
        self.words()
            .into_iter()
            .filter(|w| w.first().map(String::as_str) == Some("STALE") && w.len() >= 4)
            .map(|w| (w[1].clone(), w[2].parse().expect("shard"), w[3].clone()))
            .collect()
    }
}

impl Drop for ChildConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A transport the test can cut: once frozen, no heartbeat leaves (the child stops heartbeating
/// right before it is stopped, and never again, so it does not rejoin and take shards back).
struct Freezable {
    inner: HttpTransport,
    frozen: Arc<AtomicBool>,
}

impl CoordinatorTransport for Freezable {
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        if self.frozen.load(Ordering::SeqCst) {
            return Err(TransportError::Unreachable("frozen by the fencing story".into()));
        }
        self.inner.heartbeat(req).await
    }

    async fn routing(&self, group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, TransportError> {
        self.inner.routing(group, report).await
    }
}

/// The stale consumer's process (fails unless started by the story with [`CHILD_ENV`]). Prints
/// `DELIVERED <shard> <id> <fence>`, `ACKED <shard> <id>`, `PARKED <n>`, `STALE <op> <shard>
/// <fenced|ok:..|error:..>` and `STALE-DONE`; reads `FREEZE` and `REPLAY` on stdin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the stale consumer process of the fencing story; it starts this itself"]
async fn stale_consumer_child() {
    // Run directly (`--include-ignored`), it would pass without doing anything: refuse instead.
    let settings = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("only the fencing story runs this, with {CHILD_ENV} set; it tests nothing alone"));
    let parts: Vec<&str> = settings.split('\n').collect();
    let [redis_url, addr, prefix, consumer_group, member] = parts[..] else { panic!("bad child settings") };
    let group = GroupId::new(prefix, consumer_group);
    let store = RedisStore::connect(redis_url, RedisStoreOptions::default()).await.expect("connect");
    let frozen = Arc::new(AtomicBool::new(false));
    let transport = Freezable {
        inner: HttpTransport::new(HttpClientConfig::new(vec![addr.parse().expect("coordinator address")])),
        frozen: frozen.clone(),
    };
    let consumer = Consumer::join(ConsumerConfig::new(group.clone(), member), transport, store.clone());
    // Delivered and not acked: (shard, id) -> the fence it was read under.
    let held: Arc<Mutex<BTreeMap<(ShardId, EntryId), Fence>>> = Arc::default();
    let app = {
        let (held, frozen) = (held.clone(), frozen.clone());
        async move {
            loop {
                let batch = match consumer.poll_wait(20, Duration::from_millis(200)).await {
                    Ok(batch) => batch,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                for d in &batch {
                    let fence = d.fence.map_or("-".to_string(), |f| f.to_string());
                    println!("DELIVERED {} {} {fence}", d.shard, d.entry.id);
                    if let Some(fence) = d.fence {
                        held.lock().unwrap_or_else(|p| p.into_inner()).insert((d.shard, d.entry.id), fence);
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                let holding = held.lock().unwrap_or_else(|p| p.into_inner()).len();
                if frozen.load(Ordering::SeqCst) && holding > 0 {
                    println!("PARKED {holding}");
                    std::future::pending::<()>().await;
                }
                for d in batch {
                    match consumer.ack(&d).await {
                        Ok(()) => println!("ACKED {} {}", d.shard, d.entry.id),
                        Err(e) => println!("ACKFAIL {} {} {e}", d.shard, d.entry.id),
                    }
                    held.lock().unwrap_or_else(|p| p.into_inner()).remove(&(d.shard, d.entry.id));
                }
            }
        }
    };
    tokio::spawn(app);
    // Stdin is read on a thread of its own (tokio's stdin is not compiled in).
    let (commands, mut received) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if commands.send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = received.recv().await {
        match line.trim() {
            "FREEZE" => frozen.store(true, Ordering::SeqCst),
            "REPLAY" => {
                let held = held.lock().unwrap_or_else(|p| p.into_inner()).clone();
                replay(&store, &group, member, &held).await;
                println!("STALE-DONE");
            }
            _ => {}
        }
    }
}

/// What the stale consumer's old grants would send after the pause, with their fences: per shard
/// it held entries on, a read of new entries, a read of its own pending entries, a claim of the
/// others' pending entries, and the acks of what it held.
async fn replay(store: &RedisStore, group: &GroupId, member: &str, held: &BTreeMap<(ShardId, EntryId), Fence>) {
    let mut shards: BTreeMap<ShardId, (Fence, Vec<EntryId>)> = BTreeMap::new();
    for ((shard, id), fence) in held {
        let slot = shards.entry(*shard).or_insert((*fence, Vec::new()));
        slot.0 = slot.0.max(*fence);
        slot.1.push(*id);
    }
    fn report<T: std::fmt::Debug>(op: &str, shard: ShardId, result: Result<T, StoreError>) {
        let text = match result {
            Err(StoreError::Fenced { .. }) => "fenced".to_string(),
            Ok(value) => format!("ok:{value:?}").replace(' ', ""),
            Err(e) => format!("error:{e}").replace(' ', "_"),
        };
        println!("STALE {op} {shard} {text}");
    }
    let cg = group.consumer_group.as_str();
    for (shard, (fence, ids)) in shards {
        let check = FenceCheck { key: keys::fence_key(group, shard), fence };
        let stream = group.stream_key(shard);
        let read = store.fenced_xreadgroup(&check, cg, member, &stream, ReadFrom::New, 100).await;
        report("read-new", shard, read.map(|e| e.len()));
        let own = store.fenced_xreadgroup(&check, cg, member, &stream, ReadFrom::OwnPending, 100).await;
        report("read-own", shard, own.map(|e| e.len()));
        let claim = store.fenced_claim_all_pending(&check, &stream, cg, member, 0).await;
        report("claim", shard, claim.map(|e| e.len()));
        report("ack", shard, store.fenced_xack(&check, &stream, cg, &ids).await);
    }
}
