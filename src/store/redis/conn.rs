//! Connections to one Redis server (named by the URL, or the master Sentinel names at each
//! connect) or to a Redis Cluster, with a deadline on every round trip.
//!
//! Owns: one shared multiplexed connection for ordinary commands, and a small pool of dedicated
//! connections for blocking reads (`XREADGROUP ... BLOCK`), which would otherwise stall every
//! command queued behind them on the shared connection. On a Cluster each of these is the `redis`
//! crate's cluster connection (one multiplexed connection per node, `NodeConn`, routed by slot); a blocking
//! read then holds a whole cluster connection, so the blocking pool keeps more of them.
//! Never: waits without a deadline, retries a command on its own (a command that timed out may
//! still have run; the caller's retry decides, and every write is conditioned on the stamp it was
//! computed from; the `redis` crate's cluster client does resend after a lost connection, and the
//! store adds one step to its chain after an `ASK` it gave up on, which means the command did not
//! run, see `asking_then`), or keeps a connection that failed, timed out, or answered READONLY /
//! MASTERDOWN (a demoted master or a replica), or through Sentinel NOREPLICAS (an old master cut
//! off from its replicas) — the next call connects afresh (through Sentinel: to the master it names
//! now), which is how the store follows a restarted or failed-over server.
//! On a Cluster the failed shared connection is replaced in the background instead, and serves
//! the other slots until its replacement is ready (`Connector::replace_cluster_connection`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster::{ClusterClient, NodeAddress};
use ::redis::cluster_async::ClusterConnection;
use ::redis::sentinel::SentinelClient;
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind,
    Value,
};
use tokio::sync::Mutex;

use super::cluster::DirectNodes;
use super::errors::{map_error, timed_out, Redactor};
use super::node_conn::NodeConn;
use crate::store::StoreError;

/// Idle dedicated connections kept for blocking reads.
const BLOCKING_IDLE_MAX: usize = 4;
/// The same on a Cluster, where a doorbell blocks one connection per slot it waits on.
const BLOCKING_IDLE_MAX_CLUSTER: usize = 32;

/// A connection to one server, or a cluster connection that routes each command by its key's
/// slot (following MOVED and ASK redirects, retrying TRYAGAIN and CLUSTERDOWN within the crate's
/// retry budget, always under this module's deadline).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    /// The cluster connection, and what the store adds to it ([`ClusterAids`]).
    Cluster(ClusterConnection<NodeConn>, Arc<ClusterAids>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c, aids) => Box::pin(async move {
                if is_blocking(cmd) {
                    // Its own connection, one call at a time: no limit, and no redirect on the
                    // store's shared connections, which it would block.
                    return c.req_packed_command(cmd).await;
                }
                let _turn = aids.limits.enter(cmd).await;
                let redirects = &aids.redirects;
                match c.req_packed_command(cmd).await {
                    Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::Ask) => {
                        asking_then(c, redirects, cmd, err).await
                    }
                    // A script the node it ran on lacks (after an ASK the crate followed, on an
                    // empty primary): as `EVAL`, which any node runs (`DirectNodes::eval_of`).
                    // The crate passes such an error reply on as a value.
                    Ok(Value::ServerError(err)) if err.kind() == Some(ServerErrorKind::NoScript) => {
                        let Some(eval) = redirects.eval_of(cmd) else { return Ok(Value::ServerError(err)) };
                        let evaluated = match c.req_packed_command(&eval).await {
                            Err(ask) if ask.kind() == ErrorKind::Server(ServerErrorKind::Ask) => {
                                asking_then(c, redirects, &eval, ask).await
                            }
                            other => other,
                        };
                        // A user without `+eval` (README: the Cluster ACL adds it) keeps the
                        // NOSCRIPT it had, a retryable outage, not a refusal of EVAL.
                        if refused_eval(&evaluated) {
                            return Ok(Value::ServerError(err));
                        }
                        evaluated
                    }
                    other => other,
                }
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c, _) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c, _) => c.get_db(),
        }
    }
}

/// Whether `reply` is an ACL refusal of `EVAL` (`NOPERM … 'eval' command`), as an error or as an
/// error reply; a refusal of anything else (`ASKING`) is reported as it is.
pub(super) fn refused_eval(reply: &RedisResult<Value>) -> bool {
    let (kind, detail) = match reply {
        Err(err) => (Some(err.kind()), err.detail()),
        Ok(Value::ServerError(err)) => (err.kind().map(ErrorKind::Server), err.details()),
        Ok(_) => (None, None),
    };
    kind == Some(ErrorKind::Server(ServerErrorKind::NoPerm))
        && detail.is_some_and(|text| text.to_ascii_lowercase().contains("'eval'"))
}

/// What the store adds to the `redis` crate's cluster client: its own connections for `ASK`
/// redirects, and a limit on the calls in flight per hash slot.
pub(crate) struct ClusterAids {
    pub(crate) redirects: DirectNodes,
    limits: SlotLimits,
}

impl ClusterAids {
    pub(crate) fn new(redirects: DirectNodes) -> Self {
        Self { redirects, limits: SlotLimits::default() }
    }
}

/// Calls in flight at once per hash slot on a cluster connection; the others wait their turn
/// (under their own deadline). The `redis` crate's cluster connection stops polling its requests
/// while it refreshes the slot map, and a refresh can hang the connection until every caller's
/// deadline (valkey-glide#2643 describes this deadlock; its fork replaced the lock). Every `MOVED`
/// the crate gets starts such a refresh. Before `NodeConn` sent `ASKING` in one write with its
/// command, calls to a slot being moved got `MOVED` by the hundred (the race `asking_then`
/// describes): in `store_contract`'s `concurrent_calls_to_a_slot_being_moved_all_succeed`, 45 or
/// more concurrent calls to that slot hung the connection in every round, 32 did not, and 16 left a
/// margin. The limit stays as a bound on the calls one slot's redirects can involve. Per slot, so
/// that calls to a node that hangs hold up only calls to its own slots
/// (`calls_to_a_hung_primary_do_not_hold_up_calls_to_the_others`).
const SLOT_IN_FLIGHT_MAX: usize = 16;

#[derive(Default)]
struct SlotLimits {
    slots: std::sync::Mutex<std::collections::BTreeMap<u16, Arc<tokio::sync::Semaphore>>>,
}

impl SlotLimits {
    /// A turn for `cmd` among the calls to its key's slot; none for a command without a key.
    async fn enter(&self, cmd: &Cmd) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let key = first_key(cmd)?;
        let slot = crate::store::keys::cluster_slot(std::str::from_utf8(key).ok()?);
        let gate = {
            let mut slots = self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            Arc::clone(slots.entry(slot).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(SLOT_IN_FLIGHT_MAX))))
        };
        gate.acquire_owned().await.ok()
    }
}

/// The arguments of `cmd`, its name first (none if one is not plain bytes).
fn arguments(cmd: &Cmd) -> Option<Vec<&[u8]>> {
    cmd.args_iter()
        .map(|arg| match arg {
            ::redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
        .collect()
}

/// The first key `cmd` names, for the commands this store sends: a script's first key, the first
/// stream of `XREAD`/`XREADGROUP`, the key after the subcommand of `XINFO`/`XGROUP`, none for a
/// command without keys, else the first argument.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    const KEYLESS: [&[u8]; 14] = [
        b"PING",
        b"INFO",
        b"SCRIPT",
        b"CLUSTER",
        b"SCAN",
        b"COMMAND",
        b"ACL",
        b"CONFIG",
        b"ASKING",
        b"READONLY",
        b"ROLE",
        b"CLIENT",
        b"HELLO",
        b"AUTH",
    ];
    let args = arguments(cmd)?;
    let name = *args.first()?;
    let is = |command: &[u8]| name.eq_ignore_ascii_case(command);
    if KEYLESS.iter().any(|command| is(command)) {
        return None;
    }
    if is(b"EVALSHA") || is(b"EVAL") {
        let keys: usize = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
        return if keys == 0 { None } else { args.get(3).copied() };
    }
    if is(b"XREAD") || is(b"XREADGROUP") {
        return read_options(&args)?.first_stream;
    }
    if is(b"XINFO") || is(b"XGROUP") {
        return args.get(2).copied();
    }
    args.get(1).copied()
}

/// An `XREAD`/`XREADGROUP` with `BLOCK`: sent on a blocking-lane connection of its own.
fn is_blocking(cmd: &Cmd) -> bool {
    arguments(cmd).and_then(|args| read_options(&args)).is_some_and(|options| options.blocking)
}

/// What an `XREAD`/`XREADGROUP` asks for, read option by option (a group or consumer named `BLOCK`
/// or `STREAMS` is not an option).
struct ReadOptions<'a> {
    blocking: bool,
    first_stream: Option<&'a [u8]>,
}

/// The options of an `XREAD`/`XREADGROUP`; `None` for another command or one that does not parse.
fn read_options<'a>(args: &[&'a [u8]]) -> Option<ReadOptions<'a>> {
    let name = *args.first()?;
    let mut at = if name.eq_ignore_ascii_case(b"XREADGROUP") {
        4 // after GROUP group consumer
    } else if name.eq_ignore_ascii_case(b"XREAD") {
        1
    } else {
        return None;
    };
    let mut blocking = false;
    loop {
        let option = *args.get(at)?;
        if option.eq_ignore_ascii_case(b"STREAMS") {
            return Some(ReadOptions { blocking, first_stream: args.get(at + 1).copied() });
        }
        if option.eq_ignore_ascii_case(b"BLOCK") {
            blocking = true;
            at += 2;
        } else if option.eq_ignore_ascii_case(b"COUNT") {
            at += 2;
        } else {
            at += 1; // NOACK, or an option this store does not send
        }
    }
}

/// `cmd` once more after the `redis` crate gave up on an `ASK` redirect: `ASKING` and `cmd` as one
/// pipeline on the store's own connection to the node the `ASK` names ([`DirectNodes::asking`]).
/// The crate's own `ASKING` now travels with its command too (`NodeConn`), so the race that made it
/// give up (another request between `ASKING` and the command took the one-time flag, the command
/// was answered `MOVED`, the source answered `ASK` again, until the retries ran out:
/// redis-plus-plus#281) no longer happens on its connections; this step stays for a chain of
/// redirects that still ends in `ASK`. The last answer, `ASK`, means the last attempt did not run:
/// this is one more step of the crate's own chain of retries (which also resends after a lost
/// connection). A `MOVED` now (the move has finished meanwhile) is followed through the cluster
/// connection, once. Pipelines get no such step: the crate resends a redirected pipeline whole,
/// `ASKING` first (in one write with it, `NodeConn`).
async fn asking_then(
    c: &mut ClusterConnection<NodeConn>,
    redirects: &DirectNodes,
    cmd: &Cmd,
    ask: RedisError,
) -> RedisResult<Value> {
    let Some(node) = ask.redirect_node().and_then(|(node, _slot)| node.parse::<NodeAddress>().ok()) else {
        return Err(ask);
    };
    match redirects.asking(&node, cmd).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::Moved) => c.req_packed_command(cmd).await,
        other => other,
    }
}

/// The shared connection, tagged with a generation so a failure on an old connection never
/// discards a newer one another caller already opened.
#[derive(Default)]
struct Slot {
    current: Option<(u64, Conn)>,
    generation: u64,
    /// A Cluster connection's replacement is being built in the background.
    replacing: bool,
    /// The shared connection is being opened (no current one): its outcome, once known, for
    /// every caller waiting for it.
    connecting: Option<Connecting>,
}

/// The outcome of opening the shared connection: `None` while it runs.
type Connecting = tokio::sync::watch::Receiver<Option<Result<(), Failure>>>;

/// The connection of watched acks, and what it is known to watch: per fence key, the `counter`
/// and `nonce` an `HMGET` read after the `WATCH` that covers the key, on this connection, in the
/// reply of the call that sent both. Until that key is written, an `EXEC` on this connection runs
/// only if the key still holds them (Redis aborts the transaction of a connection that watched a
/// key written since).
pub(crate) struct Watched {
    pub(crate) conn: Conn,
    /// The shared connection's generation when this one was opened.
    generation: u64,
    pub(crate) verified: std::collections::BTreeMap<String, (Vec<u8>, Vec<u8>)>,
    /// The keys of `verified`, the most recently acked first.
    pub(crate) recent: Vec<String>,
    /// The last command of the last call was a `MULTI` Redis answered `OK`: the connection is in
    /// a transaction, so commands sent now are queued, not run, until `EXEC` or `DISCARD`. The
    /// only state in which an `XACK` may be sent on it.
    pub(crate) in_multi: bool,
}

/// Why [`Connector::run_watched`] did not run.
pub(crate) enum WatchedFailure {
    /// Another call holds the connection.
    Busy,
    /// No reply within the deadline (the call may still run at Redis).
    TimedOut(StoreError),
    /// The connection failed, or could not be opened.
    Failed(StoreError),
}

/// Which connection a round trip uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The shared multiplexed connection.
    Shared,
    /// A dedicated connection from the blocking pool, returned to it after a clean reply.
    Blocking,
}

/// Where connections go.
pub(crate) enum Target {
    /// The server of the URL.
    Direct(Box<Client>),
    /// The master the sentinels name at each connect (`name` is the master name, for errors).
    Sentinel { client: Arc<Mutex<SentinelClient>>, name: String },
    /// A Redis Cluster, found from its seed nodes, and what the store adds to its client.
    Cluster(Box<ClusterClients>, Arc<ClusterAids>),
}

/// The two cluster clients of a Cluster target: the same nodes and settings, but the shared
/// connection's requests also time out inside the crate, half a deadline after the store's own
/// deadline (so a connection built while a node hangs gives up on that node's `PING`, and the
/// crate never resends a command its caller still awaits), while blocking reads' must outlast
/// their `BLOCK`.
pub(crate) struct ClusterClients {
    pub(crate) shared: ClusterClient,
    pub(crate) blocking: ClusterClient,
}

impl Target {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(..))
    }
}

/// Why a round trip failed before its reply could be mapped.
#[derive(Clone)]
enum Failure {
    /// The command or the connection to the server failed.
    Redis(RedisError),
    /// No sentinel named a usable master (the lookup failed).
    Lookup(RedisError),
    /// Opening the shared connection took longer than the store's deadline, or was abandoned
    /// (the runtime is shutting down).
    Connect(String),
}

impl From<RedisError> for Failure {
    fn from(err: RedisError) -> Self {
        Failure::Redis(err)
    }
}

pub(crate) struct Connector {
    target: Target,
    config: AsyncConnectionConfig,
    timeout_ms: u64,
    redactor: Redactor,
    /// Also removed from error texts: the sentinels' password.
    sentinel_redactor: Redactor,
    shared: Arc<Mutex<Slot>>,
    blocking_idle: Arc<Mutex<Vec<Conn>>>,
    /// The connection of watched acks ([`Connector::run_watched`]), while no call holds it.
    watched: Mutex<Option<Watched>>,
    /// When a `NOREPLICAS` answer last replaced the connection (see `is_no_replicas`).
    no_replicas_replaced_at: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Connector {
    pub(crate) fn new(target: Target, timeout_ms: u64, redactor: Redactor, sentinel_redactor: Redactor) -> Self {
        // The crate's own response timeout (500 ms by default) is turned off: the deadline of
        // `run` governs, and it must be longer for a blocking read. The connect timeout is kept
        // so the crate gives up on a dead address instead of leaving a half-open attempt behind.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(timeout_ms)))
            .set_response_timeout(None);
        Self {
            config,
            timeout_ms,
            redactor,
            sentinel_redactor,
            target,
            shared: Arc::new(Mutex::new(Slot::default())),
            blocking_idle: Arc::new(Mutex::new(Vec::new())),
            watched: Mutex::new(None),
            no_replicas_replaced_at: std::sync::Mutex::new(None),
        }
    }

    /// One round trip on the connection of watched acks, a dedicated one that nothing else uses
    /// (`WATCH` and `MULTI` are the connection's state), under the store's deadline. One call at
    /// a time holds it: a call that finds it held gets [`WatchedFailure::Busy`] at once (its
    /// caller acks through the script instead of waiting). With none, or one opened before the
    /// shared connection was replaced (it follows the shared one to a new master, as the blocking
    /// pool does), it opens one first, under a deadline of its own: a connect that fails or takes
    /// too long is [`WatchedFailure::Failed`] (nothing was sent), not a timed-out call. `work`
    /// hands the connection back to be kept (`Some`) or discarded (`None`); a call that fails,
    /// times out or is cancelled discards it too, so a later call opens another, which watches
    /// nothing and is in no transaction: what a connection watches is only ever known from the
    /// replies of the call that set it up. Not on a Cluster (the caller checks).
    pub(crate) async fn run_watched<T, F, Fut>(&self, command: &str, work: F) -> Result<T, WatchedFailure>
    where
        F: FnOnce(Watched) -> Fut,
        Fut: Future<Output = RedisResult<(T, Option<Watched>)>>,
    {
        let Ok(mut held) = self.watched.try_lock() else { return Err(WatchedFailure::Busy) };
        let limit_ms = self.timeout_ms;
        let generation = self.shared.lock().await.generation;
        let watched = match held.take().filter(|watched| watched.generation == generation) {
            Some(watched) => watched,
            None => {
                let connect = self.connect(Lane::Blocking);
                let conn = match crate::time::timeout(Duration::from_millis(limit_ms), connect).await {
                    Ok(Ok(conn)) => conn,
                    Ok(Err(Failure::Redis(err))) => {
                        return Err(WatchedFailure::Failed(self.scrub(map_error(command, &err, &self.redactor))))
                    }
                    Ok(Err(Failure::Lookup(err))) => {
                        return Err(WatchedFailure::Failed(self.lookup_error(command, &err)))
                    }
                    Ok(Err(Failure::Connect(text))) => {
                        return Err(WatchedFailure::Failed(StoreError::Unavailable(format!("{command}: {text}"))))
                    }
                    Err(_elapsed) => return Err(WatchedFailure::Failed(timed_out(command, limit_ms))),
                };
                Watched { conn, generation, verified: Default::default(), recent: Vec::new(), in_multi: false }
            }
        };
        let outcome = crate::time::timeout(Duration::from_millis(limit_ms), work(watched)).await;
        match outcome {
            Ok(Ok((value, keep))) => {
                *held = keep;
                Ok(value)
            }
            Ok(Err(err)) => Err(WatchedFailure::Failed(self.scrub(map_error(command, &err, &self.redactor)))),
            Err(_elapsed) => Err(WatchedFailure::TimedOut(timed_out(command, limit_ms))),
        }
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// A new connection. Through Sentinel, the sentinels are asked for the current master first
    /// (the crate confirms its `ROLE`); nothing about an earlier master is reused. On a Cluster,
    /// the slot map is read from the seed nodes. The future owns what it needs (it may run on a
    /// task of its own).
    fn connect(&self, lane: Lane) -> impl Future<Output = Result<Conn, Failure>> + Send + 'static {
        enum Via {
            Client(Box<Client>),
            Sentinel(Arc<Mutex<SentinelClient>>),
            Cluster(Box<ClusterClient>, Arc<ClusterAids>),
        }
        let via = match &self.target {
            Target::Direct(client) => Via::Client(client.clone()),
            Target::Sentinel { client, .. } => Via::Sentinel(Arc::clone(client)),
            Target::Cluster(clients, aids) => {
                let client = if lane == Lane::Shared { &clients.shared } else { &clients.blocking };
                Via::Cluster(Box::new(client.clone()), Arc::clone(aids))
            }
        };
        let config = self.config.clone();
        async move {
            let client = match via {
                Via::Client(client) => *client,
                Via::Sentinel(client) => client.lock().await.async_get_client().await.map_err(Failure::Lookup)?,
                Via::Cluster(client, aids) => {
                    return Ok(Conn::Cluster(client.get_async_generic_connection::<NodeConn>().await?, aids));
                }
            };
            Ok(Conn::Single(client.get_multiplexed_async_connection_with_config(&config).await?))
        }
    }

    /// The shared connection; opened first if there is none. Opening it is single-flight and runs
    /// on a task of its own, with the store's whole deadline, while callers wait for its outcome
    /// under their own deadlines. It used to run inside the caller that held the checkout lock,
    /// under that caller's deadline: after an outage where each attempt hung for a whole
    /// deadline, the next caller in the queue held the lock with only the time since the one
    /// before it arrived left, so while calls came faster than one connect took (TLS, a Sentinel
    /// lookup past a dead sentinel), every attempt was cut off and the store stayed unavailable
    /// after Redis came back, for as long as the calls kept coming (a TLS/Sentinel review
    /// finding).
    async fn checkout_shared(&self) -> Result<(u64, Conn), Failure> {
        loop {
            let mut connecting = {
                let mut slot = self.shared.lock().await;
                if let Some((generation, conn)) = &slot.current {
                    return Ok((*generation, conn.clone()));
                }
                match &slot.connecting {
                    Some(connecting) => connecting.clone(),
                    None => self.start_connect(&mut slot),
                }
            };
            let outcome = loop {
                if let Some(outcome) = connecting.borrow_and_update().clone() {
                    break outcome;
                }
                if connecting.changed().await.is_err() {
                    // The task ended without an outcome: its runtime shut down (a store shared
                    // across runtimes), or it panicked. Forgotten, so the next call starts another
                    // instead of every call failing here for good.
                    let mut slot = self.shared.lock().await;
                    if slot.connecting.as_ref().is_some_and(|c| c.same_channel(&connecting)) {
                        slot.connecting = None;
                    }
                    break Err(Failure::Connect("the connection attempt was abandoned".into()));
                }
            };
            // Opened: take it (or, if a failure discarded it meanwhile, open another).
            outcome?;
        }
    }

    /// Starts opening the shared connection on a task of its own (`slot` has none, and no open
    /// is under way).
    fn start_connect(&self, slot: &mut Slot) -> Connecting {
        let (done, connecting) = tokio::sync::watch::channel(None);
        slot.connecting = Some(connecting.clone());
        let connect = self.connect(Lane::Shared);
        let (shared, idle) = (Arc::clone(&self.shared), Arc::clone(&self.blocking_idle));
        let limit_ms = self.timeout_ms.max(1);
        tokio::spawn(async move {
            let opened = crate::time::timeout(Duration::from_millis(limit_ms), connect).await;
            let mut slot = shared.lock().await;
            slot.connecting = None;
            let outcome = match opened {
                Ok(Ok(conn)) => {
                    // Idle blocking connections were opened to the same server as the shared one
                    // that was just replaced; after a failover they point at the old master.
                    idle.lock().await.clear();
                    slot.generation += 1;
                    slot.current = Some((slot.generation, conn));
                    Ok(())
                }
                Ok(Err(failure)) => Err(failure),
                Err(_elapsed) => Err(Failure::Connect(format!("connecting took longer than {limit_ms} ms"))),
            };
            drop(slot);
            let _ = done.send(Some(outcome));
        });
        connecting
    }

    async fn checkout(&self, lane: Lane) -> Result<(u64, Conn), Failure> {
        match lane {
            Lane::Shared => self.checkout_shared().await,
            Lane::Blocking => {
                let idle = self.blocking_idle.lock().await.pop();
                match idle {
                    Some(conn) => Ok((0, conn)),
                    None => Ok((0, self.connect(Lane::Blocking).await?)),
                }
            }
        }
    }

    async fn discard_shared(&self, generation: u64) {
        let mut slot = self.shared.lock().await;
        if matches!(&slot.current, Some((g, _)) if *g == generation) {
            slot.current = None;
        }
    }

    /// Runs one round trip (connecting first if needed) under the store's deadline plus
    /// `extra_ms` (a blocking read's BLOCK time). `command` names the work in errors.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        lane: Lane,
        command: &str,
        extra_ms: u64,
        work: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<(T, Conn)>>,
    {
        let limit_ms = self.timeout_ms.saturating_add(extra_ms);
        let mut used: Option<u64> = None;
        let outcome = crate::time::timeout(Duration::from_millis(limit_ms), async {
            let (generation, conn) = self.checkout(lane).await?;
            used = Some(generation);
            Ok::<_, Failure>(work(conn).await?)
        })
        .await;
        match outcome {
            Ok(Ok((value, conn))) => {
                if lane == Lane::Blocking {
                    let mut idle = self.blocking_idle.lock().await;
                    let max = if self.target.is_cluster() { BLOCKING_IDLE_MAX_CLUSTER } else { BLOCKING_IDLE_MAX };
                    if idle.len() < max {
                        idle.push(conn);
                    }
                }
                Ok(value)
            }
            Ok(Err(Failure::Redis(err))) => {
                // Server replies (NOGROUP, NOPERM, ...) leave the connection healthy; anything at
                // the transport level means it must be replaced, and so does a server that is no
                // longer (or not yet) a writable master.
                if err.is_io_error()
                    || err.is_unrecoverable_error()
                    || (not_a_master(&err, &self.target) && (lane == Lane::Blocking || self.replace_due(&err)))
                {
                    self.forget(lane, used).await;
                }
                Err(self.scrub(map_error(command, &err, &self.redactor)))
            }
            Ok(Err(Failure::Lookup(err))) => Err(self.lookup_error(command, &err)),
            Ok(Err(Failure::Connect(text))) => Err(self.scrub(StoreError::Unavailable(format!("{command}: {text}")))),
            Err(_elapsed) => {
                self.forget(lane, used).await;
                Err(timed_out(command, limit_ms))
            }
        }
    }

    /// Whether a "not a master" answer replaces the connection now: always, but `NOREPLICAS` at
    /// most once per deadline. A master whose replica is only restarting also answers it, and
    /// there every refused write replaced the connection (a sentinel lookup, a new connection, the
    /// blocking pool cleared) at the rate of the calls (diff review). The budget is the shared
    /// connection's: a blocking connection that failed is only dropped, and does not spend it.
    fn replace_due(&self, err: &RedisError) -> bool {
        if !is_no_replicas(err) {
            return true;
        }
        let now = tokio::time::Instant::now();
        let mut last = self.no_replicas_replaced_at.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| now.duration_since(at) >= Duration::from_millis(self.timeout_ms));
        if due {
            *last = Some(now);
        }
        due
    }

    /// A failed Sentinel lookup is always `Unavailable`: during a failover no sentinel names a
    /// healthy master for a while (a wrong master name looks the same, hence the hint).
    fn lookup_error(&self, command: &str, err: &RedisError) -> StoreError {
        let name = match &self.target {
            Target::Sentinel { name, .. } => name.as_str(),
            Target::Direct(_) | Target::Cluster(..) => "",
        };
        let detail = match err.kind() {
            ErrorKind::MasterNameNotFoundBySentinel => {
                format!("no sentinel names a healthy master {name:?} (failover in progress, or a wrong master name)")
            }
            ErrorKind::AuthenticationFailed => {
                "authentication failed (check the sentinel and store credentials)".into()
            }
            _ => err.to_string(),
        };
        let text = self.redactor.clean(format!("{command}: Sentinel lookup: {detail}"));
        self.scrub(StoreError::Unavailable(text))
    }

    /// A server error reply passed on as text inside a reply (a script's `{'error', text}`
    /// element), mapped as the command's own error reply would be: the text is parsed as the
    /// error reply it was, so its kind (NOGROUP, READONLY, ...) is the same.
    pub(crate) fn nested_error(&self, command: &str, text: &str) -> StoreError {
        let line = format!("-{}\r\n", text.replace(['\r', '\n'], " "));
        let err = match ::redis::parse_redis_value(line.as_bytes()) {
            Ok(Value::ServerError(err)) => RedisError::from(err),
            Ok(other) => return StoreError::Protocol(format!("{command}: unexpected error text {other:?}")),
            Err(err) => err,
        };
        self.scrub(map_error(command, &err, &self.redactor))
    }

    /// Removes the sentinels' password from every text of `err` (the store password is removed
    /// by `map_error`).
    fn scrub(&self, err: StoreError) -> StoreError {
        let clean = |text: String| self.sentinel_redactor.clean(text);
        match err {
            StoreError::Unavailable(text) => StoreError::Unavailable(clean(text)),
            StoreError::Unsupported { command, detail } => {
                StoreError::Unsupported { command: clean(command), detail: clean(detail) }
            }
            StoreError::Protocol(text) => StoreError::Protocol(clean(text)),
            StoreError::Config(text) => StoreError::Config(clean(text)),
            StoreError::Layout(text) => StoreError::Layout(clean(text)),
            StoreError::Fenced { key, current } => StoreError::Fenced { key: clean(key), current },
        }
    }

    async fn forget(&self, lane: Lane, generation: Option<u64>) {
        // A blocking-lane connection is owned by the failed call and simply dropped.
        if let (Lane::Shared, Some(generation)) = (lane, generation) {
            match &self.target {
                Target::Cluster(clients, aids) => self.replace_cluster_connection(clients, aids, generation).await,
                Target::Direct(_) | Target::Sentinel { .. } => self.discard_shared(generation).await,
            }
        }
    }

    /// On a Cluster, the shared connection that failed a call keeps serving every caller while its
    /// replacement (a fresh slot map, fresh node connections) is built in the background, and is
    /// swapped for it once that is ready; a build that fails or takes longer than three deadlines
    /// (a hung node's `PING` takes one and a half) is dropped, and the next failure starts
    /// another. One failing node must not take the other slots with it: when the failed
    /// connection was dropped at once, every caller of every slot
    /// waited, under the checkout lock, for a new one whose build waits on each node (a hung one
    /// never answers its `PING`), so one hung primary made the whole store `Unavailable`
    /// (`store_contract`'s `a_hung_primary_fails_only_its_own_shards_of_a_batched_fenced_read_and_ack`).
    async fn replace_cluster_connection(&self, clients: &ClusterClients, aids: &Arc<ClusterAids>, generation: u64) {
        {
            let mut slot = self.shared.lock().await;
            if slot.replacing || !matches!(&slot.current, Some((g, _)) if *g == generation) {
                return;
            }
            slot.replacing = true;
        }
        let (client, aids) = (clients.shared.clone(), Arc::clone(aids));
        let (shared, idle) = (Arc::clone(&self.shared), Arc::clone(&self.blocking_idle));
        let limit = Duration::from_millis(self.timeout_ms.saturating_mul(3).max(1));
        let redactor = self.redactor.clone();
        tokio::spawn(async move {
            let built = crate::time::timeout(limit, client.get_async_generic_connection::<NodeConn>()).await;
            let mut slot = shared.lock().await;
            slot.replacing = false;
            match built {
                Ok(Ok(conn)) => {
                    // As in `checkout`: idle blocking connections have the old slot map.
                    idle.lock().await.clear();
                    slot.generation += 1;
                    slot.current = Some((slot.generation, Conn::Cluster(conn, aids)));
                }
                Ok(Err(error)) => {
                    let error = redactor.clean(error.to_string());
                    tracing::warn!(%error, "Redis Cluster: a replacement connection failed; the current one keeps serving");
                }
                Err(_) => tracing::warn!(
                    ?limit,
                    "Redis Cluster: a replacement connection took too long; the current one keeps serving"
                ),
            }
        });
    }
}

/// READONLY (a replica, e.g. a demoted master) or MASTERDOWN: this connection will not reach a
/// writable master again.
fn not_a_master(err: &RedisError, target: &Target) -> bool {
    matches!(err.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown))
        || (matches!(target, Target::Sentinel { .. }) && is_no_replicas(err))
}

/// `NOREPLICAS`: a master with `min-replicas-to-write` (which the README recommends) that lost
/// its replicas refuses writes. Through Sentinel that is an old master cut off from the rest, whose
/// replica the sentinels may have promoted meanwhile: the connection is replaced, so the next call
/// asks the sentinels again instead of staying on the old master for as long as the partition
/// lasts (a TLS/Sentinel review finding). A fixed server has nowhere else to go: its connection
/// is kept (replacing it would reconnect to the same server at every call).
fn is_no_replicas(err: &RedisError) -> bool {
    err.code() == Some("NOREPLICAS")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut-off old master's `NOREPLICAS` replaces the connection through Sentinel (the next one
    /// asks the sentinels again), but not to a fixed server (it would only reconnect there).
    #[test]
    fn no_replicas_replaces_the_connection_only_through_sentinel() {
        use crate::store::redis::{RedisSentinelOptions, RedisStore, RedisStoreOptions};
        let reply = |line: &str| match ::redis::parse_redis_value(line.as_bytes()) {
            Ok(Value::ServerError(err)) => RedisError::from(err),
            other => panic!("not a server error: {other:?}"),
        };
        let no_replicas = reply("-NOREPLICAS Not enough good replicas to write.\r\n");
        let read_only = reply("-READONLY You can't write against a read only replica.\r\n");
        let direct = RedisStore::open("redis://127.0.0.1:1/", RedisStoreOptions::default()).expect("open");
        let sentinel = RedisSentinelOptions {
            sentinels: vec!["127.0.0.1:1".into()],
            master_name: "mymaster".into(),
            sentinel_password: None,
        };
        let options = RedisStoreOptions { sentinel: Some(sentinel), ..RedisStoreOptions::default() };
        let through_sentinel = RedisStore::open("redis://mymaster", options).expect("open");
        assert!(!not_a_master(&no_replicas, direct.inner.conn.target()));
        assert!(not_a_master(&no_replicas, through_sentinel.inner.conn.target()));
        assert!(not_a_master(&read_only, direct.inner.conn.target()));
        assert!(not_a_master(&read_only, through_sentinel.inner.conn.target()));
        // At most once per deadline for NOREPLICAS (a master whose replica is only restarting
        // answers it to every write); always for READONLY.
        let conn = &through_sentinel.inner.conn;
        assert!(conn.replace_due(&no_replicas));
        assert!(!conn.replace_due(&no_replicas), "not again within the deadline");
        assert!(conn.replace_due(&read_only) && conn.replace_due(&read_only));
    }

    fn command(args: &[&str]) -> Cmd {
        let mut cmd = ::redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd
    }

    #[test]
    fn the_first_key_of_each_command_the_store_sends() {
        let key = |args: &[&str]| first_key(&command(args)).map(|k| String::from_utf8_lossy(k).into_owned());
        assert_eq!(key(&["HMGET", "m", "revision"]), Some("m".into()));
        assert_eq!(key(&["EVALSHA", "abc", "2", "fence", "stream", "1"]), Some("fence".into()));
        assert_eq!(key(&["EVALSHA", "abc", "0", "arg"]), None);
        assert_eq!(key(&["XREADGROUP", "GROUP", "g", "c", "COUNT", "5", "STREAMS", "s", ">"]), Some("s".into()));
        assert_eq!(key(&["XREAD", "COUNT", "1", "BLOCK", "100", "STREAMS", "s", "0-0"]), Some("s".into()));
        assert_eq!(key(&["XINFO", "GROUPS", "s"]), Some("s".into()));
        assert_eq!(key(&["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"]), Some("s".into()));
        assert_eq!(key(&["SCRIPT", "LOAD", "return 1"]), None);
        assert_eq!(key(&["CLUSTER", "SLOTS"]), None);
        assert_eq!(key(&["SCAN", "0", "MATCH", "x*"]), None);
        assert!(is_blocking(&command(&["XREAD", "COUNT", "1", "BLOCK", "100", "STREAMS", "s", "0-0"])));
        assert!(!is_blocking(&command(&["XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"])));
        assert!(!is_blocking(&command(&["HGET", "BLOCK", "f"])));
        // A group or consumer named like an option is not one.
        let named = ["XREADGROUP", "GROUP", "block", "streams", "COUNT", "5", "STREAMS", "s", ">"];
        assert!(!is_blocking(&command(&named)));
        assert_eq!(key(&named), Some("s".into()));
        let blocking = ["XREADGROUP", "GROUP", "streams", "block", "BLOCK", "10", "STREAMS", "s", ">"];
        assert!(is_blocking(&command(&blocking)));
        assert_eq!(key(&blocking), Some("s".into()));
    }
}
