//! What a Redis Cluster needs beyond routing by key: commands that must reach every primary.
//!
//! Owns: the list of primaries serving slots (CLUSTER SLOTS), one command sent to one named node
//! (through the cluster client, or on a connection of its own to a master serving no slot), the
//! cluster's identity (every serving primary's `run_id` and `master_replid`, the slots one node's
//! view lists for it and the slots it claims itself, and every idle master), and the SCAN of
//! every primary.
//! Never: treats a settled slot move between primaries as a new identity (the identity names the
//! primaries, not which slots they serve), trusts one node's view of who serves a slot without
//! that primary's own account, or SCANs a replica (it may lag).
//!
//! The identity is conservative: a failover, restart or replacement of any serving primary
//! changes it; so does adding or removing a node (a node added serves no slot at first, and is
//! listed as an idle master until it gains one, so resharding onto it moves slots between
//! unchanged primaries), and a slot that starts or stops being disputed (claimed by no listed
//! primary, by two, or not by the one the view names unless that one is a live primary that
//! handed it to the one other claimant: a view behind a settled handover). The coordinator maps
//! each change to the slots it may have cost (`ServerIdentity::may_have_lost`). A slot migration
//! between serving primaries leaves it unchanged once the handover settled, and is never a loss
//! itself: MIGRATE moves keys synchronously and loses nothing.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster::NodeAddress;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, FromRedisValue, RedisResult, Script,
    TlsCertificates, Value,
};

use super::conn::{Conn, Lane};
use super::errors::{map_error, timed_out, Redactor};
use super::scripts::{number, text};
use super::RedisStore;
use crate::store::{PrimaryIdentity, ServerIdentity, StoreError};

/// One serving primary: its address and node id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Primary {
    pub host: String,
    pub port: u16,
    pub node_id: String,
    /// The slot ranges it serves (inclusive, in reply order).
    pub slots: Vec<(u16, u16)>,
    /// Reached on a connection of its own ([`DirectNodes`]) rather than through the cluster
    /// client: a master serving no slot, which the client's slot map (CLUSTER SLOTS) does not
    /// list, so the client cannot route to it.
    pub direct: bool,
}

/// The primaries of a CLUSTER SLOTS reply (`[[start, end, [host, port, id, ...], replicas...]]`),
/// sorted and without repeats.
pub(super) fn parse_slots_primaries(reply: &Value) -> Result<Vec<Primary>, StoreError> {
    let bad = || StoreError::Protocol(format!("CLUSTER SLOTS: unexpected reply {reply:?}"));
    let Value::Array(ranges) = reply else { return Err(bad()) };
    let mut primaries: BTreeMap<(String, u16, String), Vec<(u16, u16)>> = BTreeMap::new();
    for range in ranges {
        let Value::Array(parts) = range else { return Err(bad()) };
        let slot = |i: usize| parts.get(i).and_then(number).and_then(|s| u16::try_from(s).ok());
        let (Some(start), Some(end)) = (slot(0), slot(1)) else { return Err(bad()) };
        let Some(Value::Array(node)) = parts.get(2) else { return Err(bad()) };
        let host = node.first().and_then(text).ok_or_else(bad)?;
        let port = node.get(1).and_then(number).and_then(|p| u16::try_from(p).ok()).ok_or_else(bad)?;
        let node_id = node.get(2).and_then(text).unwrap_or_default();
        primaries.entry((host, port, node_id)).or_default().push((start, end));
    }
    Ok(primaries
        .into_iter()
        .map(|((host, port, node_id), slots)| Primary { host, port, node_id, slots, direct: false })
        .collect())
}

/// How long a node that refused CLUSTER NODES (or answered it unreadably) is read with CLUSTER
/// SLOTS before CLUSTER NODES is tried on it again.
pub(super) const CLUSTER_NODES_RETRY_MS: u64 = 60_000;

/// How long a [`RedisStore::cluster_identity`] read that found a dispute waits before reading
/// again: long enough for a migration's handover between two primaries (consecutive `SETSLOT`
/// calls) to settle, short against a tick.
const DISPUTE_REREAD_MS: u64 = 50;

/// The slots `node` serves by its own account: the ranges its own CLUSTER SLOTS reply (`own_view`,
/// parsed) lists under its node id, or under its address when the view named no id. Another node
/// now at its address (a replacement, with a new id) claims nothing for it.
pub(super) fn own_claim(node: &Primary, own_view: &[Primary]) -> Vec<(u16, u16)> {
    let mine = |entry: &&Primary| {
        if node.node_id.is_empty() {
            entry.host == node.host && entry.port == node.port
        } else {
            entry.node_id == node.node_id
        }
    };
    let mut claimed: Vec<(u16, u16)> = own_view.iter().filter(mine).flat_map(|entry| entry.slots.clone()).collect();
    claimed.sort_unstable();
    claimed
}

/// The slot ranges `node`'s own CLUSTER SLOTS reply (`own_view`, parsed) names another node for,
/// with that node's id (its `host:port` when the reply names no id): whom it handed them to.
pub(super) fn handed_by(node: &Primary, own_view: &[Primary]) -> Vec<(u16, u16, String)> {
    let mine = |entry: &Primary| {
        if node.node_id.is_empty() {
            entry.host == node.host && entry.port == node.port
        } else {
            entry.node_id == node.node_id
        }
    };
    let mut handed: Vec<(u16, u16, String)> = own_view
        .iter()
        .filter(|entry| !mine(entry))
        .flat_map(|entry| {
            let to =
                if entry.node_id.is_empty() { format!("{}:{}", entry.host, entry.port) } else { entry.node_id.clone() };
            entry.slots.iter().map(move |(start, end)| (*start, *end, to.clone()))
        })
        .collect();
    handed.sort_unstable();
    handed
}

/// A node's own account from its `CLUSTER NODES` reply: whom it knows to serve which slots, and
/// the migrations it takes part in (which CLUSTER SLOTS does not show).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct NodesAccount {
    /// The answering node's id (its `myself` line).
    pub myself: String,
    /// Every node it lists with slots, by id and address, sorted: the same shape as a parsed
    /// CLUSTER SLOTS reply, so [`own_claim`] and [`handed_by`] read either.
    pub owners: Vec<Primary>,
    /// `[slot->-id]` on its own line: slots it migrates, each with the target's id.
    pub migrating: Vec<(u16, String)>,
    /// `[slot-<-id]` on its own line: slots it imports, each with the source's id.
    pub importing: Vec<(u16, String)>,
    /// Masters it lists serving no slot (a new node before its first slot, or one emptied), with
    /// an address, not failing (`fail`, `fail?`) and not in a handshake: reached
    /// [directly](Primary::direct). Sorted by address.
    pub idle_masters: Vec<Primary>,
}

/// Parses a `CLUSTER NODES` reply: one line per node, `<id> <ip:port@cport[,hostname]> <flags>
/// <primary> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot>...`, where a slot is `N`,
/// `N-M`, or on the answering node's own line `[N->-id]` (migrating) or `[N-<-id]` (importing).
pub(super) fn parse_cluster_nodes(reply: &str) -> Result<NodesAccount, StoreError> {
    let bad = |line: &str| StoreError::Protocol(format!("CLUSTER NODES: unexpected line {line:?}"));
    let slot = |text: &str| text.parse::<u16>().ok().filter(|s| *s < crate::store::keys::CLUSTER_SLOTS);
    let mut account = NodesAccount::default();
    let mut owners: BTreeMap<(String, u16, String), Vec<(u16, u16)>> = BTreeMap::new();
    for line in reply.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(id), Some(address), Some(flags)) = (fields.first(), fields.get(1), fields.get(2)) else {
            return Err(bad(line));
        };
        if fields.len() < 8 {
            return Err(bad(line));
        }
        let flag = |name: &str| flags.split(',').any(|f| f == name);
        let myself = flag("myself");
        if myself {
            account.myself = id.to_string();
        }
        let (host, port) = address
            .split(['@', ','])
            .next()
            .and_then(|hostport| hostport.rsplit_once(':'))
            .and_then(|(host, port)| Some((host.to_string(), port.parse::<u16>().ok()?)))
            .ok_or_else(|| bad(line))?;
        let serves = fields[8..].iter().any(|token| !token.starts_with('['));
        let reachable = port != 0 && !["fail", "fail?", "handshake", "noaddr"].iter().any(|f| flag(f));
        if flag("master") && !serves && reachable {
            let node_id = id.to_string();
            account.idle_masters.push(Primary { host: host.clone(), port, node_id, slots: Vec::new(), direct: true });
        }
        for token in &fields[8..] {
            if let Some(inner) = token.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
                let (list, at, other) = if let Some((at, to)) = inner.split_once("->-") {
                    (&mut account.migrating, at, to)
                } else if let Some((at, from)) = inner.split_once("-<-") {
                    (&mut account.importing, at, from)
                } else {
                    return Err(bad(line));
                };
                // Only the answering node lists its own migrations; another line's would not be
                // its account.
                if myself {
                    list.push((slot(at).ok_or_else(|| bad(line))?, other.to_string()));
                }
                continue;
            }
            let (start, end) = match token.split_once('-') {
                Some((start, end)) => (slot(start), slot(end)),
                None => (slot(token), slot(token)),
            };
            let (Some(start), Some(end)) = (start, end) else { return Err(bad(line)) };
            owners.entry((host.clone(), port, id.to_string())).or_default().push((start, end));
        }
    }
    if account.myself.is_empty() {
        return Err(StoreError::Protocol("CLUSTER NODES: no line is marked myself".into()));
    }
    account.owners = owners
        .into_iter()
        .map(|((host, port, node_id), slots)| Primary { host, port, node_id, slots, direct: false })
        .collect();
    account.migrating.sort_unstable();
    account.importing.sort_unstable();
    account.idle_masters.sort();
    Ok(account)
}

/// The text of an INFO or CLUSTER NODES reply (RESP3 answers a verbatim string); `command` names
/// it in the error.
fn reply_text(reply: &Value, command: &str) -> Result<String, StoreError> {
    match reply {
        Value::VerbatimString { text, .. } => Ok(text.clone()),
        other => text(other).ok_or_else(|| StoreError::Protocol(format!("{command}: unexpected reply"))),
    }
}

/// Nodes (by address) whose last attempt at something failed, and since when: each is left alone
/// until `retry` has passed, then tried again.
pub(super) struct NodeBackoff {
    retry: Duration,
    since: Mutex<BTreeMap<(String, u16), tokio::time::Instant>>,
}

impl NodeBackoff {
    pub(super) fn new(retry_ms: u64) -> Self {
        Self { retry: Duration::from_millis(retry_ms), since: Mutex::default() }
    }

    fn since(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, u16), tokio::time::Instant>> {
        self.since.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `node`'s last attempt failed less than `retry` ago.
    fn waiting(&self, node: &Primary) -> bool {
        self.since().get(&(node.host.clone(), node.port)).is_some_and(|at| at.elapsed() < self.retry)
    }

    /// Records how `node`'s attempt went; true when a success ends a failure it remembered.
    fn record(&self, node: &Primary, failed: bool) -> bool {
        let address = (node.host.clone(), node.port);
        if failed {
            self.since().insert(address, tokio::time::Instant::now());
            false
        } else {
            self.since().remove(&address).is_some()
        }
    }

    /// Forgets the nodes not in `keep`.
    fn retain(&self, keep: &[(String, u16)]) {
        self.since().retain(|address, _| keep.contains(address));
    }
}

/// Connections of their own to [idle masters](Primary::direct), which the cluster client cannot
/// route to: one per node, opened with the first seed's credentials and the cluster's TLS
/// settings at the node's address, kept while the node stays idle, dropped when it stops
/// answering (a server's error reply keeps it).
pub(super) struct DirectNodes {
    seed: ConnectionInfo,
    certificates: Option<TlsCertificates>,
    redactor: Redactor,
    config: AsyncConnectionConfig,
    timeout: Duration,
    open: tokio::sync::Mutex<BTreeMap<(String, u16), MultiplexedConnection>>,
    /// Idle masters whose last read failed: left out of reads until [`IDLE_MASTER_RETRY_MS`]
    /// later, so an unreachable one costs one timeout per retry, not one per identity check.
    failed: NodeBackoff,
    /// Script texts by hash, for [`Self::eval_of`].
    scripts: BTreeMap<String, String>,
}

/// `ASKING` and `cmd` as one pipeline on `conn`: `cmd`'s reply, or the refusal of `ASKING`.
async fn asking_pair(conn: &mut MultiplexedConnection, cmd: &Cmd) -> RedisResult<Value> {
    let mut pipe = ::redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    let replies = conn.req_packed_commands(&pipe, 0, 2).await?;
    match <[Value; 2]>::try_from(replies) {
        Ok([asking, reply]) => {
            asking.extract_error()?;
            reply.extract_error()
        }
        Err(replies) => Err(::redis::RedisError::from((
            ::redis::ErrorKind::Parse,
            "ASKING pipeline",
            format!("{} replies for 2 commands", replies.len()),
        ))),
    }
}

/// How long an idle master whose read failed is left out of the identity before it is read again.
pub(super) const IDLE_MASTER_RETRY_MS: u64 = 10_000;

impl DirectNodes {
    pub(super) fn new(seed: ConnectionInfo, certificates: Option<TlsCertificates>, timeout_ms: u64) -> Self {
        let timeout = Duration::from_millis(timeout_ms.max(1));
        let config = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(None);
        let redactor = Redactor::new(seed.redis_settings().password());
        let failed = NodeBackoff::new(IDLE_MASTER_RETRY_MS);
        Self {
            seed,
            certificates,
            redactor,
            config,
            timeout,
            open: Default::default(),
            failed,
            scripts: BTreeMap::new(),
        }
    }

    /// The same, knowing `sources` for [`Self::eval_of`].
    pub(super) fn with_scripts(self, sources: Vec<String>) -> Self {
        let scripts = sources.into_iter().map(|source| (Script::new(&source).get_hash().to_string(), source)).collect();
        Self { scripts, ..self }
    }

    /// `cmd`, an `EVALSHA` of a known script, as the `EVAL` of its text with the same keys and
    /// arguments: it runs on a node whose script cache lacks it. The cluster client loads scripts
    /// only on the nodes its slot map names, which an empty primary a slot is being moved onto is
    /// not among until its first slot is handed over, so there an `EVALSHA` is `NOSCRIPT` however
    /// often it is loaded.
    pub(super) fn eval_of(&self, cmd: &Cmd) -> Option<Cmd> {
        let mut args = cmd.args_iter();
        let (Some(::redis::Arg::Simple(name)), Some(::redis::Arg::Simple(hash))) = (args.next(), args.next()) else {
            return None;
        };
        if !name.eq_ignore_ascii_case(b"EVALSHA") {
            return None;
        }
        let source = self.scripts.get(std::str::from_utf8(hash).ok()?)?;
        let mut eval = ::redis::cmd("EVAL");
        eval.arg(source.as_str());
        for arg in args {
            let ::redis::Arg::Simple(bytes) = arg else { return None };
            eval.arg(bytes);
        }
        Some(eval)
    }

    /// Closes the connections to (and forgets the failures of) nodes no longer among `idle`.
    async fn keep_only(&self, idle: impl Iterator<Item = &Primary>) {
        let keep: Vec<(String, u16)> = idle.map(|node| (node.host.clone(), node.port)).collect();
        self.open.lock().await.retain(|address, _| keep.contains(address));
        self.failed.retain(&keep);
    }

    /// `cmd` on `node` within the store's deadline (connecting first if needed), its errors mapped
    /// as every command's are; the connection is dropped unless the server answered.
    async fn query(&self, command: &str, node: &Primary, cmd: Cmd) -> Result<Value, StoreError> {
        let address = (node.host.clone(), node.port);
        let label = format!("{command} on {}:{}", node.host, node.port);
        let result = crate::time::timeout(self.timeout, async {
            let mut conn = self.connection(&address).await?;
            cmd.query_async::<Value>(&mut conn).await?.extract_error()
        })
        .await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                if !matches!(error.kind(), ::redis::ErrorKind::Server(_)) {
                    self.open.lock().await.remove(&address);
                }
                Err(map_error(&label, &error, &self.redactor))
            }
            Err(_) => {
                self.open.lock().await.remove(&address);
                Err(timed_out(&label, self.timeout.as_millis() as u64))
            }
        }
    }

    /// `ASKING` and `cmd` as one pipeline on this store's own connection to `node` (connecting
    /// first if needed): no other request can come between them, and a node the cluster client
    /// holds no connection to (an empty primary a slot is being moved onto) is reached too. The
    /// reply is `cmd`'s; a refused `ASKING` (an ACL user without `+asking`) is the error. A script
    /// the node answers `NOSCRIPT` for is sent once more as `EVAL` ([`Self::eval_of`]; a user
    /// without `+eval` keeps the `NOSCRIPT`). The connection is dropped unless the server answered
    /// within half the store's deadline. Connections to nodes that left the cluster are dropped at
    /// their first failure, not before (one per node that ever imported a slot).
    pub(super) async fn asking(&self, node: &NodeAddress, cmd: &Cmd) -> RedisResult<Value> {
        let address = (node.host().to_string(), node.port());
        // Half the store's deadline: the call has spent some of its own on the crate's retries,
        // and a connection that does not answer in time must be dropped here, not left open.
        let reply = crate::time::timeout(self.timeout / 2, async {
            let mut conn = self.connection(&address).await?;
            let reply = asking_pair(&mut conn, cmd).await;
            let missing = ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript);
            match (&reply, self.eval_of(cmd)) {
                (Err(err), Some(eval)) if err.kind() == missing => {
                    let evaluated = asking_pair(&mut conn, &eval).await;
                    if super::conn::refused_eval(&evaluated) {
                        reply
                    } else {
                        evaluated
                    }
                }
                _ => reply,
            }
        })
        .await
        .unwrap_or_else(|_elapsed| Err(::redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))));
        if let Err(err) = &reply {
            if !matches!(err.kind(), ::redis::ErrorKind::Server(_)) {
                self.open.lock().await.remove(&address);
            }
        }
        reply
    }

    /// The open connection to the node at `(host, port)`, or a new one (connected without holding
    /// the lock, so one slow node does not hold up the others' connects).
    async fn connection(&self, (host, port): &(String, u16)) -> Result<MultiplexedConnection, ::redis::RedisError> {
        if let Some(conn) = self.open.lock().await.get(&(host.clone(), *port)) {
            return Ok(conn.clone());
        }
        let addr = match self.seed.addr() {
            ConnectionAddr::TcpTls { .. } => {
                ConnectionAddr::TcpTls { host: host.clone(), port: *port, insecure: false, tls_params: None }
            }
            _ => ConnectionAddr::Tcp(host.clone(), *port),
        };
        let info = self.seed.clone().set_addr(addr);
        let client = match &self.certificates {
            Some(certificates) => Client::build_with_tls(info, certificates.clone())?,
            None => Client::open(info)?,
        };
        let conn = client.get_multiplexed_async_connection_with_config(&self.config).await?;
        self.open.lock().await.insert((host.clone(), *port), conn.clone());
        Ok(conn)
    }
}

fn not_direct() -> StoreError {
    StoreError::Protocol("an idle master was found on a store that is not a Redis Cluster".into())
}

impl RedisStore {
    /// Every primary serving at least one slot, as the node answering CLUSTER SLOTS sees them.
    pub(super) async fn cluster_primaries(&self) -> Result<Vec<Primary>, StoreError> {
        let reply: Value = self.query("CLUSTER SLOTS", ::redis::cmd("CLUSTER").arg("SLOTS").clone()).await?;
        let primaries = parse_slots_primaries(&reply)?;
        if primaries.is_empty() {
            return Err(StoreError::Unavailable("CLUSTER SLOTS: no primary serves any slot".into()));
        }
        Ok(primaries)
    }

    /// One command on one node of the cluster (by address), on the shared cluster connection.
    pub(super) async fn on_node<T: FromRedisValue + Send>(
        &self,
        command: &str,
        node: &Primary,
        cmd: Cmd,
    ) -> Result<T, StoreError> {
        if node.direct {
            let value = self.inner.direct.as_ref().ok_or_else(not_direct)?.query(command, node, cmd).await?;
            return T::from_redis_value(value).map_err(|e| StoreError::Protocol(format!("{command}: {e}")));
        }
        let routing =
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: node.host.clone(), port: node.port });
        let value: Value = self
            .inner
            .conn
            .run(Lane::Shared, command, 0, |c: Conn| async move {
                match c {
                    // A command routed to one node answers a server error (NOPERM, a syntax
                    // error) as a value; it is the command's failure, mapped like any other.
                    Conn::Cluster(mut cluster, aids) => {
                        let value = cluster.route_command(cmd, routing).await?.extract_error()?;
                        Ok((value, Conn::Cluster(cluster, aids)))
                    }
                    Conn::Single(mut single) => {
                        let value: Value = cmd.query_async::<Value>(&mut single).await?.extract_error()?;
                        Ok((value, Conn::Single(single)))
                    }
                }
            })
            .await?;
        T::from_redis_value(value).map_err(|e| StoreError::Protocol(format!("{command}: {e}")))
    }

    /// The cluster's identity: per primary the view lists serving slots (sorted by address),
    /// `<host>:<port>/<node id>` with its `run_id`, and its `master_replid`, each joined with `,`;
    /// with the slots the view lists for it and the slots it claims itself ([`own_claim`]).
    ///
    /// The view is one node's CLUSTER SLOTS, which may be stale: mid-failover, or on one side of
    /// a partition, it can name a deposed primary for slots a promoted replica now serves. So each
    /// listed primary is also asked for its own account, and a slot the accounts do not settle on
    /// one primary is disputed ([`ServerIdentity::disputed`]), which counts as possibly lost. A
    /// slot migration is disputed for as long as its handover takes (the last `SETSLOT NODE`
    /// reaches the two primaries one after the other, and the other nodes by gossip), so a read
    /// that finds a dispute is repeated once after [`DISPUTE_REREAD_MS`]; the second read is the
    /// identity, its disputes included.
    pub(super) async fn cluster_identity(&self) -> Result<ServerIdentity, StoreError> {
        let identity = self.read_cluster_identity().await?;
        if identity.disputed_slots().is_empty() {
            return Ok(identity);
        }
        crate::time::sleep(std::time::Duration::from_millis(DISPUTE_REREAD_MS)).await;
        self.read_cluster_identity().await
    }

    /// The own account of one primary an earlier identity read listed, read from that node alone
    /// ([`crate::store::MetadataStore::primary_account`]): `listed.node` is `host:port/node id`.
    pub(super) async fn listed_primary_account(&self, listed: &PrimaryIdentity) -> Result<PrimaryIdentity, StoreError> {
        let (address, node_id) = listed.node.split_once('/').unwrap_or((listed.node.as_str(), ""));
        let (host, port) = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| StoreError::Protocol(format!("identity names node {:?} without host:port", listed.node)))?;
        let primary = Primary {
            host: host.to_string(),
            port,
            node_id: node_id.to_string(),
            slots: listed.slots.clone(),
            direct: false,
        };
        Ok(self.primary_identity(&primary).await?.0)
    }

    /// One read of the identity: the view, then each primary it lists ([`primary_identity`]),
    /// then each [idle](PrimaryIdentity::idle) master their accounts name. An idle master that
    /// cannot be read (unreachable, or a replica by now) is left out: a slot migrating to a node
    /// the identity does not list is disputed, the safe case.
    ///
    /// [`primary_identity`]: Self::primary_identity
    async fn read_cluster_identity(&self) -> Result<ServerIdentity, StoreError> {
        let listed = self.cluster_primaries().await?;
        // Ordered by address and id, idle masters among the listed ones: a node keeps its place when it
        // gains its first slot, so that is no change of the identity's text.
        let mut primaries: BTreeMap<(String, u16, String), PrimaryIdentity> = BTreeMap::new();
        let key = |p: &Primary| (p.host.clone(), p.port, p.node_id.clone());
        let mut idle: BTreeMap<String, Primary> = BTreeMap::new();
        for primary in &listed {
            let (identity, idle_masters) = self.primary_identity(primary).await?;
            primaries.insert(key(primary), identity);
            for node in idle_masters {
                idle.entry(node.node_id.clone()).or_insert(node);
            }
        }
        idle.retain(|id, _| !id.is_empty() && !listed.iter().any(|p| &p.node_id == id));
        if let Some(direct) = &self.inner.direct {
            direct.keep_only(idle.values()).await;
            for node in idle.values().filter(|node| !direct.failed.waiting(node)) {
                let read = self.primary_identity(node).await;
                direct.failed.record(node, read.is_err());
                match read {
                    Ok((identity, _)) if identity.idle => {
                        primaries.insert(key(node), identity);
                    }
                    Ok(_) => {}
                    Err(error) => {
                        let node = format!("{}:{}", node.host, node.port);
                        tracing::warn!(
                            %node,
                            %error,
                            "a master serving no slot could not be read: left out of the store identity for \
                             {IDLE_MASTER_RETRY_MS} ms, so a slot migrating onto it reads as disputed (a correction \
                             round for its groups); check that the coordinator can reach it with its Redis user"
                        );
                    }
                }
            }
        }
        let primaries: Vec<PrimaryIdentity> = primaries.into_values().collect();
        let join = |field: fn(&PrimaryIdentity) -> &str| {
            primaries.iter().map(|p| format!("{}={}", p.node, field(p))).collect::<Vec<_>>().join(",")
        };
        Ok(ServerIdentity { run_id: join(|p| &p.run_id), replication_id: join(|p| &p.replication_id), primaries })
    }

    /// INFO `server` and `replication` and CLUSTER NODES (CLUSTER SLOTS where that is denied) of one
    /// primary the view lists (or of an idle master, [reached directly](Primary::direct)), asked
    /// of that node itself, with the idle masters its account names. One whose own INFO does not
    /// say `role:master` (a demoted primary the view still lists) claims nothing, and is asked
    /// nothing more.
    async fn primary_identity(&self, primary: &Primary) -> Result<(PrimaryIdentity, Vec<Primary>), StoreError> {
        let node = format!("{}:{}/{}", primary.host, primary.port, primary.node_id);
        let (server, replication) = self.node_server_replication(primary).await?;
        let field = |info: &str, section: &str, name: &str| {
            super::probe::info_field(info, name)
                .ok_or_else(|| StoreError::Protocol(format!("INFO {section} of {node} has no {name}")))
        };
        let run_id = field(&server, "server", "run_id")?;
        let replication_id = field(&replication, "replication", "master_replid")?;
        let role = field(&replication, "replication", "role")?;
        let mut identity = PrimaryIdentity {
            node,
            run_id,
            replication_id,
            slots: primary.slots.clone(),
            claimed: Vec::new(),
            handed: Vec::new(),
            migrating: Vec::new(),
            importing: Vec::new(),
            idle: primary.direct && role == "master",
        };
        if role != "master" {
            return Ok((identity, Vec::new()));
        }
        let mut idle_masters = Vec::new();
        match self.own_account(primary).await? {
            // An idle master is reached by an address another node's account gave: it is that
            // node only if its own account says so (not a re-created node, or another cluster's,
            // at a stale address). Anything else is left out.
            Some(account) if primary.direct && account.myself != primary.node_id => identity.idle = false,
            None if primary.direct => identity.idle = false,
            Some(account) => {
                idle_masters = account.idle_masters;
                identity.claimed = own_claim(primary, &account.owners);
                identity.handed = handed_by(primary, &account.owners);
                // Its own line's migrations, when the node answering is the one the view lists.
                if primary.node_id.is_empty() || account.myself == primary.node_id {
                    identity.migrating = account.migrating;
                    identity.importing = account.importing;
                }
            }
            None => {
                let own_view: Value =
                    self.on_node("CLUSTER SLOTS", primary, ::redis::cmd("CLUSTER").arg("SLOTS").clone()).await?;
                let own = parse_slots_primaries(&own_view)?;
                identity.claimed = own_claim(primary, &own);
                identity.handed = handed_by(primary, &own);
            }
        }
        Ok((identity, idle_masters))
    }

    /// `primary`'s own CLUSTER NODES, parsed; `None` when that node refuses it or answers
    /// something this cannot read (`Unsupported`: an ACL from before it was needed, with
    /// `+cluster|slots` only; `Protocol`: an unknown subcommand, an unreadable reply). The identity
    /// then reads that node's CLUSTER SLOTS, which shows no migration, so a failover of a reshard's
    /// target before the handover settles is not evidence (DESIGN §11). The refusal is remembered
    /// per node for [`CLUSTER_NODES_RETRY_MS`] (so a refused node costs no extra command per
    /// check) and warned of each time it is found again; a permission granted later is used from
    /// the next retry on, without a restart.
    async fn own_account(&self, primary: &Primary) -> Result<Option<NodesAccount>, StoreError> {
        let denied = &self.inner.cluster_nodes_denied;
        if denied.waiting(primary) {
            return Ok(None);
        }
        let node = format!("{}:{}", primary.host, primary.port);
        let reply = self.on_node::<Value>("CLUSTER NODES", primary, ::redis::cmd("CLUSTER").arg("NODES").clone()).await;
        let parsed = reply.and_then(|reply| parse_cluster_nodes(&reply_text(&reply, "CLUSTER NODES")?));
        match parsed {
            Ok(account) => {
                if denied.record(primary, false) {
                    tracing::info!(%node, "CLUSTER NODES answered again: the store identity sees this node's slot migrations");
                }
                Ok(Some(account))
            }
            Err(StoreError::Unsupported { detail, .. } | StoreError::Protocol(detail)) => {
                tracing::warn!(
                    %node,
                    %detail,
                    "CLUSTER NODES failed: the store identity reads this node's CLUSTER SLOTS instead (retried every \
                     {CLUSTER_NODES_RETRY_MS} ms) and cannot see its slot migrations, so a failover of a reshard's \
                     target before its handover is not read as lost writes; give the coordinator's ACL user \
                     '+cluster|nodes' on every node"
                );
                denied.record(primary, true);
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }

    pub(super) async fn node_info(&self, node: &Primary, section: &str) -> Result<String, StoreError> {
        let reply: Value = self.on_node("INFO", node, ::redis::cmd("INFO").arg(section).clone()).await?;
        reply_text(&reply, &format!("INFO {section}"))
    }

    /// INFO `server` and `replication` of one node: one INFO naming both (Redis 7.0+), as on one
    /// server, so an identity check costs 1 + 2 × primaries commands; two on Redis 6.2, which
    /// answers a second section with `ERR syntax error` (the store remembers that, as on one
    /// server).
    async fn node_server_replication(&self, node: &Primary) -> Result<(String, String), StoreError> {
        if !self.inner.info_one_section.load(Ordering::Relaxed) {
            let both = ::redis::cmd("INFO").arg("server").arg("replication").clone();
            match self.on_node::<Value>("INFO", node, both).await {
                Ok(reply) => {
                    let both = reply_text(&reply, "INFO server replication")?;
                    if super::probe::info_field(&both, "master_replid").is_some() {
                        return Ok((both.clone(), both));
                    }
                }
                Err(StoreError::Protocol(text)) if text.to_ascii_lowercase().contains("syntax error") => {
                    self.inner.info_one_section.store(true, Ordering::Relaxed);
                }
                Err(error) => return Err(error),
            }
        }
        Ok((self.node_info(node, "server").await?, self.node_info(node, "replication").await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![bulk(host), Value::Int(port), bulk(id)])
    }

    #[test]
    fn slots_name_each_serving_primary_once_in_order() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(10),
                node("127.0.0.1", 7002, "b"),
                node("127.0.0.1", 7005, "r"),
            ]),
            Value::Array(vec![Value::Int(11), Value::Int(20), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(21), Value::Int(30), node("127.0.0.1", 7002, "b")]),
        ]);
        let primaries = parse_slots_primaries(&reply).expect("parses");
        let ports: Vec<u16> = primaries.iter().map(|p| p.port).collect();
        assert_eq!(ports, vec![7001, 7002]);
        assert_eq!(primaries[1].node_id, "b");
        assert_eq!(primaries[1].slots, vec![(0, 10), (21, 30)]);
        assert!(parse_slots_primaries(&Value::Int(1)).is_err());
        assert!(parse_slots_primaries(&Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
    }

    #[test]
    fn a_node_claims_the_slots_its_own_view_lists_under_its_id() {
        let view = parse_slots_primaries(&Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(10), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(11), Value::Int(20), node("127.0.0.1", 7002, "b")]),
        ]))
        .expect("parses");
        let a = &view[0];
        // a's own reply: it also claims 11..=20 (it missed b's takeover) and names b for 21..=30.
        let own = parse_slots_primaries(&Value::Array(vec![
            Value::Array(vec![Value::Int(11), Value::Int(20), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(0), Value::Int(10), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(21), Value::Int(30), node("127.0.0.1", 7002, "b")]),
        ]))
        .expect("parses");
        assert_eq!(own_claim(a, &own), vec![(0, 10), (11, 20)]);
        // Another node at a's address (a replacement, new id) claims nothing for a.
        let replaced = parse_slots_primaries(&Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(10),
            node("127.0.0.1", 7001, "a2"),
        ])]))
        .expect("parses");
        assert_eq!(own_claim(a, &replaced), vec![]);
        // A view without node ids is matched by address.
        let anonymous = Primary { node_id: String::new(), ..a.clone() };
        assert_eq!(own_claim(&anonymous, &own), vec![(0, 10), (11, 20)]);
        assert_eq!(own_claim(a, &[]), vec![]);
        // Whom a's own reply names for the slots it does not claim: b, by id.
        assert_eq!(handed_by(a, &own), vec![(21, 30, "b".to_string())]);
        assert_eq!(handed_by(a, &replaced), vec![(0, 10, "a2".to_string())]);
        // A reply without node ids names the node by address.
        let by_address = parse_slots_primaries(&Value::Array(vec![Value::Array(vec![
            Value::Int(21),
            Value::Int(30),
            node("127.0.0.1", 7002, ""),
        ])]))
        .expect("parses");
        assert_eq!(handed_by(a, &by_address), vec![(21, 30, "127.0.0.1:7002".to_string())]);
    }

    #[test]
    fn cluster_nodes_name_each_owner_and_the_answering_nodes_own_migrations() {
        let reply = "\
e7d1 127.0.0.1:7002@17002,host-b master - 0 1426238316232 2 connected 5461-10922 [12000-<-c9f1]
a1b2 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [100->-e7d1] [5461-<-e7d1]
07c3 127.0.0.1:7004@17004 slave a1b2 0 1426238317239 4 connected
c9f1 ::1:7003@17003 master,fail - 1 1 3 disconnected 10923-16383 12
d00d :0@0 master,noaddr - 1 1 0 disconnected
f00f 127.0.0.1:7009@17009 handshake - 0 0 0 connected
b0b0 127.0.0.1:7005@17005,host-e master - 0 1426238316232 5 connected
b1b1 127.0.0.1:7006@17006 master,fail? - 0 1426238316232 6 connected
b2b2 127.0.0.1:7007@17007 master - 0 1426238316232 7 connected
";
        let account = parse_cluster_nodes(reply).expect("parses");
        assert_eq!(account.myself, "a1b2");
        let owner = |host: &str, port: u16, id: &str, slots: &[(u16, u16)]| Primary {
            host: host.into(),
            port,
            node_id: id.into(),
            slots: slots.to_vec(),
            direct: false,
        };
        assert_eq!(
            account.owners,
            vec![
                owner("127.0.0.1", 7001, "a1b2", &[(0, 5460)]),
                owner("127.0.0.1", 7002, "e7d1", &[(5461, 10922)]),
                owner("::1", 7003, "c9f1", &[(10923, 16383), (12, 12)]),
            ]
        );
        // Only the answering node's own line speaks for its migrations.
        assert_eq!(account.migrating, vec![(100, "e7d1".to_string())]);
        assert_eq!(account.importing, vec![(5461, "e7d1".to_string())]);
        // Masters serving no slot, reachable by their address and not failing, are idle masters,
        // reached directly; a failing one (`fail?`, `fail`), one without an address and one in a
        // handshake are not.
        let idle = |port: u16, id: &str| Primary { direct: true, ..owner("127.0.0.1", port, id, &[]) };
        assert_eq!(account.idle_masters, vec![idle(7005, "b0b0"), idle(7007, "b2b2")]);
        // own_claim and handed_by read it as they read CLUSTER SLOTS.
        let me = &account.owners[0];
        assert_eq!(own_claim(me, &account.owners), vec![(0, 5460)]);
        assert_eq!(
            handed_by(me, &account.owners),
            vec![(12, 12, "c9f1".into()), (5461, 10922, "e7d1".into()), (10923, 16383, "c9f1".into())]
        );
        // A reply it cannot read is an error, not an empty account.
        for broken in [
            "",
            "a1b2 127.0.0.1:7001@17001 master - 0 0 1 connected 0-5460\n",
            "x 127.0.0.1:7001 myself,master - 0 0 1 connected 0-99999\n",
            "x 127.0.0.1:7001 myself,master - 0 0 1 connected [7->7]\n",
            "x nowhere myself,master - 0 0 1 connected\n",
            "x 127.0.0.1:7001 myself\n",
        ] {
            assert!(parse_cluster_nodes(broken).is_err(), "{broken:?}");
        }
    }
}
