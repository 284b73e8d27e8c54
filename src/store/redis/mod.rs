//! `RedisStore`: the [`MetadataStore`](crate::store::MetadataStore) and
//! [`StreamStore`](crate::store::StreamStore) on a real Redis server (the `redis` crate, tokio).
//!
//! Owns: the wire form of the layout in `keys.rs` — the metadata hash, the liveness hash and the
//! mutex of each group (all under the group's hash tag), the rebuildable index set, the shard
//! streams and their fence keys (each in its stream's slot) — plus connection handling, deadlines
//! and error mapping.
//! Never: parses the aggregate, sets a TTL on metadata, reconstructs a missing metadata key,
//! waits without a deadline, or puts a password into an error. Never built under `--cfg madsim`
//! (the simulation uses `MemoryStore`).
//! Invariant: each metadata method but `raise_fences` and `read_fences` (pipelines of per-key
//! steps) is one atomic server-side step (one command or one Lua script), so the write
//! condition — the whole stamp `(revision, writeId)` — is the safety even when two coordinators
//! race or a stalled one writes after a rollback.
//!
//! Decisions (the same as `MemoryStore`'s; the contract suite in `tests/store_contract.rs` pins
//! them for both stores):
//! - `write` checks the stamp (revision and writeId; an expected empty writeId matches an absent
//!   field, see `CasStamp`), then each liveness guard in request order (absent = 0); a failed
//!   check writes nothing. A request with an empty `write_id` is `Protocol`, nothing sent. A
//!   create (`expected: None`) fails with `RevisionConflict { current }` when the key exists. A
//!   key without a `revision` field, or a partially written hash, is `Layout` (never
//!   overwritten).
//! - `touch_and_check` pipelines HINCRBY + HMGET of the stamp fields (on a Cluster: two requests
//!   sent together, see `metadata.rs`); it returns the full record only when the stamp differs,
//!   and deletes a liveness hash it may have created for an absent
//!   metadata key (forget-liveness script).
//! - `touch_and_load` increments the counter only when the metadata key exists; for an absent key
//!   it writes nothing and returns `liveness: 0, record: None`, so heartbeats for made-up groups
//!   cannot create keys.
//! - `delete` checks the stamp as `write` does, removes the metadata and liveness keys (one
//!   script) and then the index entry; the mutex is left to its holder.
//! - The index is updated with separate commands after a successful create (SADD) or delete
//!   (SREM): the index key has no hash tag, so it cannot join a Cluster-safe script, and it is
//!   never truth. `rebuild_index` SCANs the metadata keys and SADDs every group found (it does not
//!   remove entries). `index_members` and `rebuild_index` return sorted groups and skip entries
//!   that do not parse as a group.
//! - `acquire_mutex` with `ttl_ms == 0` is `Protocol` (Redis: invalid expire time).
//! - Streams: `ensure_group` creates at `0` with MKSTREAM and ignores BUSYGROUP; reading or
//!   claiming on a missing key or group is `Protocol` whose text starts with `NOGROUP`; XACK on a
//!   missing group acknowledges 0; XADD without fields is `Protocol` (`ERR wrong number of
//!   arguments ...`). XREADGROUP `count == 0` means no limit (Redis's `COUNT 0`);
//!   `block_ms: Some(0)` is treated as no BLOCK (Redis would block forever). A pending entry
//!   trimmed away by MAXLEN comes back from `ReadFrom::OwnPending` with no fields (so it can be
//!   acknowledged) and is not returned by `claim_all_pending`.
//! - Fences (`fences.rs`, DESIGN §10): `raise_fences` sends one raise script per key in one
//!   pipeline (each key one atomic step, the keys not one step together; after NOSCRIPT only the
//!   calls that did not run are sent again, so no key is raised twice). Each fenced stream method
//!   is one script: the fence check, then the command (never BLOCK); a refusal is `Fenced` naming
//!   the stored `<counter>.<nonce>` and touches nothing. The command's own errors keep their codes
//!   (`NOGROUP` as unfenced). A fenced claim longer than `CLAIM_PAGES_PER_CALL` pages takes several
//!   script calls, each re-checking the fence.
//! - Server errors keep their wire form in the text (`NOGROUP ...`, `ERR ...`), followed by the
//!   command in parentheses.
//!
//! Connection: `redis://[user:password@]host:port[/db]` or `rediss://` (TLS, rustls with the
//! `ring` provider; trust roots and the mutual-TLS client certificate in [`RedisTlsOptions`], see
//! `tls.rs`), RESP2, one shared multiplexed connection plus dedicated connections for blocking
//! reads. With [`RedisSentinelOptions`] the server is the master the sentinels name at each
//! connect (`sentinel.rs`). [`RedisStore::open_cluster`] runs on a Redis Cluster (`cluster.rs`):
//! every multi-key script touches one slot, and batched calls go as one call per slot; with
//! `rediss://` seeds every node connection is TLS with the same [`RedisTlsOptions`].
//!
//! Every round trip (connect included) has a deadline, [`RedisStoreOptions::timeout_ms`]; a
//! blocking read adds its BLOCK time. A failed or timed-out connection is dropped and the next
//! call reconnects, so after a server restart or failover the first call may fail with
//! `Unavailable` and the following ones reach the new server. `identity()` then reports the new
//! `run_id` / replication id, which the coordinator treats as evidence of lost writes.

mod cluster;
mod conn;
mod doorbell;
mod errors;
mod fences;
mod metadata;
mod node_conn;
mod probe;
mod scripts;
mod sentinel;
mod streams;
pub(crate) mod tls;

use std::sync::Arc;

use ::redis::{Cmd, FromRedisValue, IntoConnectionInfo, ScriptInvocation, Value};

use self::conn::{Conn, Connector, Lane, Target};
use self::errors::Redactor;
use self::scripts::Scripts;
use crate::store::StoreError;

pub use self::sentinel::{parse_sentinel_address, url_names_master, RedisSentinelOptions};
pub use self::tls::RedisTlsOptions;

/// Shortest wait (ms) of the Cluster client before it retries a command answered `TRYAGAIN`,
/// `CLUSTERDOWN` or `MASTERDOWN` (the crate's default is 1,280 ms; see `open_cluster`). The
/// n-th retry waits a random time between this and `10 × 2^n` ms (the crate's formula).
const CLUSTER_RETRY_WAIT_MS_MIN: u64 = 10;
/// Longest such wait (ms); the store's deadline (`timeout_ms`) still bounds the whole call.
const CLUSTER_RETRY_WAIT_MS_MAX: u64 = 500;

/// Tuning of a [`RedisStore`]. `Default` gives production values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisStoreOptions {
    /// Deadline of one round trip, connecting included. A blocking read adds its BLOCK time.
    pub timeout_ms: u64,
    /// SCAN COUNT hint used by `rebuild_index`.
    pub scan_count: u64,
    /// XAUTOCLAIM COUNT of one page of `claim_all_pending`.
    pub claim_page_count: u64,
    /// CA and client certificate files of a `rediss://` connection or Cluster (none set: platform
    /// roots, no client certificate). Setting any of them with a `redis://` URL or seeds is an
    /// error.
    pub tls: RedisTlsOptions,
    /// Find the master through Redis Sentinel (see [`RedisStore::open`]); `None`: the URL's
    /// server.
    pub sentinel: Option<RedisSentinelOptions>,
    /// Read new entries of a fenced shard with a plain `XREADGROUP` naming the grant's gate
    /// stream (DESIGN §10), falling back to the fenced read script when the gate is missing.
    /// `false`: every fenced read runs the script (kept for the data-path bench's side by side).
    pub fenced_read_gates: bool,
    /// Ack the shards of a batched fenced ack whose fence this store's connection of watched acks
    /// has read since it `WATCH`ed the fence key in a `MULTI`/`XACK`/`EXEC` transaction, which
    /// Redis aborts if the key was written since (DESIGN §10), instead of the fenced ack script;
    /// the script decides the rest, and any shard whose transaction did not run. Not on a
    /// Cluster. `false`: every fenced ack runs the script (kept for the data-path bench's side by
    /// side).
    pub watched_acks: bool,
}

impl Default for RedisStoreOptions {
    fn default() -> Self {
        Self {
            timeout_ms: 2_000,
            scan_count: 1_000,
            claim_page_count: 100,
            tls: RedisTlsOptions::default(),
            sentinel: None,
            fenced_read_gates: true,
            watched_acks: true,
        }
    }
}

/// The metadata and stream stores on one Redis server. Cheap to clone (shared connections).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Connector,
    scripts: Scripts,
    options: RedisStoreOptions,
    /// The server refused an INFO naming two sections (before Redis 7.0): identity checks send
    /// one INFO per section, pipelined.
    info_one_section: std::sync::atomic::AtomicBool,
    /// The server refused `MULTI`, `EXEC` or `WATCH` to this store's user (an ACL
    /// without them): fenced acks run the script only from then on.
    watched_acks_refused: std::sync::atomic::AtomicBool,
    /// Nodes (host, port) that refused CLUSTER NODES, and since when: identity checks read their
    /// own account with CLUSTER SLOTS, which shows no slot migration, until the retry.
    cluster_nodes_denied: cluster::NodeBackoff,
    /// On a Cluster: connections to masters serving no slot, which the cluster client cannot
    /// route to (the identity reads them too).
    direct: Option<cluster::DirectNodes>,
}

impl RedisStore {
    /// A store over `conn`, with nothing learnt about its servers yet.
    fn over(conn: Connector, options: RedisStoreOptions, direct: Option<cluster::DirectNodes>) -> Self {
        Self {
            inner: Arc::new(Inner {
                conn,
                scripts: Scripts::new(),
                options,
                info_one_section: Default::default(),
                watched_acks_refused: Default::default(),
                cluster_nodes_denied: cluster::NodeBackoff::new(cluster::CLUSTER_NODES_RETRY_MS),
                direct,
            }),
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL is left out on purpose: it may carry a password.
        f.debug_struct("RedisStore").field("options", &self.inner.options).finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Parses `url` and prepares the store; the first call connects. No network I/O, but the TLS
    /// files of `options.tls` are read and checked here.
    ///
    /// - `redis://[user:password@]host:port[/db]`, or a unix socket URL: plain TCP.
    /// - `rediss://[user:password@]host:port[/db]`: TLS. The server's certificate must chain to
    ///   [`RedisTlsOptions::ca_file`] when set, else to the platform's roots (`SSL_CERT_FILE` /
    ///   `SSL_CERT_DIR` override where those are looked for), and must name the URL's host (DNS or
    ///   IP SAN). With `client_cert_file` + `client_key_file` the store presents a client
    ///   certificate (servers with `tls-auth-clients yes`).
    /// - `rediss://host:port/#insecure` (the `redis` crate's switch for skipping verification)
    ///   fails with `Unsupported`: that crate feature is not compiled in.
    /// - With [`RedisStoreOptions::sentinel`]: `redis[s]://[user:password@]<master name>[/db]`. The
    ///   URL names the master instead of a server (its host must be the master name, without a
    ///   port) and carries the master's credentials and database; the sentinels' own password is
    ///   [`RedisSentinelOptions::sentinel_password`]. Every connection asks the sentinels (in the
    ///   order given) for the current master and checks its `ROLE`, so after a failover the next
    ///   connection reaches the new master; `identity()` then reports its new `run_id` /
    ///   replication id. A lookup that finds no healthy master (during a failover) is
    ///   `Unavailable`. With `rediss://` every connection is TLS — to the sentinels and to the
    ///   master they name — with [`RedisStoreOptions::tls`] for both.
    ///
    /// Errors: `Config` for a malformed URL, TLS files with a non-`rediss://` URL, only one of
    /// the client certificate and key, or an unreadable or invalid PEM file (naming the file).
    /// Error texts never contain the URL or file contents. A server that fails verification is
    /// reported by the first call, as `Unavailable` (see [`connect`](Self::connect)).
    pub fn open(url: &str, options: RedisStoreOptions) -> Result<Self, StoreError> {
        let info = url.into_connection_info().map_err(|e| {
            StoreError::Config(format!(
                "invalid Redis URL ({}); expected redis://[user:password@]host:port[/db] or rediss://...",
                e.kind_name()
            ))
        })?;
        let redactor = Redactor::new(info.redis_settings().password());
        let (target, sentinel_redactor) = match &options.sentinel {
            None => (Target::Direct(Box::new(tls::client(info, &options.tls, &redactor)?)), Redactor::default()),
            Some(sentinel) => {
                let sentinel_redactor = Redactor::new(sentinel.sentinel_password.as_deref());
                let certificates = tls::sentinel_certificates(&info, &options.tls)?;
                let client = sentinel::client(url, &info, sentinel, certificates, &redactor)?;
                let name = sentinel.master_name.trim().to_string();
                (Target::Sentinel { client: Arc::new(tokio::sync::Mutex::new(client)), name }, sentinel_redactor)
            }
        };
        let conn = Connector::new(target, options.timeout_ms, redactor, sentinel_redactor);
        Ok(Self::over(conn, options, None))
    }

    /// [`open`](Self::open), then one PING so an unreachable or misconfigured server is reported
    /// at once (as `Unavailable`, within the timeout).
    pub async fn connect(url: &str, options: RedisStoreOptions) -> Result<Self, StoreError> {
        let store = Self::open(url, options)?;
        let _: Value = store.query("PING", ::redis::cmd("PING")).await?;
        Ok(store)
    }

    /// Prepares the store on a Redis Cluster found from `nodes`, its seed nodes
    /// (`redis://[user:password@]host:port`, any subset of the cluster's nodes; every seed must
    /// carry the same credentials). No network I/O: the first call reads the slot map; the TLS
    /// files of `options.tls` are read and checked here.
    ///
    /// TLS: with `rediss://` seeds every connection, to the seeds and to each node CLUSTER SLOTS
    /// names, is TLS, verified as [`open`](Self::open) verifies one server (the CA file or the
    /// platform's roots; each node's certificate must name the address the cluster announces for
    /// it, usually an IP) and presenting the client certificate when one is set. The nodes must
    /// announce their TLS ports in CLUSTER SLOTS (`tls-cluster yes`).
    ///
    /// Each command goes to the primary serving its key's slot; the `redis` crate follows MOVED
    /// and ASK redirects and retries TRYAGAIN, CLUSTERDOWN and a lost connection within its retry
    /// budget, all under [`RedisStoreOptions::timeout_ms`]. Such a resend is safe here: every
    /// metadata write is conditioned on its stamp, every fenced operation on its fence, and XACK
    /// is idempotent. It is not free: a resent XADD adds the entry twice (at-least-once, as a
    /// producer's own retry), and a resent read of new entries (`XREADGROUP >`, after a connection
    /// lost with the first one's reply, or a pipeline resent whole because another of its reads
    /// was redirected) answers the next entries, while the first read's stay pending to the
    /// consumer unseen: they come back at its next own-pending read (the pending sweep, 30 s by
    /// default, or the shard's next owner), after later ones — delayed and out of order, never
    /// lost. Batched calls (fenced reads and acks of several shards, fence raises and reads,
    /// reads of several streams) are split into one call per slot, sent concurrently; each part
    /// is as atomic as the single-server call, the parts are not one step together (they never
    /// were across shards: each shard's outcome is its own). `identity()` covers every primary,
    /// and `rebuild_index` SCANs every primary.
    ///
    /// Errors: `Config` for no seed, a malformed seed, seeds with different credentials, seeds
    /// that mix `redis://` and `rediss://`, TLS files with `redis://` seeds, an unreadable or
    /// invalid TLS file, and Sentinel (which cannot be combined with a Cluster); `Unsupported`
    /// for `rediss://...#insecure`.
    pub fn open_cluster(nodes: &[String], options: RedisStoreOptions) -> Result<Self, StoreError> {
        if nodes.is_empty() {
            return Err(StoreError::Config("a Redis Cluster needs at least one seed node".into()));
        }
        if options.sentinel.is_some() {
            return Err(StoreError::Config("Redis Sentinel and Redis Cluster cannot be combined".into()));
        }
        let mut infos = Vec::with_capacity(nodes.len());
        for (i, node) in nodes.iter().enumerate() {
            let info = node.as_str().into_connection_info().map_err(|e| {
                StoreError::Config(format!(
                    "invalid Redis Cluster seed node #{} ({}); expected redis://[user:password@]host:port or \
                     rediss://...",
                    i + 1,
                    e.kind_name()
                ))
            })?;
            infos.push(info);
        }
        let credentials = |info: &::redis::ConnectionInfo| {
            (info.redis_settings().username().map(str::to_string), info.redis_settings().password().map(str::to_string))
        };
        if infos.iter().any(|info| credentials(info) != credentials(&infos[0])) {
            return Err(StoreError::Config("the Redis Cluster seed nodes carry different credentials".into()));
        }
        let certificates = tls::cluster_certificates(&infos, &options.tls)?;
        let redactor = Redactor::new(infos[0].redis_settings().password());
        // The crate's per-request response timeout is the store's deadline on the shared
        // connection and beyond any blocking read on the blocking ones: the deadline of every
        // round trip is the store's (see `conn.rs`). Its default wait before retrying
        // TRYAGAIN, CLUSTERDOWN or MASTERDOWN is at least 1.28 s, which with the default 2 s
        // deadline makes one retry nearly the whole budget and a second impossible: a command
        // naming two keys that a slot migration has split (a gated read: gate and stream) then
        // failed as `Unavailable` although the keys were together again a few hundred
        // milliseconds later. Waits of at most 10, 20, 40, ... ms (and `CLUSTER_RETRY_WAIT_MS_MAX`)
        // retry such a command several times within the deadline.
        let direct = cluster::DirectNodes::new(infos[0].clone(), certificates.clone(), options.timeout_ms);
        // `ASK` redirects the crate gave up on are followed on connections of the store's own (see
        // `conn::asking_then`), opened as the idle masters' are.
        let aids = std::sync::Arc::new(conn::ClusterAids::new(
            cluster::DirectNodes::new(infos[0].clone(), certificates.clone(), options.timeout_ms)
                .with_scripts(Scripts::sources()),
        ));
        // Two clients (`conn::ClusterClients`): the shared connection's requests time out inside
        // the crate too, half a deadline after the store's own deadline (so the crate never gives
        // up on, and resends, a command its caller still waits for: a resent XADD would add its
        // entry twice), which bounds the crate's own requests no caller waits for (the `PING` of
        // each node while a connection is built); blocking reads' outlast their BLOCK.
        let client = |response_timeout: std::time::Duration| {
            let mut builder = ::redis::cluster::ClusterClientBuilder::new(infos.clone())
                .connection_timeout(std::time::Duration::from_millis(options.timeout_ms.max(1)))
                .response_timeout(response_timeout)
                .min_retry_wait(CLUSTER_RETRY_WAIT_MS_MIN)
                .max_retry_wait(CLUSTER_RETRY_WAIT_MS_MAX);
            if let Some(certificates) = certificates.clone() {
                // Every connection the client opens (shared, blocking reads, redirects to nodes
                // learnt from CLUSTER SLOTS) is TLS with these roots and this client certificate.
                builder = builder.certs(certificates);
            }
            builder.build().map_err(|e| StoreError::Config(format!("Redis Cluster client: {}", e.kind_name())))
        };
        let clients = conn::ClusterClients {
            shared: client(std::time::Duration::from_millis(options.timeout_ms.max(1).saturating_mul(3) / 2))?,
            blocking: client(std::time::Duration::from_secs(24 * 3600))?,
        };
        let conn =
            Connector::new(Target::Cluster(Box::new(clients), aids), options.timeout_ms, redactor, Redactor::default());
        Ok(Self::over(conn, options, Some(direct)))
    }

    /// [`open_cluster`](Self::open_cluster), then one PING so an unreachable cluster is reported
    /// at once (as `Unavailable`, within the timeout).
    pub async fn connect_cluster(nodes: &[String], options: RedisStoreOptions) -> Result<Self, StoreError> {
        let store = Self::open_cluster(nodes, options)?;
        let _: Value = store.query("PING", ::redis::cmd("PING")).await?;
        Ok(store)
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.conn.target().is_cluster()
    }

    /// The options this store was opened with.
    pub fn options(&self) -> &RedisStoreOptions {
        &self.inner.options
    }

    /// One command on the shared connection.
    async fn query<T: FromRedisValue + Send>(&self, command: &str, cmd: Cmd) -> Result<T, StoreError> {
        self.inner
            .conn
            .run(Lane::Shared, command, 0, |mut c: Conn| async move {
                let value: T = cmd.query_async(&mut c).await?;
                Ok((value, c))
            })
            .await
    }

    /// Several commands in one round trip (not a transaction) on the shared connection; the reply
    /// is one value per command. `name` names the batch in errors.
    async fn pipeline<T: FromRedisValue + Send>(&self, name: &str, pipe: ::redis::Pipeline) -> Result<T, StoreError> {
        self.inner
            .conn
            .run(Lane::Shared, name, 0, |mut c: Conn| async move {
                let value: T = pipe.query_async(&mut c).await?;
                Ok((value, c))
            })
            .await
    }

    /// One script call (EVALSHA, with SCRIPT LOAD + retry on NOSCRIPT) on the shared connection.
    /// On NOSCRIPT after that, once more: on a Redis Cluster the client sends SCRIPT LOAD to every
    /// node it knows, so a primary that joined since its last topology read (a scale-out, a slot
    /// moved onto it) is missed and the retried EVALSHA, redirected there, is refused again; the
    /// redirect refreshed the topology, so the second load reaches it (e2e `cluster` scale-out: a
    /// fenced ack failed `NOSCRIPT` now and then).
    async fn invoke(&self, name: &str, invocation: ScriptInvocation<'_>) -> Result<Value, StoreError> {
        self.inner
            .conn
            .run(Lane::Shared, name, 0, |mut c: Conn| async move {
                let value: Value = match invocation.invoke_async(&mut c).await {
                    Err(e) if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) => {
                        invocation.invoke_async(&mut c).await?
                    }
                    other => other?,
                };
                Ok((value, c))
            })
            .await
    }
}

impl RedisStore {
    /// The indices of `keys` grouped by Redis Cluster slot, in order of first appearance: the
    /// parts of a batched call that must each go to one slot. One part holding every index on a
    /// single server, where one command may name any keys.
    fn slot_parts<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Vec<Vec<usize>> {
        let keys: Vec<&str> = keys.into_iter().collect();
        if !self.is_cluster() {
            return vec![(0..keys.len()).collect()];
        }
        let mut parts: Vec<Vec<usize>> = Vec::new();
        let mut part_of: std::collections::HashMap<::redis::cluster_routing::Slot, usize> =
            std::collections::HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = ::redis::cluster_routing::Slot::for_key(key.as_bytes());
            let at = *part_of.entry(slot).or_insert_with(|| {
                parts.push(Vec::new());
                parts.len() - 1
            });
            parts[at].push(i);
        }
        parts
    }

    /// A batched call split by slot: `call` runs once per part of `parts` (see
    /// [`slot_parts`](Self::slot_parts)) on that part's items, all parts concurrently, and the
    /// answers come back in the order of `items`. Any part's error fails the whole call (the
    /// other parts may have run, as with a single-server call that fails midway).
    async fn per_slot<T, R, F, Fut>(
        &self,
        what: &str,
        items: &[T],
        parts: &[Vec<usize>],
        call: F,
    ) -> Result<Vec<R>, StoreError>
    where
        T: Clone,
        F: Fn(Vec<T>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<R>, StoreError>>,
    {
        let calls = parts.iter().map(|part| call(part.iter().map(|&i| items[i].clone()).collect()));
        let answers = futures_util::future::join_all(calls).await;
        let mut out: Vec<Option<R>> = items.iter().map(|_| None).collect();
        for (part, answer) in parts.iter().zip(answers) {
            let answer = answer?;
            if answer.len() != part.len() {
                return Err(StoreError::Protocol(format!("{what}: {} answers for {} items", answer.len(), part.len())));
            }
            for (&i, value) in part.iter().zip(answer) {
                out[i] = Some(value);
            }
        }
        out.into_iter()
            .collect::<Option<Vec<R>>>()
            .ok_or_else(|| StoreError::Protocol(format!("{what}: an item in no slot part")))
    }

    /// [`per_slot`](Self::per_slot) for calls that answer each item on its own: a part that
    /// fails as a whole fails only its own items, each with that error. So one primary that
    /// fails over or hangs does not fail the shards of the other slots of a consumer's batched
    /// read or ack, nor throw away what their reads delivered (as a single-server call's shards
    /// already keep their own outcomes).
    async fn per_slot_each<T, R, F, Fut>(
        &self,
        what: &str,
        items: &[T],
        parts: &[Vec<usize>],
        call: F,
    ) -> Result<Vec<Result<R, StoreError>>, StoreError>
    where
        T: Clone,
        F: Fn(Vec<T>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Result<R, StoreError>>, StoreError>>,
    {
        self.per_slot(what, items, parts, |part| {
            let count = part.len();
            let answer = call(part);
            async move { answer.await.or_else(|error| Ok((0..count).map(|_| Err(error.clone())).collect())) }
        })
        .await
    }

    /// SCRIPT LOAD of one script (the probe's check that scripting is permitted).
    async fn load_script(&self, name: &str, script: &::redis::Script) -> Result<(), StoreError> {
        self.inner
            .conn
            .run(Lane::Shared, name, 0, |mut c: Conn| async move {
                script.load_async(&mut c).await?;
                Ok(((), c))
            })
            .await
    }
}

trait KindName {
    fn kind_name(&self) -> String;
}

impl KindName for ::redis::RedisError {
    /// The error's category only: URL parse errors may echo the URL, which may hold a password.
    fn kind_name(&self) -> String {
        format!("{:?}", self.kind())
    }
}
