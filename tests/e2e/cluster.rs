//! The coordinator, consumers and producers on a real Redis Cluster (`support::redis_cluster`, 3
//! primaries with a replica each): a slot moved between primaries under traffic (step by step by
//! the harness, and by `redis-cli --cluster reshard`, also onto a node added to scale out) is not a
//! loss of writes (no identity change, no correction round, nothing lost), and a failover to a replica that missed metadata writes is
//! one (evidence, a correction round, no split, nothing acknowledged lost).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::block_in_place;

use crate::e2e_support::checks::{pending_count, settled, shares_all, versions_in};
use crate::e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, Fleet, ProducerApp};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::{cluster_target, CoordinatorProcess, LONG_LEASES_SERVE_CONFIG};
use crate::e2e_support::{fast_config, group, metric_total, wait_until};
use crate::support::redis_cluster::{ClusterConfig, RedisCluster, SlotMove};
use crate::support::RedisServer;
use rsc::client::events::ClientEvent;
use rsc::core::model::GroupId;
use rsc::core::protocol::{ErrorCode, HeartbeatStatus};
use rsc::store::keys::metadata_key;

/// Publishes per second, per producer.
const PUBLISH_RATE_PER_SECOND: usize = 300;
/// Keys of other applications put into a slot before it moves, so that it moves in several
/// `MIGRATE` batches (a slot holding only the group's few keys would move in one).
const FILLER_KEYS: usize = 200;
/// Keys per `MIGRATE` batch of a step-wise slot move.
const MIGRATE_BATCH_KEYS: usize = 40;
/// Pause before each step of a step-wise slot move: the slot's keys sit on both primaries
/// meanwhile, so clients are redirected (`ASK`) or told to retry (`TRYAGAIN`, multi-key
/// commands).
const MIGRATE_PAUSE: Duration = Duration::from_millis(300);

/// Longest a consumer's read may take during the moves (see the check).
const SLOWEST_READ_MAX: Duration = Duration::from_millis(1_000);

/// [`fast_config`] with a 4 s assignment lease (6 s member TTL). While a slot moves, the Cluster
/// client of each coordinator follows `ASK`s, retries `TRYAGAIN`s and refreshes its slot map
/// dozens of times a second; on a loaded 2-core machine a heartbeat then took over a second, its
/// consumer lost the 1.5 s lease, and an ack of an entry it had abandoned was refused. The test checks that a migration loses and splits nothing and stalls no
/// read ([`SLOWEST_READ_MAX`]), not how little lease slack a busy coordinator needs: the fleet's
/// heartbeats get 2 s (the library's default) and each address 1 s.
fn migration_config() -> rsc::core::model::GroupConfig {
    rsc::core::model::GroupConfig { assignment_lease_ms: 4_000, member_lease_ttl_ms: 6_000, ..fast_config() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_and_producers_spread_over_three_primaries_and_a_slot_migration_under_traffic_loses_nothing() {
    const SHARDS: u32 = 12;
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1);
    let target = cluster_target(&cluster.nodes());
    let first = CoordinatorProcess::start_with_config(&target, "e2e-cluster-1", LONG_LEASES_SERVE_CONFIG).await;
    let second = CoordinatorProcess::start_with_config(&target, "e2e-cluster-2", LONG_LEASES_SERVE_CONFIG).await;
    let group = group("cluster-migration");
    first.create_group(&group, SHARDS, &migration_config()).await;
    let streams_by_primary = streams_by_primary(&cluster, &group, SHARDS);
    assert_eq!(streams_by_primary.len(), 3, "the shard streams land on all three primaries: {streams_by_primary:?}");

    let mut fleet = Fleet::new(group.clone(), vec![first.addr(), second.addr()], target.clone());
    fleet.request_timeout = Duration::from_millis(1_000);
    fleet.heartbeat_timeout_ms = 2_000;
    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    let c = fleet.consumer("charlie", AppSettings::default()).await;
    wait_until("three consumers share the 12 shards", Duration::from_secs(15), || shares_all(&[&a, &b, &c], SHARDS))
        .await;
    let settled_ms = started.elapsed().as_millis();
    let stop = Arc::new(AtomicBool::new(false));
    let producers = [
        spawn_producer(fleet.producer("producer-0").await, 0, stop.clone()),
        spawn_producer(fleet.producer("producer-1").await, 1, stop.clone()),
    ];
    let ledger = fleet.ledger.clone();
    wait_until("1,000 messages acked", Duration::from_secs(20), || ledger.acked_distinct() >= 1_000).await;

    // The busiest shard's stream moves first (with its fence key and gates: they share its
    // slot), then the group's metadata slot (metadata, liveness, mutex), each to another primary.
    let busiest = busiest_shard(&fleet);
    let stream_slot = cluster.slot_of(&group.stream_key(busiest));
    // Each move takes one key of the group across alone first, splitting it from the keys it is
    // used with (the stream from its fence and gate, the metadata from its liveness hash).
    let stream_key = group.stream_key(busiest);
    let (stream_move, ()) = move_slot_step_wise(&cluster, &stream_key, "busiest shard stream", async {}).await;
    // A fourth consumer joins while the metadata is apart from the liveness hash: its join is
    // written (a script naming both keys) during the split, and the rebalance around it.
    let joining = fleet.consumer("delta", AppSettings::default());
    let (metadata_move, d) = move_slot_step_wise(&cluster, &metadata_key(&group), "group metadata", joining).await;
    wait_until("four consumers share the 12 shards", Duration::from_secs(15), || shares_all(&[&a, &b, &c, &d], SHARDS))
        .await;
    // Then the operator's tool, under the same traffic: `redis-cli --cluster reshard` moves the
    // lowest slots of a primary, as many as it takes to carry a shard stream (with its fence key
    // and gates) along with every other key in them.
    // The step-wise moves were no evidence of lost writes.
    assert_no_loss_evidence(&[&first, &second]).await;
    let reshard = block_in_place(|| reshard_a_stream_with_redis_cli(&cluster, &group, SHARDS, None, None));
    // Then scaling out: a new node joins serving no slot, and `redis-cli` moves a shard stream's
    // slots onto it. The coordinators list it as an idle master once they have read it, so this
    // too is a migration between unchanged primaries. The coordinators read the cluster every
    // tick pass (250 ms); a node that appears in the same read as slots that moved since the read
    // before counts those slots (they may have passed through it, DESIGN §11), so each step waits
    // a second for a read, as an operator's steps are apart.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let new_port = block_in_place(|| cluster.add_empty_primary().port());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let scale_out = block_in_place(|| {
        reshard_a_stream_with_redis_cli(&cluster, &group, SHARDS, Some(new_port), Some(reshard.target_port))
    });
    let produced_before = ledger.lock().produced.len();
    wait_until("500 more messages published after the moves", Duration::from_secs(20), || {
        ledger.lock().produced.len() >= produced_before + 500
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    for producer in producers {
        producer.await.expect("producer task");
    }
    let produced = ledger.lock().produced.len();
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    fleet.wait_all_acked(produced, Duration::from_secs(30)).await;

    assert_no_split(&fleet.reads);
    let events = fleet.events();
    let summary = check_delivery(&ledger, &abandoned_entries(&events));
    for shard in 0..SHARDS {
        let node = cluster.node_for_key(&group.stream_key(shard));
        assert_eq!(pending_count(node, &group, shard), 0, "shard {shard} has un-acked entries in Redis");
    }
    assert_ne!(cluster.owner_of_slot(stream_slot).port(), stream_move.source_port, "the stream's slot moved");
    assert_eq!(cluster.owner_of_slot(reshard.slot).port(), reshard.target_port, "redis-cli moved {reshard}");
    assert_eq!(cluster.owner_of_slot(scale_out.slot).port(), new_port, "redis-cli moved {scale_out}");
    // Nor were the reshards: no identity change (a slot caught mid-handover is held by the two
    // primaries handing it over, DESIGN §11; a new node is an idle master), no regression, no client ahead of the store, no
    // correction round, no SYNC_METADATA answered.
    assert_no_loss_evidence(&[&first, &second]).await;
    let synced_at_client = events
        .iter()
        .any(|e| matches!(e, ClientEvent::HeartbeatAnswered { status: HeartbeatStatus::SyncMetadata, .. }));
    assert!(!synced_at_client, "no consumer was told SYNC_METADATA");
    // Nor did the move stall the clients: a read that found its keys split waited about as
    // long as the split lasted ([`MIGRATE_PAUSE`]), not the `redis` crate's default TRYAGAIN
    // back-off (1,280 ms at least, which made this read take 1,282 ms).
    let slowest_read = fleet.reads.calls().iter().map(|r| r.end - r.start).max().unwrap_or_default();
    assert!(slowest_read < SLOWEST_READ_MAX, "a read took {} ms", slowest_read.as_millis());
    let heartbeat_failures: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::HeartbeatFailed { member, error, .. } => Some(format!("{member}: {error}")),
            _ => None,
        })
        .collect();
    eprintln!("slowest read {} ms; heartbeat failures {heartbeat_failures:?}", slowest_read.as_millis());
    let described = first.describe(&group).await;
    assert!(settled(&described, &["alpha", "bravo", "charlie", "delta"], SHARDS), "{described}");
    first.assert_no_error_logged();
    second.assert_no_error_logged();
    // The clients never saw the move as a failure: a command that found its keys split
    // between the two primaries was retried until they were together again.
    assert_eq!(ledger.lock().poll_errors, Vec::<String>::new(), "no poll failed");
    assert_eq!(ledger.lock().ack_failures, Vec::<String>::new(), "no ack failed");
    eprintln!(
        "cluster slot migration: shard streams per primary {:?}; settled {settled_ms} ms after start; {summary}; \
         stream of shard {busiest} (slot {stream_slot}): {stream_move}; metadata \
         (slot {}): {metadata_move}; {reshard}; scale-out {scale_out}; {produced} published in all ({produced_before} before the moves ended); \
         {:.1} s",
        streams_by_primary.values().map(BTreeSet::len).collect::<Vec<_>>(),
        metadata_move.slot,
        started.elapsed().as_secs_f64()
    );
    drop((a, b, c, d));
}

/// No coordinator counted a store identity change, a version regression or a client ahead of the
/// store, or answered SYNC_METADATA (a correction round).
async fn assert_no_loss_evidence(coordinators: &[&CoordinatorProcess]) {
    for coordinator in coordinators {
        let metrics = coordinator.metrics().await;
        let why = || -> String {
            let log = coordinator.log();
            log.lines().filter(|l| l.contains("identity") || l.contains("regress")).collect::<Vec<_>>().join("\n")
        };
        for name in [
            "rsc_store_identity_changes_total",
            "rsc_metadata_version_regressions_total",
            "rsc_client_metadata_version_ahead_total",
        ] {
            assert_eq!(metric_total(&metrics, name), 0.0, "{} counted {name}:\n{}", coordinator.name(), why());
        }
        let synced = metric_labelled(&metrics, "rsc_heartbeats_total", "status=\"SYNC_METADATA\"");
        assert_eq!(synced, 0.0, "{} answered SYNC_METADATA (a correction round):\n{}", coordinator.name(), why());
    }
}

/// What [`reshard_a_stream_with_redis_cli`] moved.
struct Reshard {
    shard: u32,
    slot: u16,
    slots: usize,
    source_port: u16,
    target_port: u16,
    elapsed: Duration,
}

impl std::fmt::Display for Reshard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "redis-cli --cluster reshard: {} slots port {} -> {} (shard {}'s stream, slot {}) in {} ms",
            self.slots,
            self.source_port,
            self.target_port,
            self.shard,
            self.slot,
            self.elapsed.as_millis()
        )
    }
}

/// `redis-cli --cluster reshard` takes its source's lowest-numbered slots: of every shard stream,
/// the one with the fewest slots of its primary at or below its own slot is carried by the
/// smallest such reshard. That many slots move from its primary to the primary on port `to`, or
/// to the next one. Streams served by the primary on port `spare` are left alone: an earlier
/// reshard moved a slot there, and moving that primary's lowest slots again could take it along
/// (the first reshard's slot then ended on the new node, and its check failed now and then).
fn reshard_a_stream_with_redis_cli(
    cluster: &RedisCluster,
    group: &GroupId,
    shards: u32,
    to: Option<u16>,
    spare: Option<u16>,
) -> Reshard {
    let map = cluster.slot_map();
    let owned_up_to = |port: u16, slot: u16| -> usize {
        map.iter()
            .filter(|r| r.primary_port == port && r.start <= slot)
            .map(|r| usize::from(r.end.min(slot) - r.start) + 1)
            .sum()
    };
    let (slots, shard, slot) = (0..shards)
        .map(|shard| (shard, cluster.slot_of(&group.stream_key(shard))))
        .filter(|&(_, slot)| Some(cluster.owner_of_slot(slot).port()) != spare)
        .map(|(shard, slot)| (owned_up_to(cluster.owner_of_slot(slot).port(), slot), shard, slot))
        .min()
        .expect("at least one shard");
    let source = cluster.owner_of_slot(slot);
    let primaries = cluster.primaries();
    let at = primaries.iter().position(|p| p.port() == source.port()).expect("the source is a primary");
    let target = match to {
        Some(port) => cluster.server(port),
        None => primaries[(at + 1) % primaries.len()],
    };
    let elapsed = cluster.reshard_with_redis_cli(source, target, slots);
    let reshard = Reshard { shard, slot, slots, source_port: source.port(), target_port: target.port(), elapsed };
    eprintln!("{reshard}");
    reshard
}

/// The shards whose stream each primary serves, by port.
fn streams_by_primary(cluster: &RedisCluster, group: &GroupId, shards: u32) -> BTreeMap<u16, BTreeSet<u32>> {
    let mut by_primary: BTreeMap<u16, BTreeSet<u32>> = BTreeMap::new();
    for shard in 0..shards {
        by_primary.entry(cluster.node_for_key(&group.stream_key(shard)).port()).or_default().insert(shard);
    }
    by_primary
}

/// The shard with the most acknowledged publishes so far.
fn busiest_shard(fleet: &Fleet) -> u32 {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for produced in &fleet.ledger.lock().produced {
        *counts.entry(produced.shard).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(shard, count)| (*count, std::cmp::Reverse(*shard))).expect("something published").0
}

/// Publishes `key-<i>` for `i = offset, offset + 2, ...` at [`PUBLISH_RATE_PER_SECOND`], in
/// bursts every 50 ms, until `stop` is set.
fn spawn_producer(producer: ProducerApp, offset: usize, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let burst = PUBLISH_RATE_PER_SECOND / 20;
        let mut i = offset;
        let mut due = tokio::time::Instant::now();
        while !stop.load(Ordering::SeqCst) {
            for _ in 0..burst {
                producer.publish(i).await;
                i += 2;
            }
            due += Duration::from_millis(50);
            tokio::time::sleep_until(due).await;
        }
    })
}

/// What one step-wise slot move did.
struct MoveReport {
    slot: u16,
    source_port: u16,
    target_port: u16,
    batches: usize,
    keys: usize,
    elapsed: Duration,
    /// `ASKING` commands the target answered during the move (each a client following `ASK`).
    asking_calls: u64,
    /// `TRYAGAIN` errors the source sent during the move (multi-key commands on split keys).
    tryagain_errors: u64,
}

impl std::fmt::Display for MoveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "port {} -> {} in {} batches ({} keys) over {} ms, {} ASKING at the target, {} TRYAGAIN",
            self.source_port,
            self.target_port,
            self.batches,
            self.keys,
            self.elapsed.as_millis(),
            self.asking_calls,
            self.tryagain_errors
        )
    }
}

/// Moves the slot of `key` to another primary (the first other one the cluster lists)
/// step-wise, after filling the slot with [`FILLER_KEYS`] keys of another application: `key`
/// alone first, then the group's other keys of the slot, then the fillers in
/// [`MIGRATE_BATCH_KEYS`]-key batches, with [`MIGRATE_PAUSE`] before each step. So `key` is apart
/// from the keys it is used with for one pause: commands naming both get `TRYAGAIN` for that
/// long, which must be shorter than the store's deadline (a split longer than the deadline fails
/// such commands as `Unavailable` until it ends: Redis answers nothing else meanwhile).
/// `while_split` starts right after `key` moved alone and the move goes on without waiting for
/// it; its output comes back with the report.
/// Each harness step blocks its worker thread (the harness is synchronous) for a few
/// milliseconds; the pauses do not.
async fn move_slot_step_wise<T>(
    cluster: &RedisCluster,
    key: &str,
    what: &str,
    while_split: impl std::future::Future<Output = T>,
) -> (MoveReport, T) {
    let slot = cluster.slot_of(key);
    let (slot_move, asking_before, tryagain_before) = block_in_place(|| {
        let source = cluster.owner_of_slot(slot);
        let fillers: Vec<String> = (0..FILLER_KEYS).map(|i| format!("{{{}}}:filler:{i}", hash_tag(key))).collect();
        assert!(fillers.iter().all(|f| cluster.slot_of(f) == slot), "filler keys share the slot of {key}");
        let mut mset = vec!["MSET"];
        for filler in &fillers {
            mset.extend([filler.as_str(), "x"]);
        }
        source.cmd(&mset);
        let to = *cluster.primaries().iter().find(|p| p.port() != source.port()).expect("another primary");
        let counters = (asking_calls(to), tryagain_errors(source));
        let slot_move: SlotMove = cluster.begin_slot_move(slot, to).expect("the target does not own the slot");
        (slot_move, counters.0, counters.1)
    });
    let (source_port, target_port) = (slot_move.source_port, slot_move.target_port);
    let moving = Instant::now();
    tokio::time::sleep(MIGRATE_PAUSE).await;
    block_in_place(|| cluster.migrate_named_keys(&slot_move, &[key]));
    let rest = async {
        tokio::time::sleep(MIGRATE_PAUSE).await;
        let partners = block_in_place(|| group_keys_left(cluster, &slot_move));
        let names: Vec<&str> = partners.iter().map(String::as_str).collect();
        block_in_place(|| cluster.migrate_named_keys(&slot_move, &names));
        let (mut batches, mut keys) = (2, 1 + partners.len());
        loop {
            tokio::time::sleep(MIGRATE_PAUSE).await;
            let moved = block_in_place(|| cluster.migrate_slot_keys(&slot_move, MIGRATE_BATCH_KEYS));
            if moved == 0 {
                break (batches, keys);
            }
            batches += 1;
            keys += moved;
        }
    };
    let ((batches, keys), output) = tokio::join!(rest, while_split);
    block_in_place(|| cluster.finish_slot_move(slot_move));
    let report = MoveReport {
        slot,
        source_port,
        target_port,
        batches,
        keys,
        elapsed: moving.elapsed(),
        asking_calls: block_in_place(|| asking_calls(cluster.server(target_port))) - asking_before,
        tryagain_errors: block_in_place(|| tryagain_errors(cluster.server(source_port))) - tryagain_before,
    };
    assert!(report.batches >= 3, "{what}: the slot moved in several batches: {report}");
    // Clients touched the slot while it was split (an ASK followed, or a multi-key command met
    // split keys): else the "under traffic" part of the move tested nothing.
    assert!(report.asking_calls > 0 || report.tryagain_errors > 0, "{what}: no client met the split slot: {report}");
    eprintln!("moved the slot of the {what}: {report}");
    (report, output)
}

/// The keys of the moving slot still on its source that are not [`FILLER_KEYS`]: the group's.
fn group_keys_left(cluster: &RedisCluster, slot_move: &SlotMove) -> Vec<String> {
    let source = cluster.server(slot_move.source_port);
    let slot = slot_move.slot.to_string();
    let keys: Vec<String> = redis::from_redis_value(source.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100000"]))
        .expect("GETKEYSINSLOT answers key names");
    keys.into_iter().filter(|k| !k.contains(":filler:")).collect()
}

/// The part of `key` Redis Cluster hashes: its `{hash tag}` if it has a non-empty one.
fn hash_tag(key: &str) -> &str {
    let tagged = key.find('{').and_then(|open| {
        let close = open + 1 + key[open + 1..].find('}')?;
        (close > open + 1).then(|| &key[open + 1..close])
    });
    tagged.unwrap_or(key)
}

/// `calls` of `cmdstat_asking` in `INFO commandstats` (0 before the first).
pub(crate) fn asking_calls(node: &RedisServer) -> u64 {
    info_counter(node, "commandstats", "cmdstat_asking", "calls")
}

/// `count` of `errorstat_TRYAGAIN` in `INFO errorstats` (0 before the first).
fn tryagain_errors(node: &RedisServer) -> u64 {
    info_counter(node, "errorstats", "errorstat_TRYAGAIN", "count")
}

fn info_counter(node: &RedisServer, section: &str, line: &str, field: &str) -> u64 {
    let Some(stats) = node.info_field(section, line) else { return 0 };
    stats
        .split(',')
        .find_map(|pair| pair.strip_prefix(field)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("{line} has no {field}: {stats}"))
}

/// Sum of the samples of `name` whose labels contain `label` (e.g. `status="OK"`).
fn metric_labelled(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') && rest.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A primary that stops answering — frozen (SIGSTOP: its sockets stay open, nothing answers), as a
/// crashed primary is until its replica takes over, one without a replica for good, or one cut
/// off from the coordinator alone — costs only the groups whose keys it holds. Its group's
/// heartbeats fail, which makes the coordinator suspect the store's identity; a whole identity read
/// needs every primary, and before each group asked its own primary alone, every heartbeat of
/// every group was then refused `STORE_UNAVAILABLE` until the frozen primary answered again: a
/// bystander group whose keys and streams live on the other primaries lost its leases with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_primary_stops_only_the_groups_it_holds() {
    // No replicas, and a node timeout well above the freeze: nothing fails over, and the cluster
    // never marks the frozen node failed (with full coverage required, that would stop every slot).
    let cluster = RedisCluster::start_with(ClusterConfig { node_timeout_ms: 30_000, ..ClusterConfig::new(3, 0) });
    let frozen_group = group("cluster-frozen");
    let frozen = cluster.node_for_key(&metadata_key(&frozen_group));
    // The bystander's metadata and both shard streams on the other primaries.
    let bystander = (0..)
        .map(|i| crate::e2e_support::group(&format!("cluster-frozen-bystander-{i}")))
        .find(|g| {
            let keys = [metadata_key(g), g.stream_key(0), g.stream_key(1)];
            keys.iter().all(|key| cluster.node_for_key(key).port() != frozen.port())
        })
        .expect("a group on the other primaries");
    let target = cluster_target(&cluster.nodes());
    let coordinator = CoordinatorProcess::start(&target, "e2e-cluster-frozen").await;
    coordinator.create_group(&frozen_group, 2, &fast_config()).await;
    coordinator.create_group(&bystander, 2, &fast_config()).await;
    let frozen_fleet = Fleet::new(frozen_group.clone(), vec![coordinator.addr()], target.clone());
    let bystanders = Fleet::new(bystander.clone(), vec![coordinator.addr()], target.clone());
    let g = frozen_fleet.consumer("gamma", AppSettings::default()).await;
    let d = bystanders.consumer("delta", AppSettings::default()).await;
    wait_until("gamma owns its group's 2 shards", Duration::from_secs(15), || shares_all(&[&g], 2)).await;
    wait_until("delta owns the bystander's 2 shards", Duration::from_secs(15), || shares_all(&[&d], 2)).await;

    let cut_ms = bystanders.clock.now_ms();
    frozen.freeze();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let thawed_ms = bystanders.clock.now_ms();
    let still_owned = shares_all(&[&d], 2);
    frozen.thaw();

    let during = |e: &ClientEvent| e.at_ms() > cut_ms && e.at_ms() < thawed_ms;
    let gamma_failed = frozen_fleet
        .events()
        .iter()
        .filter(|e| during(e))
        .any(|e| matches!(e, ClientEvent::HeartbeatFailed { member, .. } if member == "gamma"));
    assert!(gamma_failed, "the frozen primary's group was refused while it was frozen\n{}", frozen_fleet.explain());
    let delta: Vec<String> = bystanders
        .events()
        .iter()
        .filter(|e| during(e))
        .filter_map(|e| match e {
            ClientEvent::HeartbeatAnswered { status, .. } => Some(format!("{status:?}")),
            ClientEvent::HeartbeatFailed { error, .. } => Some(format!("failed: {error}")),
            _ => None,
        })
        .collect();
    // 6 s at a 200 ms interval: about 30 heartbeats.
    assert!(delta.len() >= 15, "delta kept heartbeating: {delta:?}");
    assert!(
        delta.iter().all(|status| status == "Ok"),
        "a group on the other primaries was refused while one primary was frozen: {delta:?}\n{}",
        bystanders.explain()
    );
    assert!(still_owned, "delta kept the bystander's shards throughout\n{}", bystanders.explain());
    // Thawed, the frozen primary's group is served again.
    wait_until("gamma owns its group's 2 shards again", Duration::from_secs(20), || shares_all(&[&g], 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_failover_that_loses_writes_drives_a_correction_round_without_a_split() {
    const SHARDS: u32 = 8;
    let started = Instant::now();
    let cluster = RedisCluster::start(3, 1);
    // Acknowledged stream entries on the failed primary would be lost by Redis itself (the
    // replica never got them), which no coordinator can prevent: the shard streams' slots are
    // moved off the metadata primary first, so the loss is metadata only.
    let group = group("cluster-failover");
    let (primary_port, slots_moved) = keep_streams_off_the_metadata_primary(&cluster, &group, SHARDS);
    let primary = cluster.server(primary_port);
    let replica = cluster.replicas_of(primary)[0];
    let key = metadata_key(&group);
    let versions_on =
        |node: &RedisServer| versions_in(cluster.read_on(node, &["HMGET", &key, "revision", "aggregate"]));

    let target = cluster_target(&cluster.nodes());
    let coordinator = CoordinatorProcess::start(&target, "e2e-cluster-failover").await;
    let lease_ms = fast_config().assignment_lease_ms;
    coordinator.create_group(&group, SHARDS, &fast_config()).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], target.clone());
    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    wait_until("two consumers share the 8 shards", Duration::from_secs(15), || shares_all(&[&a, &b], SHARDS)).await;
    // A bystander: a group whose keys another primary serves. The failover costs it no write, so
    // it must run no correction round (the evidence is mapped to the failed primary's slots).
    let bystander = (0..)
        .map(|i| crate::e2e_support::group(&format!("cluster-bystander-{i}")))
        .find(|g| cluster.node_for_key(&metadata_key(g)).port() != primary_port)
        .expect("a group on another primary");
    coordinator.create_group(&bystander, 2, &fast_config()).await;
    let bystanders = Fleet::new(bystander.clone(), vec![coordinator.addr()], target.clone());
    let d = bystanders.consumer("delta", AppSettings::default()).await;
    wait_until("delta owns the bystander's 2 shards", Duration::from_secs(15), || shares_all(&[&d], 2)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = spawn_producer(fleet.producer("producer").await, 0, stop.clone());
    let ledger = fleet.ledger.clone();
    wait_until("500 messages acked", Duration::from_secs(20), || ledger.acked_distinct() >= 500).await;
    wait_until("the replica caught up", Duration::from_secs(10), || versions_on(replica) == versions_on(primary)).await;

    block_in_place(|| cluster.cut_replication(primary));
    // Bytes already forwarded may still be applied for a moment: the replica is read after a
    // pause of our own.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (replicated_revision, replicated_version) = versions_on(replica).expect("the replica has the group");

    // A join and its rebalance, recorded on the primary only.
    let c = fleet.consumer("charlie", AppSettings::default()).await;
    wait_until("three consumers share the 8 shards", Duration::from_secs(15), || shares_all(&[&a, &b, &c], SHARDS))
        .await;
    let reads = fleet.reads.clone();
    wait_until("charlie reads", Duration::from_secs(5), || reads.calls().iter().any(|r| r.member == "charlie")).await;
    let (primary_revision, primary_version) = versions_on(primary).expect("the primary has the group");
    assert_eq!(versions_on(replica), Some((replicated_revision, replicated_version)), "replication is cut");
    assert!(
        primary_revision > replicated_revision && primary_version > replicated_version,
        "the primary recorded more: revision {primary_revision} vs {replicated_revision}, version {primary_version} \
         vs {replicated_version}"
    );
    let seen_version = fleet.highest_version_seen();
    assert!(seen_version > replicated_version, "clients saw versions the replica never got");

    // Failover: the replica takes the slots over without those writes. Until the old primary
    // hears of it (at the latest when `failover_takeover` returns: every node agrees then), it
    // still serves the old history, and a heartbeat it answers may be OK; every heartbeat sent
    // after that is answered from the promoted replica's history.
    let cut_ms = fleet.clock.now_ms();
    let bystander_cut_ms = bystanders.clock.now_ms();
    block_in_place(|| cluster.failover_takeover(replica));
    let agreed_ms = fleet.clock.now_ms();

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = coordinator.try_describe(&group).await;
        let described = if answer.status == 200 { answer.json() } else { serde_json::Value::Null };
        if settled(&described, &["alpha", "bravo", "charlie"], SHARDS) && shares_all(&[&a, &b, &c], SHARDS) {
            break;
        }
        let body = String::from_utf8_lossy(&answer.body);
        assert!(Instant::now() < deadline, "no convergence after the failover: {body}\n{}", fleet.explain());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let converged_ms = fleet.clock.now_ms() - cut_ms;

    // The coordinator saw the evidence: a new cluster identity (and clients ahead of the store).
    let metrics = coordinator.metrics().await;
    let identity_changes = metric_total(&metrics, "rsc_store_identity_changes_total");
    assert!(identity_changes >= 1.0, "{metrics}");
    let ahead = metric_total(&metrics, "rsc_client_metadata_version_ahead_total");
    let events = fleet.events();
    let after_cut = |e: &&ClientEvent| e.at_ms() > cut_ms;
    for member in ["alpha", "bravo"] {
        let synced = events.iter().filter(after_cut).any(|e| {
            matches!(e, ClientEvent::HeartbeatAnswered { member: m, status: HeartbeatStatus::SyncMetadata, .. } if m == member)
        });
        assert!(synced, "{member} received SYNC_METADATA");
    }
    let charlie_unknown = events.iter().filter(after_cut).any(|e| {
        matches!(e, ClientEvent::HeartbeatFailed { member, error, .. }
            if member == "charlie" && error.code() == Some(ErrorCode::UnknownMember))
    });
    assert!(charlie_unknown, "the member that joined in the lost history is unknown to the store and rejoins");
    // No OK from the promoted history until one full assignment lease after the failover began.
    let mut old_history_oks = 0;
    for event in &events {
        if let ClientEvent::HeartbeatAnswered { status: HeartbeatStatus::Ok, sent_at_ms, at_ms, member, .. } = event {
            if *sent_at_ms > agreed_ms {
                assert!(*at_ms >= cut_ms + lease_ms, "{member} got OK {} ms after the failover", at_ms - cut_ms);
            } else if *sent_at_ms > cut_ms && *at_ms < cut_ms + lease_ms {
                old_history_oks += 1;
            }
        }
    }
    let first_ok_ms = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::HeartbeatAnswered { status: HeartbeatStatus::Ok, sent_at_ms, at_ms, .. }
                if *sent_at_ms > agreed_ms =>
            {
                Some(at_ms - cut_ms)
            }
            _ => None,
        })
        .min()
        .expect("an OK after the failover");
    let described = coordinator.describe(&group).await;
    let final_version = described["metadata"]["metadataVersion"].as_u64().expect("version");
    assert!(final_version > seen_version, "version {final_version} reuses a lost one (clients saw {seen_version})");
    // The bystander on an unchanged primary: no correction round, no SYNC_METADATA, still owned.
    let bystander_statuses: Vec<HeartbeatStatus> = bystanders
        .events()
        .iter()
        .filter_map(|e| match e {
            ClientEvent::HeartbeatAnswered { status, at_ms, .. } if *at_ms > bystander_cut_ms => Some(*status),
            _ => None,
        })
        .collect();
    assert!(bystander_statuses.len() >= 3, "delta kept heartbeating: {bystander_statuses:?}");
    // A round answers SYNC_METADATA, then REVOKE_PENDING until it ends.
    assert!(
        bystander_statuses.iter().all(|status| *status == HeartbeatStatus::Ok),
        "a group on another primary ran a correction round: {bystander_statuses:?}\n{}",
        bystanders.explain()
    );
    let bystander_described = coordinator.describe(&bystander).await;
    assert!(bystander_described["metadata"]["correction"].is_null(), "{bystander_described}");
    assert!(shares_all(&[&d], 2), "delta still owns the bystander's shards");

    // Nothing acknowledged is lost: the producer kept publishing throughout.
    let produced_before = ledger.lock().produced.len();
    wait_until("300 more messages published after convergence", Duration::from_secs(20), || {
        ledger.lock().produced.len() >= produced_before + 300
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    producer.await.expect("producer task");
    let produced = ledger.lock().produced.len();
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    fleet.wait_all_acked(produced, Duration::from_secs(30)).await;
    assert_no_split(&fleet.reads);
    let summary = check_delivery(&ledger, &abandoned_entries(&fleet.events()));
    for shard in 0..SHARDS {
        let node = cluster.node_for_key(&group.stream_key(shard));
        assert_eq!(pending_count(node, &group, shard), 0, "shard {shard} has un-acked entries in Redis");
    }
    coordinator.assert_no_error_logged();
    eprintln!(
        "cluster failover: metadata on port {primary_port} ({slots_moved} stream slots moved off it), replica {} took over in {} ms ({old_history_oks} OK \
         answered meanwhile from the old history); replica had \
         revision {replicated_revision} / version {replicated_version}, primary lost {} revisions up to version \
         {primary_version}; identity changes {identity_changes}, client-ahead heartbeats {ahead}; first OK \
         {first_ok_ms} ms after the failover began; converged in {converged_ms} ms at version {final_version}; \
         {summary}; {:.1} s",
        replica.port(),
        agreed_ms - cut_ms,
        primary_revision - replicated_revision,
        started.elapsed().as_secs_f64()
    );
    drop((a, b, c, d));
}

/// Moves the (still empty) slots of `group`'s shard streams that live on the primary of its
/// metadata key to the other primaries, so that the metadata primary serves none of them;
/// returns that primary's port and how many slots moved.
fn keep_streams_off_the_metadata_primary(cluster: &RedisCluster, group: &GroupId, shards: u32) -> (u16, usize) {
    let metadata_port = cluster.node_for_key(&metadata_key(group)).port();
    let others: Vec<&RedisServer> = cluster.primaries().into_iter().filter(|p| p.port() != metadata_port).collect();
    let mut moved = 0;
    for shard in 0..shards {
        let slot = cluster.slot_of(&group.stream_key(shard));
        if cluster.owner_of_slot(slot).port() == metadata_port {
            cluster.move_slot(slot, others[moved % others.len()]);
            moved += 1;
        }
    }
    let streams = streams_by_primary(cluster, group, shards);
    assert!(!streams.contains_key(&metadata_port), "the metadata primary serves no shard stream: {streams:?}");
    (metadata_port, moved)
}
