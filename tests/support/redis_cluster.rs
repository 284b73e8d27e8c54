//! A real Redis Cluster on 127.0.0.1 for integration tests: `primaries × (1 + replicas)` nodes,
//! each a [`RedisServer`] in cluster mode, with the slot map formed directly (no `redis-cli`).
//!
//! Owns its nodes; dropping the cluster drops every [`RedisServer`], which SIGKILLs its process
//! and removes its directory (also when the test panics). Never touches a node it did not start.
//! Every helper that changes the topology returns only once every node reports
//! `cluster_state:ok`, knows every node, and returns the same `CLUSTER SLOTS` map; on a timeout
//! it panics with the map each node holds and the tail of each node's log.
//!
//! Forming: each node gets its own config epoch, primaries claim their slot ranges with
//! `CLUSTER ADDSLOTSRANGE`, every pair `CLUSTER MEET`s, and replicas `CLUSTER REPLICATE`.
//! That takes a few milliseconds; the start-up time (about 2 s) is set by Redis itself: a
//! primary keeps `cluster_state:fail` for 2 s after it started (`CLUSTER_WRITABLE_DELAY`), so
//! `redis-cli --cluster create` (which also sleeps 1 s while polling) is no faster.
//!
//! Losing acknowledged writes: every replica authenticates to its primary as the ACL user
//! [`REPLICATION_USER`]. [`RedisCluster::cut_replication`] disables that user on a primary and
//! kills its replicas' links, so the replicas keep retrying and failing `AUTH` while the primary
//! acknowledges writes that reach no replica; [`RedisCluster::failover_takeover`] then promotes
//! a replica without them. Clients (default user) and the cluster bus are unaffected. A proxy on
//! the replication link does not work in cluster mode: a replica connects to the address its
//! primary announces, which is also the address every client is redirected to.
//!
//! TLS ([`RedisCluster::start_tls`]): every node listens only on a TLS port (`port 0`), with one
//! CA for the whole cluster (`support::tls`, generated into a directory the cluster owns), and
//! speaks TLS on the cluster bus and the replication link too (`tls-cluster`,
//! `tls-replication`). Between nodes each presents the generated *client* certificate
//! (`tls-client-cert-file`): the server certificate is for server authentication only, which a
//! node asking for client certificates would refuse. The harness's own commands go through
//! [`RedisServer`]'s TLS admin client, and [`RedisCluster::nodes`] are `rediss://` URLs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redis::Value;

use super::redis_server::{RedisServer, ServerConfig, TlsClientAuth};
use super::tls::TlsFiles;

/// Hash slots of a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;
/// The ACL user replicas authenticate to their primary as (`masteruser`).
pub const REPLICATION_USER: &str = "rsc-repl";
const REPLICATION_PASSWORD: &str = "rsc-repl-password";
/// How long forming, a failover or a slot move may take to converge on every node.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// `MIGRATE` timeout, per batch.
const MIGRATE_TIMEOUT_MS: u64 = 5_000;
/// Attempts to start a node when the bus port picked was taken in the meantime.
const BUS_PORT_ATTEMPTS_MAX: usize = 3;
/// Keys per `MIGRATE` in [`RedisCluster::move_slot`].
const MIGRATE_BATCH_MAX: usize = 100;

/// How a cluster is started.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub primaries: usize,
    pub replicas_per_primary: usize,
    /// `cluster-node-timeout`: how long a node may not answer before it is flagged as failing.
    /// Short, so that tests of automatic failover are quick, but not so short that a node
    /// starved of CPU on a busy test machine is declared failed (which fails the whole cluster).
    pub node_timeout_ms: u64,
    /// TLS only, with `tls-auth-clients` set to this; `None`: plain TCP.
    pub tls: Option<TlsClientAuth>,
}

impl ClusterConfig {
    pub fn new(primaries: usize, replicas_per_primary: usize) -> Self {
        ClusterConfig { primaries, replicas_per_primary, node_timeout_ms: 2_000, tls: None }
    }
}

/// One row of a node's `CLUSTER SLOTS` answer, by port; replicas sorted, so that the maps of
/// two nodes compare equal when they agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
    pub primary_port: u16,
    pub replica_ports: Vec<u16>,
}

/// A slot being moved: `IMPORTING` on the target, `MIGRATING` on the source, keys not all moved.
#[derive(Debug)]
#[must_use = "finish the move with RedisCluster::finish_slot_move"]
pub struct SlotMove {
    pub slot: u16,
    pub source_port: u16,
    pub target_port: u16,
}

/// A running Redis Cluster.
pub struct RedisCluster {
    /// Primaries first (`0..primaries`), then the replicas of primary 0, of primary 1, ...
    nodes: Vec<RedisServer>,
    /// `CLUSTER MYID` of `nodes[i]`.
    ids: Vec<String>,
    /// `cluster-port` (the cluster bus) of `nodes[i]`.
    bus_ports: Vec<u16>,
    /// The directory holding the TLS files every node shares (removed on drop), and the files.
    tls: Option<(PathBuf, TlsFiles)>,
    /// How its nodes were started (a node added later is started the same way).
    config: ClusterConfig,
}

impl RedisCluster {
    /// `primaries` primaries with `replicas_per_primary` replicas each, slots split evenly.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Self {
        Self::start_with(ClusterConfig::new(primaries, replicas_per_primary))
    }

    /// [`Self::start`] speaking only TLS, everywhere (see the module doc), with
    /// `tls-auth-clients` set to `auth`.
    pub fn start_tls(primaries: usize, replicas_per_primary: usize, auth: TlsClientAuth) -> Self {
        Self::start_with(ClusterConfig { tls: Some(auth), ..ClusterConfig::new(primaries, replicas_per_primary) })
    }

    pub fn start_with(config: ClusterConfig) -> Self {
        assert!(config.primaries >= 1, "a cluster needs at least one primary");
        let count = config.primaries * (1 + config.replicas_per_primary);
        let tls = config.tls.map(|_| {
            let dir = super::redis_server::fresh_dir();
            let files = super::tls::generate(&dir);
            (dir, files)
        });
        let tls_files = tls.as_ref().map(|(_, files)| files);
        let nodes: Vec<RedisServer> = std::thread::scope(|scope| {
            let spawning: Vec<_> = (0..count).map(|_| scope.spawn(|| start_node(&config, tls_files))).collect();
            spawning.into_iter().map(|s| s.join().expect("a node failed to start")).collect()
        });
        let ids: Vec<String> = nodes.iter().map(|n| text(n.cmd(&["CLUSTER", "MYID"]))).collect();
        let bus_ports = nodes.iter().map(bus_port).collect();
        let cluster = RedisCluster { nodes, ids, bus_ports, tls, config };
        cluster.form(&cluster.config);
        cluster
    }

    fn form(&self, config: &ClusterConfig) {
        let secret = format!(">{REPLICATION_PASSWORD}");
        for (i, node) in self.nodes.iter().enumerate() {
            node.cmd(&["ACL", "SETUSER", REPLICATION_USER, "on", &secret, "~*", "&*", "+@all"]);
            // Distinct epochs up front, as `redis-cli --cluster create` does: no collisions to
            // resolve, and every primary's claim on its slots is accepted at once.
            node.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
        }
        let mut expected = Vec::new();
        for (i, node) in self.nodes[..config.primaries].iter().enumerate() {
            let start = i * SLOT_COUNT as usize / config.primaries;
            let end = (i + 1) * SLOT_COUNT as usize / config.primaries - 1;
            node.cmd(&["CLUSTER", "ADDSLOTSRANGE", &start.to_string(), &end.to_string()]);
            let replicas: BTreeSet<u16> = self.replica_indices_of(config, i).map(|r| self.nodes[r].port()).collect();
            let replicas = replicas.into_iter().collect();
            let primary_port = node.port();
            expected.push(SlotRange { start: start as u16, end: end as u16, primary_port, replica_ports: replicas });
        }
        // Every pair meets, so nobody waits for gossip to introduce the others.
        for (i, node) in self.nodes.iter().enumerate() {
            for (other, other_bus) in self.nodes.iter().zip(&self.bus_ports).skip(i + 1) {
                node.cmd(&["CLUSTER", "MEET", "127.0.0.1", &other.port().to_string(), &other_bus.to_string()]);
            }
        }
        for primary in 0..config.primaries {
            for r in self.replica_indices_of(config, primary) {
                self.wait_until("a replica knows its primary", || {
                    self.nodes[r]
                        .try_cmd(&["CLUSTER", "REPLICATE", &self.ids[primary]])
                        .map(drop)
                        .map_err(|e| e.to_string())
                });
            }
        }
        if config.replicas_per_primary > 0 {
            self.wait_until("every replica synced", || self.replicas_in_sync());
            // `CLUSTER SLOTS` lists only replicas with a replication offset above 0, which an
            // empty primary's stream reaches only at its next replica ping (10 s by default).
            // FLUSHALL is replicated even on an empty primary.
            for primary in &self.nodes[..config.primaries] {
                primary.cmd(&["FLUSHALL"]);
            }
        }
        self.wait_until("the cluster formed", || {
            let map = self.agreed_slot_map()?;
            if map != expected {
                return Err(format!("slot map {map:?}, expected {expected:?}"));
            }
            self.replicas_in_sync()
        });
    }

    fn replica_indices_of(&self, config: &ClusterConfig, primary: usize) -> impl Iterator<Item = usize> {
        let first = config.primaries + primary * config.replicas_per_primary;
        first..first + config.replicas_per_primary
    }

    /// Starts one more node and makes it a primary serving no slot, as `redis-cli --cluster
    /// add-node` does (one `CLUSTER MEET`; gossip tells the others). Returns it once every node
    /// knows it and the slot maps agree: the first step of scaling out, before slots move onto it.
    pub fn add_empty_primary(&mut self) -> &RedisServer {
        let tls_files = self.tls.as_ref().map(|(_, files)| files.clone());
        let node = start_node(&self.config, tls_files.as_ref());
        let secret = format!(">{REPLICATION_PASSWORD}");
        node.cmd(&["ACL", "SETUSER", REPLICATION_USER, "on", &secret, "~*", "&*", "+@all"]);
        let (id, bus) = (text(node.cmd(&["CLUSTER", "MYID"])), bus_port(&node));
        self.nodes[0].cmd(&["CLUSTER", "MEET", "127.0.0.1", &node.port().to_string(), &bus.to_string()]);
        self.nodes.push(node);
        self.ids.push(id);
        self.bus_ports.push(bus);
        self.wait_converged();
        self.nodes.last().expect("just added")
    }

    /// Seed URLs of every node, `redis://127.0.0.1:<port>` (`rediss://` with TLS), for a cluster
    /// client.
    pub fn nodes(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The CA, server and client certificates every node of a TLS cluster uses.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|(_, files)| files)
    }

    /// Every node, in start order (primaries first); roles may have changed since.
    pub fn servers(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes that are primaries now (`role:master`).
    pub fn primaries(&self) -> Vec<&RedisServer> {
        self.nodes.iter().filter(|n| role(n) == "master").collect()
    }

    /// The nodes that are replicas now (`role:slave`).
    pub fn replicas(&self) -> Vec<&RedisServer> {
        self.nodes.iter().filter(|n| role(n) == "slave").collect()
    }

    /// The replicas following `primary` now.
    pub fn replicas_of(&self, primary: &RedisServer) -> Vec<&RedisServer> {
        let port = primary.port().to_string();
        self.replicas()
            .into_iter()
            .filter(|r| r.info_field("replication", "master_port").as_deref() == Some(port.as_str()))
            .collect()
    }

    /// The node on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.nodes.iter().find(|n| n.port() == port).unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// `CLUSTER MYID` of `node`.
    pub fn id_of(&self, node: &RedisServer) -> &str {
        let index = self.nodes.iter().position(|n| n.port() == node.port()).expect("a node of this cluster");
        &self.ids[index]
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`: CRC16 of the key or of its `{hash tag}`).
    pub fn slot_of(&self, key: &str) -> u16 {
        match self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) {
            Value::Int(slot) => u16::try_from(slot).expect("a slot fits u16"),
            other => panic!("CLUSTER KEYSLOT answered {other:?}"),
        }
    }

    /// The slot map every node agrees on (panics if they do not agree now).
    pub fn slot_map(&self) -> Vec<SlotRange> {
        self.agreed_slot_map().unwrap_or_else(|e| panic!("{e}\n{}", self.log_tails()))
    }

    /// The primary serving `slot` in the agreed slot map.
    pub fn owner_of_slot(&self, slot: u16) -> &RedisServer {
        let map = self.slot_map();
        let range = map.iter().find(|r| (r.start..=r.end).contains(&slot)).expect("every slot is served");
        self.server(range.primary_port)
    }

    /// The primary serving `key`'s slot.
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        self.owner_of_slot(self.slot_of(key))
    }

    /// Waits until every node is `cluster_state:ok`, knows every node, and all maps agree.
    pub fn wait_converged(&self) {
        self.wait_until("the cluster converged", || self.agreed_slot_map().map(drop));
    }

    /// `CLUSTER FAILOVER TAKEOVER` on `replica`: it becomes a primary at once, without its
    /// primary's agreement and without waiting for the writes its primary acknowledged since the
    /// link last delivered. Returns once every node agrees it serves its old primary's slots.
    pub fn failover_takeover(&self, replica: &RedisServer) {
        let old_primary_port = replica
            .info_field("replication", "master_port")
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("node on port {} is not a replica", replica.port()));
        let slots: Vec<(u16, u16)> =
            self.slot_map().iter().filter(|r| r.primary_port == old_primary_port).map(|r| (r.start, r.end)).collect();
        replica.cmd(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
        self.wait_until("every node agrees on the takeover", || {
            let map = self.agreed_slot_map()?;
            for (start, end) in &slots {
                let range = map.iter().find(|r| r.start <= *start && *end <= r.end);
                if range.map(|r| r.primary_port) != Some(replica.port()) {
                    return Err(format!("slots {start}-{end} not yet on port {}: {map:?}", replica.port()));
                }
            }
            Ok(())
        });
    }

    /// Moves `slot` with all its keys to `to_primary`, in batches of `MIGRATE`, while clients
    /// keep working (they follow `ASK` during the move and `MOVED` after it).
    pub fn move_slot(&self, slot: u16, to_primary: &RedisServer) {
        let Some(slot_move) = self.begin_slot_move(slot, to_primary) else { return };
        while self.migrate_slot_keys(&slot_move, MIGRATE_BATCH_MAX) > 0 {}
        self.finish_slot_move(slot_move);
    }

    /// Moves `count` slots from `from` to `to` with the operator's tool, `redis-cli --cluster
    /// reshard … --cluster-yes`: it takes `from`'s lowest-numbered slots and moves them one at a
    /// time (`IMPORTING`/`MIGRATING`, `MIGRATE` of up to 10 keys per call, `SETSLOT … NODE` on
    /// every primary). Returns how long `redis-cli` ran, once every node agrees on the new map.
    /// Plain-TCP clusters only.
    pub fn reshard_with_redis_cli(&self, from: &RedisServer, to: &RedisServer, count: usize) -> Duration {
        assert!(self.tls.is_none(), "reshard_with_redis_cli: plain-TCP clusters only");
        let started = Instant::now();
        let output = std::process::Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{}", from.port())])
            .args(["--cluster-from", self.id_of(from), "--cluster-to", self.id_of(to)])
            .args(["--cluster-slots", &count.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli (it comes with redis-server)");
        let elapsed = started.elapsed();
        assert!(
            output.status.success(),
            "redis-cli --cluster reshard failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        self.wait_converged();
        elapsed
    }

    /// First step of [`Self::move_slot`], for tests that act in between: marks `slot`
    /// `IMPORTING` on the target and `MIGRATING` on its owner. None if `to_primary` owns it.
    pub fn begin_slot_move(&self, slot: u16, to_primary: &RedisServer) -> Option<SlotMove> {
        let source = self.owner_of_slot(slot);
        if source.port() == to_primary.port() {
            return None;
        }
        let slot_text = slot.to_string();
        to_primary.cmd(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", self.id_of(source)]);
        source.cmd(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", self.id_of(to_primary)]);
        Some(SlotMove { slot, source_port: source.port(), target_port: to_primary.port() })
    }

    /// Migrates up to `batch_max` keys of the moving slot in one `MIGRATE`; the number moved,
    /// 0 once the source holds none of the slot's keys.
    pub fn migrate_slot_keys(&self, slot_move: &SlotMove, batch_max: usize) -> usize {
        let source = self.server(slot_move.source_port);
        let mut conn = connect(source);
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot_move.slot)
            .arg(batch_max)
            .query(&mut conn)
            .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            return 0;
        }
        self.migrate(&mut conn, slot_move, &keys);
        keys.len()
    }

    /// Migrates exactly `keys` (of the moving slot) in one `MIGRATE`, for tests that split keys
    /// used together (a script's keys, a multi-key read) between the two primaries on purpose:
    /// until the others follow, commands naming both get `TRYAGAIN`. A key already moved or
    /// deleted is skipped.
    pub fn migrate_named_keys(&self, slot_move: &SlotMove, keys: &[&str]) {
        let source = self.server(slot_move.source_port);
        let slot = slot_move.slot;
        assert!(keys.iter().all(|k| self.slot_of(k) == slot), "{keys:?} are not all in slot {slot}");
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        self.migrate(&mut connect(source), slot_move, &keys);
    }

    /// Last step of [`Self::move_slot`]: assigns the slot to the target on every primary (the
    /// target first, so it never refuses the slot's keys) and waits until every node agrees.
    pub fn finish_slot_move(&self, slot_move: SlotMove) {
        assert_eq!(
            self.migrate_slot_keys(&slot_move, 1),
            0,
            "finish_slot_move: the source still holds keys of the slot"
        );
        let SlotMove { slot, source_port, target_port } = slot_move;
        let target = self.server(target_port);
        let target_id = self.id_of(target).to_string();
        let slot_text = slot.to_string();
        let mut order = vec![target, self.server(source_port)];
        order.extend(self.primaries().into_iter().filter(|p| p.port() != target_port && p.port() != source_port));
        for primary in order {
            primary.cmd(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &target_id]);
        }
        self.wait_until("every node agrees on the moved slot", || {
            let map = self.agreed_slot_map()?;
            match map.iter().find(|r| (r.start..=r.end).contains(&slot)) {
                Some(r) if r.primary_port == target_port => Ok(()),
                other => Err(format!("slot {slot} served by {other:?}")),
            }
        });
    }

    /// Stops replication from `primary`: its replicas' links drop and cannot come back (their
    /// `AUTH` as [`REPLICATION_USER`] is refused), so writes the primary acknowledges from now on
    /// reach no replica. Returns once the primary has no replica connected and every replica of
    /// it reports `master_link_status:down`.
    pub fn cut_replication(&self, primary: &RedisServer) {
        let replicas = self.replicas_of(primary);
        primary.cmd(&["ACL", "SETUSER", REPLICATION_USER, "off"]);
        primary.cmd(&["CLIENT", "KILL", "USER", REPLICATION_USER]);
        self.wait_until("replication from the primary is cut", || {
            let connected = primary.info_field("replication", "connected_slaves");
            if connected.as_deref() != Some("0") {
                return Err(format!("primary still has {connected:?} replicas connected"));
            }
            match replicas.iter().find(|r| link_status(r) != "down") {
                Some(r) => Err(format!("replica on port {} still has its link up", r.port())),
                None => Ok(()),
            }
        });
    }

    /// Undoes [`Self::cut_replication`]: the replicas reconnect (and resynchronise) on their own.
    pub fn heal_replication(&self, primary: &RedisServer) {
        primary.cmd(&["ACL", "SETUSER", REPLICATION_USER, "on"]);
    }

    /// Runs `args` on `node` after `READONLY` on the same connection, so that a replica answers
    /// reads of its primary's slots instead of redirecting.
    pub fn read_on(&self, node: &RedisServer, args: &[&str]) -> Value {
        let mut conn = connect(node);
        redis::cmd("READONLY").query::<()>(&mut conn).expect("READONLY");
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn).unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", node.port()))
    }

    /// One `MIGRATE` of `keys` from the source of `slot_move` (on `conn`) to its target.
    fn migrate(&self, conn: &mut redis::Connection, slot_move: &SlotMove, keys: &[Vec<u8>]) {
        // No REPLACE: a key on both sides would mean a client wrote to the target a key that still
        // existed on the source, which the protocol forbids; that must fail loudly.
        let reply: Value = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(slot_move.target_port)
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("KEYS")
            .arg(keys)
            .query(conn)
            .unwrap_or_else(|e| {
                panic!("MIGRATE of slot {}: {e}; {}", slot_move.slot, self.on_both_sides(slot_move, keys))
            });
        // NOKEY: no key of the batch is on the source (deleted meanwhile, or moved already).
        assert!(matches!(&reply, Value::Okay) || text(reply.clone()) == "NOKEY", "MIGRATE answered {reply:?}");
    }

    /// Which of `keys` exist on both the source and the target of `slot_move` (with their types and
    /// TTLs), for the message of a failed `MIGRATE`.
    fn on_both_sides(&self, slot_move: &SlotMove, keys: &[Vec<u8>]) -> String {
        let describe = |port: u16, key: &[u8]| -> Option<String> {
            let mut conn = self.server(port).admin_client().ok()?.get_connection().ok()?;
            redis::cmd("ASKING").query::<()>(&mut conn).ok()?;
            let kind: String = redis::cmd("TYPE").arg(key).query(&mut conn).ok()?;
            let ttl_ms: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).ok()?;
            (kind != "none").then(|| format!("{kind}, pttl {ttl_ms}"))
        };
        let both: Vec<String> = keys
            .iter()
            .filter_map(|key| {
                let name = String::from_utf8_lossy(key);
                let source = describe(slot_move.source_port, key)?;
                let target = describe(slot_move.target_port, key)?;
                Some(format!("{name} (source: {source}; target: {target})"))
            })
            .collect();
        format!("keys on both sides just after the failure: {both:?}")
    }

    /// The last log lines of every node, for failure messages.
    pub fn log_tails(&self) -> String {
        self.nodes.iter().map(|n| format!("--- node on port {} ---\n{}\n", n.port(), n.log_tail())).collect()
    }

    /// The map every node returns when all are `cluster_state:ok`, know every node and agree;
    /// Err says which node does not.
    fn agreed_slot_map(&self) -> Result<Vec<SlotRange>, String> {
        let mut agreed: Option<Vec<SlotRange>> = None;
        for node in &self.nodes {
            let info = node.try_cmd(&["CLUSTER", "INFO"]).map_err(|e| format!("port {}: {e}", node.port()))?;
            let info = text(info);
            let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim);
            if field("cluster_state") != Some("ok") {
                return Err(format!("port {}: cluster_state {:?}", node.port(), field("cluster_state")));
            }
            let known = self.nodes.len().to_string();
            if field("cluster_known_nodes") != Some(known.as_str()) {
                return Err(format!("port {}: knows {:?} nodes", node.port(), field("cluster_known_nodes")));
            }
            let slots = node.try_cmd(&["CLUSTER", "SLOTS"]).map_err(|e| format!("port {}: {e}", node.port()))?;
            let map = parse_slots(slots);
            match &agreed {
                None => agreed = Some(map),
                Some(first) if *first != map => {
                    return Err(format!("maps differ: {first:?} vs port {}: {map:?}", node.port()));
                }
                Some(_) => {}
            }
        }
        let map = agreed.expect("a cluster has nodes");
        let covered: u32 = map.iter().map(|r| u32::from(r.end - r.start) + 1).sum();
        if covered != u32::from(SLOT_COUNT) {
            return Err(format!("{covered} slots covered: {map:?}"));
        }
        Ok(map)
    }

    fn replicas_in_sync(&self) -> Result<(), String> {
        match self.replicas().into_iter().find(|r| link_status(r) != "up") {
            Some(r) => Err(format!("replica on port {} has not synced", r.port())),
            None => Ok(()),
        }
    }

    /// Polls `check` until it passes; panics after [`CONVERGE_TIMEOUT`] with its last error and
    /// every node's log tail.
    fn wait_until(&self, what: &str, mut check: impl FnMut() -> Result<(), String>) {
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            let error = match check() {
                Ok(()) => return,
                Err(error) => error,
            };
            if Instant::now() >= deadline {
                panic!("timed out after {CONVERGE_TIMEOUT:?} waiting until {what}: {error}\n{}", self.log_tails());
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // The nodes (dropped after this) already loaded their certificates.
        if let Some((dir, _)) = &self.tls {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A cluster-mode node. Its bus port is picked free too (the default, port + 10000, may be taken
/// or not even be a port); if it was taken before the node bound it, the start panics, and the
/// node is started again with another bus port.
fn start_node(config: &ClusterConfig, tls_files: Option<&TlsFiles>) -> RedisServer {
    for attempt in 1..=BUS_PORT_ATTEMPTS_MAX {
        let mut args = [
            "--cluster-enabled",
            "yes",
            // Relative to the node's own `--dir`.
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &config.node_timeout_ms.to_string(),
            "--cluster-port",
            &super::redis_server::free_port().to_string(),
            "--masteruser",
            REPLICATION_USER,
            "--masterauth",
            REPLICATION_PASSWORD,
        ]
        .map(String::from)
        .to_vec();
        if let Some(files) = tls_files {
            args.extend(tls_node_args(files));
        }
        let server = ServerConfig {
            extra_args: args,
            tls: config.tls,
            tls_files: tls_files.cloned(),
            ..ServerConfig::default()
        };
        match std::panic::catch_unwind(|| RedisServer::start_with(server)) {
            Ok(node) => return node,
            Err(_) if attempt < BUS_PORT_ATTEMPTS_MAX => continue,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
    unreachable!("the loop returns or panics")
}

/// TLS between nodes: the bus and replication, each node presenting the client certificate.
fn tls_node_args(files: &TlsFiles) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    vec![
        "--tls-cluster".into(),
        "yes".into(),
        "--tls-replication".into(),
        "yes".into(),
        "--tls-client-cert-file".into(),
        path(&files.client_cert),
        "--tls-client-key-file".into(),
        path(&files.client_key),
    ]
}

fn connect(node: &RedisServer) -> redis::Connection {
    let client = node.admin_client().expect("node URL");
    let conn = client.get_connection_with_timeout(Duration::from_secs(2)).expect("connect to a node");
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    conn
}

fn bus_port(node: &RedisServer) -> u16 {
    let Value::Array(pair) = node.cmd(&["CONFIG", "GET", "cluster-port"]) else { panic!("CONFIG GET answers a list") };
    text(pair[1].clone()).parse().expect("cluster-port is a number")
}

fn role(node: &RedisServer) -> String {
    node.info_field("replication", "role").expect("INFO replication has role")
}

fn link_status(replica: &RedisServer) -> String {
    replica.info_field("replication", "master_link_status").unwrap_or_default()
}

fn text(value: Value) -> String {
    redis::from_redis_value(value).expect("a text reply")
}

/// `CLUSTER SLOTS`: `[[start, end, [ip, port, id, ..], replica..], ..]`, sorted by start.
fn parse_slots(value: Value) -> Vec<SlotRange> {
    let port_of = |node: &Value| match node {
        Value::Array(fields) => match fields.get(1) {
            Some(Value::Int(port)) => u16::try_from(*port).expect("a port"),
            other => panic!("CLUSTER SLOTS node without a port: {other:?}"),
        },
        other => panic!("CLUSTER SLOTS node is {other:?}"),
    };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).expect("a slot"),
        other => panic!("CLUSTER SLOTS slot is {other:?}"),
    };
    let Value::Array(ranges) = value else { panic!("CLUSTER SLOTS answered {value:?}") };
    let mut map: Vec<SlotRange> = ranges
        .iter()
        .map(|range| {
            let Value::Array(fields) = range else { panic!("CLUSTER SLOTS range is {range:?}") };
            let replicas: BTreeSet<u16> = fields[3..].iter().map(port_of).collect();
            SlotRange {
                start: int(&fields[0]),
                end: int(&fields[1]),
                primary_port: port_of(&fields[2]),
                replica_ports: replicas.into_iter().collect(),
            }
        })
        .collect();
    map.sort_by_key(|r| r.start);
    map
}
