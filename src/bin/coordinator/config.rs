//! What `coordinator serve` runs with: [`Settings`], resolved from flags and environment (which
//! win), the optional TOML file (`--config`), and defaults.
//!
//! The TOML file takes the keys of [`FileConfig`] (unknown keys are an error, so a typo cannot
//! silently leave a default in force):
//!
//! ```toml
//! listen = "0.0.0.0:7420"
//! redis_url = "redis://coordinator:secret@redis:6379/0"   # REDIS_URL is preferred for secrets
//! redis_tls_ca_file = "/etc/rsc/redis-ca.pem"             # rediss:// only (default: platform roots)
//! redis_tls_client_cert_file = "/etc/rsc/client.pem"      # mutual TLS: certificate and key together
//! redis_tls_client_key_file = "/etc/rsc/client.key"
//! # Sentinel instead of a fixed server (then redis_url is optional and may only name the master,
//! # redis://[user:password@]<master name>[/db]; the sentinel password is REDIS_SENTINEL_PASSWORD):
//! redis_sentinels = ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]
//! redis_sentinel_master = "mymaster"
//! # Redis Cluster instead of one server (seed nodes; REDIS_CLUSTER_NODES is preferred for secrets;
//! # all rediss:// for TLS, with the redis_tls_* files above):
//! redis_cluster_nodes = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]
//! instance_id = "coordinator-a"
//! tick_interval_ms = 250
//! idle_group_audit_ms = 120000                             # longest an idle group goes unticked (0: never skip)
//! ticker_silence_ms = 3000                                 # another instance's ticker counts dead after (0: no sharing)
//! heard_relay_ms = 500                                     # relay heard heartbeats to tick owners every (0: off)
//! ticker_refresh_ms = 1000                                 # re-read the group index and tick roster at most every (0: every pass)
//! max_assignment_lease_ms = 8000                           # longest lease a group may use; same on every instance
//! mutex_ttl_ms = 2000
//! mutex_attempts_max = 20
//! mutex_retry_ms = 10
//! cas_attempts_max = 8
//! redis_timeout_ms = 2000
//! body_bytes_max = 1048576
//! concurrency_max = 1024
//! header_read_timeout_ms = 10000
//! shutdown_timeout_ms = 10000
//! # Listener: shutdown accept window, /metrics exposure, TLS (issue 9)
//! shutdown_accept_ms = 5000                               # keep accepting this long after SIGTERM
//! metrics_member_labels = false                           # per-member series on /metrics (off: no member ids)
//! tls_cert_file = "/etc/rsc/coordinator.pem"              # serve https:// (certificate chain, PEM)
//! tls_key_file = "/etc/rsc/coordinator.key"
//! tls_client_ca_file = "/etc/rsc/clients-ca.pem"          # mutual TLS: require a client certificate from this CA
//! ```
//!
//! The admin token and the sentinel password are not read from the file: pass them as
//! `COORDINATOR_ADMIN_TOKEN` / `REDIS_SENTINEL_PASSWORD` (or the flags).
//!
//! Sentinel (`--redis-sentinels` + `--redis-sentinel-master`, both or neither): Sentinel chooses
//! the server, so a Redis URL that names one (a host other than the master name, or a port) is
//! rejected as ambiguous. Without a URL the store URL is `redis://<master name>`; TLS through
//! Sentinel is `rediss://<master name>` (TLS to the sentinels and to the master, with the same
//! Redis TLS files).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::cli::ServeArgs;
use rsc::http::auth::{ClientTokens, CLIENT_TOKEN_LEN_MAX, CLIENT_TOKEN_LEN_MIN};
use rsc::http::router::{BODY_BYTES_MAX_DEFAULT, CONCURRENCY_MAX_DEFAULT};
use rsc::service::CoordinatorOptions;
use rsc::store::redis::{parse_sentinel_address, url_names_master, RedisSentinelOptions, RedisTlsOptions};

/// Default listen address.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7420";

/// Why the settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// The `--config` file is not valid TOML for [`FileConfig`].
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A value is out of range.
    #[error("invalid setting {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

/// The `--config` TOML file. Every key is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub redis_url: Option<String>,
    pub redis_tls_ca_file: Option<PathBuf>,
    pub redis_tls_client_cert_file: Option<PathBuf>,
    pub redis_tls_client_key_file: Option<PathBuf>,
    pub redis_sentinels: Option<Vec<String>>,
    pub redis_sentinel_master: Option<String>,
    pub redis_cluster_nodes: Option<Vec<String>>,
    pub instance_id: Option<String>,
    pub tick_interval_ms: Option<u64>,
    pub idle_group_audit_ms: Option<u64>,
    pub ticker_silence_ms: Option<u64>,
    pub heard_relay_ms: Option<u64>,
    pub ticker_refresh_ms: Option<u64>,
    pub max_assignment_lease_ms: Option<u64>,
    pub mutex_ttl_ms: Option<u64>,
    pub mutex_attempts_max: Option<u32>,
    pub mutex_retry_ms: Option<u64>,
    pub cas_attempts_max: Option<u32>,
    pub redis_timeout_ms: Option<u64>,
    pub body_bytes_max: Option<usize>,
    pub concurrency_max: Option<usize>,
    pub header_read_timeout_ms: Option<u64>,
    pub shutdown_timeout_ms: Option<u64>,
    /// Client tokens (`[SCOPE=]TOKEN`), added to those of the flags and environment.
    pub client_tokens: Option<Vec<String>>,
    // Listener: shutdown accept window, /metrics exposure, TLS (issue 9).
    pub shutdown_accept_ms: Option<u64>,
    pub metrics_member_labels: Option<bool>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_client_ca_file: Option<PathBuf>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse { path: path.into(), message })
    }

    /// The file's settings, or what is wrong with it: the parser's message with every quoted
    /// value blanked, and the line and column. Never the file's text: the parser's own rendering
    /// quotes the offending line, and a secret written on it (an `admin_token` the file refuses,
    /// a `client_tokens` string instead of an array, an unquoted `redis_url` with a password)
    /// would go to stderr and the error log (a review finding).
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(String::new(), |span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.chars().rev().take_while(|c| *c != '\n').count() + 1;
                format!(" (line {line}, column {column})")
            });
            format!("{}{at}", blank_quoted(e.message()))
        })
    }
}

/// `text` with the contents of every double-quoted part replaced by `…` (serde quotes a string
/// value it refuses, escaped as Rust's `Debug` does).
fn blank_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        out.push('…');
        let mut escaped = false;
        for inner in chars.by_ref() {
            if !escaped && inner == '"' {
                out.push('"');
                break;
            }
            escaped = !escaped && inner == '\\';
        }
    }
    out
}

/// Everything `serve` runs with.
#[derive(Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    /// `None`: serve from the in-memory store.
    pub redis_url: Option<String>,
    /// CA and client certificate files of a `rediss://` URL.
    pub redis_tls: RedisTlsOptions,
    /// Find the master through Sentinel (`redis_url` then names the master).
    pub redis_sentinel: Option<RedisSentinelOptions>,
    /// Seed nodes of a Redis Cluster (empty: no Cluster; then `redis_url` is `None`).
    pub redis_cluster_nodes: Vec<String>,
    pub admin_token: Option<String>,
    pub client_tokens: ClientTokens,
    pub coordinator: CoordinatorOptions,
    pub redis_timeout_ms: u64,
    pub body_bytes_max: usize,
    pub concurrency_max: usize,
    pub header_read_timeout_ms: u64,
    pub shutdown_timeout_ms: u64,
    /// The listener's own settings (accept window, /metrics exposure, TLS).
    pub listener: ListenerSettings,
}

/// Default of `shutdown_accept_ms`: a few seconds, long enough for a Kubernetes Service's
/// endpoints (kube-proxy, ingress controllers) to drop a terminating pod in a typical cluster.
pub const SHUTDOWN_ACCEPT_MS_DEFAULT: u64 = 5_000;
/// Upper bound of `shutdown_accept_ms`, so a shutdown always ends.
pub const SHUTDOWN_ACCEPT_MS_MAX: u64 = 300_000;

/// How the HTTP listener behaves beyond routing requests: how long it keeps accepting after
/// SIGTERM, whether /metrics names members, and TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerSettings {
    /// After SIGTERM, keep accepting new connections this long before closing the listener.
    pub shutdown_accept_ms: u64,
    /// Export per-member series on /metrics.
    pub metrics_member_labels: bool,
    /// `None`: plain HTTP.
    pub tls: Option<ListenerTlsFiles>,
}

/// PEM files of the listener's TLS (read and checked at startup by `rsc::http::tls`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerTlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Mutual TLS: clients must present a certificate chaining to this CA.
    pub client_ca_file: Option<PathBuf>,
}

/// The listener settings from flags/environment (which win), the file and defaults.
fn resolve_listener(args: &ServeArgs, file: &FileConfig) -> Result<ListenerSettings, ConfigError> {
    let path =
        |key, flag: &Option<PathBuf>, value: &Option<PathBuf>| path_not_blank(key, flag.clone().or(value.clone()));
    let cert_file = path("tls_cert_file", &args.tls_cert_file, &file.tls_cert_file)?;
    let key_file = path("tls_key_file", &args.tls_key_file, &file.tls_key_file)?;
    let client_ca_file = path("tls_client_ca_file", &args.tls_client_ca_file, &file.tls_client_ca_file)?;
    let invalid = |key, message: &str| Err(ConfigError::Invalid { key, message: message.into() });
    let tls = match (cert_file, key_file, client_ca_file) {
        (None, None, None) => None,
        (Some(cert_file), Some(key_file), client_ca_file) => {
            Some(ListenerTlsFiles { cert_file, key_file, client_ca_file })
        }
        (Some(_), None, _) => return invalid("tls_key_file", "the TLS certificate needs its key"),
        (None, Some(_), _) => return invalid("tls_cert_file", "the TLS key needs its certificate"),
        (None, None, Some(_)) => {
            return invalid("tls_cert_file", "client certificate verification needs TLS (a certificate and key)")
        }
    };
    let shutdown_accept_ms = args.shutdown_accept_ms.or(file.shutdown_accept_ms).unwrap_or(SHUTDOWN_ACCEPT_MS_DEFAULT);
    if shutdown_accept_ms > SHUTDOWN_ACCEPT_MS_MAX {
        let message = format!("must be at most {SHUTDOWN_ACCEPT_MS_MAX} (a shutdown must end)");
        return Err(ConfigError::Invalid { key: "shutdown_accept_ms", message });
    }
    let metrics_member_labels = args.metrics_member_labels.or(file.metrics_member_labels).unwrap_or(false);
    Ok(ListenerSettings { shutdown_accept_ms, metrics_member_labels, tls })
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password and the token is a secret: only their presence is shown.
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("redis", &self.redis_url.as_ref().map(|_| "<set>"))
            .field("redis_tls", &self.redis_tls)
            .field("redis_sentinel", &self.redis_sentinel)
            // Seed URLs may carry a password: only their number.
            .field("redis_cluster_nodes", &self.redis_cluster_nodes.len())
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("client_tokens", &self.client_tokens)
            .field("instance_id", &self.coordinator.instance_id)
            .field("tick_interval_ms", &self.coordinator.tick_interval_ms)
            .field("max_assignment_lease_ms", &self.coordinator.max_assignment_lease_ms)
            .field("body_bytes_max", &self.body_bytes_max)
            .field("shutdown_timeout_ms", &self.shutdown_timeout_ms)
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

/// The largest `max_assignment_lease_ms`: 24 h, the longest lease a group config may name.
const LEASE_CEILING_MS_MAX: u64 = 24 * 3_600_000;

/// Bound of `ticker_refresh_ms`.
const TICKER_REFRESH_MS_MAX: u64 = 60_000;

impl Settings {
    /// Flags and environment over the file over defaults. `rng_seed` seeds the embedded store
    /// and is mixed into the coordinator's draw from the OS; pass something that differs between
    /// processes.
    pub fn resolve(args: &ServeArgs, file: FileConfig, rng_seed: u64) -> Result<Self, ConfigError> {
        let defaults = CoordinatorOptions::default();
        let redis_sentinel = resolve_sentinel(args, &file)?;
        let listener = resolve_listener(args, &file)?;
        let listen = match args.listen.or(file.listen) {
            Some(listen) => listen,
            // safe: a constant that parses (checked by a unit test).
            None => LISTEN_DEFAULT.parse().expect("LISTEN_DEFAULT parses"),
        };
        let non_empty = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
        let coordinator = CoordinatorOptions {
            instance_id: non_empty(args.instance_id.clone().or(file.instance_id)).unwrap_or_else(default_instance_id),
            mutex_ttl_ms: file.mutex_ttl_ms.unwrap_or(defaults.mutex_ttl_ms),
            mutex_attempts_max: file.mutex_attempts_max.unwrap_or(defaults.mutex_attempts_max),
            mutex_retry_ms: file.mutex_retry_ms.unwrap_or(defaults.mutex_retry_ms),
            cas_attempts_max: file.cas_attempts_max.unwrap_or(defaults.cas_attempts_max),
            tick_interval_ms: args.tick_interval_ms.or(file.tick_interval_ms).unwrap_or(defaults.tick_interval_ms),
            idle_group_audit_ms: file.idle_group_audit_ms.unwrap_or(defaults.idle_group_audit_ms),
            renew_deferrals_from_heartbeats: defaults.renew_deferrals_from_heartbeats,
            ticker_silence_ms: file.ticker_silence_ms.unwrap_or(defaults.ticker_silence_ms),
            heard_relay_ms: file.heard_relay_ms.unwrap_or(defaults.heard_relay_ms),
            ticker_refresh_ms: file.ticker_refresh_ms.unwrap_or(defaults.ticker_refresh_ms),
            // Set from `concurrency_max` below.
            group_sections_max: defaults.group_sections_max,
            rng_seed,
            max_assignment_lease_ms: args
                .max_assignment_lease_ms
                .or(file.max_assignment_lease_ms)
                .unwrap_or(defaults.max_assignment_lease_ms),
            planted: defaults.planted,
        };
        let redis_url = set_not_blank("redis_url", args.redis_url.clone().or(file.redis_url), REDIS_UNSET_HINT)?;
        let redis_cluster_nodes: Vec<String> = match &args.redis_cluster_nodes {
            Some(list) => list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect(),
            None => file.redis_cluster_nodes.clone().unwrap_or_default().iter().map(|s| s.trim().to_string()).collect(),
        };
        // A list given empty, in the file too, is refused like a blank variable: with no other
        // Redis setting it would mean the in-memory store.
        let nodes_given = args.redis_cluster_nodes.is_some() || file.redis_cluster_nodes.is_some();
        if nodes_given && redis_cluster_nodes.iter().all(String::is_empty) {
            return Err(set_but_blank("redis_cluster_nodes", REDIS_UNSET_HINT));
        }
        let redis_url = match &redis_sentinel {
            Some(sentinel) => Some(redis_url.unwrap_or_else(|| format!("redis://{}", sentinel.master_name))),
            None => redis_url,
        };
        let mut settings = Settings {
            listen,
            redis_url,
            redis_tls: RedisTlsOptions {
                ca_file: path_not_blank(
                    "redis_tls_ca_file",
                    args.redis_tls_ca_file.clone().or(file.redis_tls_ca_file),
                )?,
                client_cert_file: path_not_blank(
                    "redis_tls_client_cert_file",
                    args.redis_tls_client_cert_file.clone().or(file.redis_tls_client_cert_file),
                )?,
                client_key_file: path_not_blank(
                    "redis_tls_client_key_file",
                    args.redis_tls_client_key_file.clone().or(file.redis_tls_client_key_file),
                )?,
            },
            redis_sentinel,
            redis_cluster_nodes,
            admin_token: admin_token(args.admin_token.clone())?,
            client_tokens: {
                let specs: Vec<&String> =
                    args.client_tokens.iter().chain(file.client_tokens.iter().flatten()).collect();
                let tokens = ClientTokens::parse(&specs)
                    .map_err(|e| ConfigError::Invalid { key: "client_tokens", message: e.to_string() })?;
                if (!specs.is_empty() || file.client_tokens.is_some()) && tokens.is_empty() {
                    let hint = "unset it to leave the data plane open, or set a token";
                    return Err(set_but_blank("client_tokens", hint));
                }
                tokens
            },
            coordinator,
            redis_timeout_ms: file.redis_timeout_ms.unwrap_or(2_000),
            body_bytes_max: args.body_bytes_max.or(file.body_bytes_max).unwrap_or(BODY_BYTES_MAX_DEFAULT),
            concurrency_max: file.concurrency_max.unwrap_or(CONCURRENCY_MAX_DEFAULT),
            header_read_timeout_ms: file.header_read_timeout_ms.unwrap_or(10_000),
            shutdown_timeout_ms: args.shutdown_timeout_ms.or(file.shutdown_timeout_ms).unwrap_or(10_000),
            listener,
        };
        // One group's sections may hold at most a quarter of the request slots, and at least 8
        // (a tick and an evidence round beside a few requests, however few slots there are).
        settings.coordinator.group_sections_max = (settings.concurrency_max / 4).max(GROUP_SECTIONS_MIN);
        // The admin token must not also be a client token: every consumer host would hold the
        // admin routes (an admin review finding).
        if settings.admin_token.as_deref().is_some_and(|admin| settings.client_tokens.contains_secret(admin)) {
            let message = "must differ from every client token".to_string();
            return Err(ConfigError::Invalid { key: "admin_token", message });
        }
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.coordinator;
        let positive = [
            ("tick_interval_ms", c.tick_interval_ms),
            ("mutex_ttl_ms", c.mutex_ttl_ms),
            ("mutex_attempts_max", u64::from(c.mutex_attempts_max)),
            ("cas_attempts_max", u64::from(c.cas_attempts_max)),
            ("redis_timeout_ms", self.redis_timeout_ms),
            ("body_bytes_max", self.body_bytes_max as u64),
            ("concurrency_max", self.concurrency_max as u64),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(ConfigError::Invalid { key, message: "must be > 0".into() });
            }
        }
        // Upper bounds where a larger value is a mistake that would fail later or hang: tokio's
        // semaphores panic above `usize::MAX >> 3` permits (exit 101 after the Redis probe), and a
        // mutex TTL or deadline of hours keeps a killed holder's groups, or every caller, waiting
        // that long (an admin review finding).
        let bounded = [
            ("concurrency_max", self.concurrency_max as u64, CONCURRENCY_MAX_MAX),
            ("body_bytes_max", self.body_bytes_max as u64, BODY_BYTES_MAX_MAX),
            ("mutex_ttl_ms", c.mutex_ttl_ms, MUTEX_TTL_MS_MAX),
            ("redis_timeout_ms", self.redis_timeout_ms, REDIS_TIMEOUT_MS_MAX),
            // A typo of 10000 for 10 made a contended request sleep up to 400 s, beyond every
            // lease; billions of attempts hold a request for ever.
            ("mutex_retry_ms", c.mutex_retry_ms, MUTEX_RETRY_MS_MAX),
            ("mutex_attempts_max", u64::from(c.mutex_attempts_max), ATTEMPTS_MAX_MAX),
            ("cas_attempts_max", u64::from(c.cas_attempts_max), ATTEMPTS_MAX_MAX),
            // The ticker's periods bound how late a dead member is expired: a huge one means never
            // (no tick, a dead instance counted live, an idle group never audited), and a relay
            // period above i64::MAX / 2 makes every `SET … PX` fail, silently (a numbers review).
            ("tick_interval_ms", c.tick_interval_ms, TICKER_PERIOD_MS_MAX),
            ("ticker_silence_ms", c.ticker_silence_ms, TICKER_PERIOD_MS_MAX),
            ("heard_relay_ms", c.heard_relay_ms, TICKER_PERIOD_MS_MAX),
            ("idle_group_audit_ms", c.idle_group_audit_ms, IDLE_GROUP_AUDIT_MS_MAX),
        ];
        for (key, value, max) in bounded {
            if value > max {
                return Err(ConfigError::Invalid { key, message: format!("must be at most {max}") });
            }
        }
        // The longest lease a group may configure (GroupConfig::validate's bound); 0 would turn
        // the ceiling off and a huge value would make every correction round endless.
        if !(1..=LEASE_CEILING_MS_MAX).contains(&c.max_assignment_lease_ms) {
            return Err(ConfigError::Invalid {
                key: "max_assignment_lease_ms",
                message: format!("must be in 1..={LEASE_CEILING_MS_MAX}"),
            });
        }
        // A group created through another instance waits this long for this instance's ticks.
        if c.ticker_refresh_ms > TICKER_REFRESH_MS_MAX {
            let message = format!("must be at most {TICKER_REFRESH_MS_MAX}");
            return Err(ConfigError::Invalid { key: "ticker_refresh_ms", message });
        }
        self.validate_cluster()?;
        self.validate_sentinel()?;
        self.validate_tls()?;
        if c.instance_id.len() > 128 || c.instance_id.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
            let message = "must be at most 128 characters, without whitespace".into();
            return Err(ConfigError::Invalid { key: "instance_id", message });
        }
        Ok(())
    }
}

/// Bounds of settings whose larger values are mistakes (see `Settings::validate`).
const CONCURRENCY_MAX_MAX: u64 = 1 << 20;
const BODY_BYTES_MAX_MAX: u64 = 1 << 30;
const MUTEX_TTL_MS_MAX: u64 = 60_000;
/// Least `group_sections_max` `serve` sets, whatever `concurrency_max` is.
const GROUP_SECTIONS_MIN: usize = 8;
/// Upper bound of `mutex_retry_ms`.
const MUTEX_RETRY_MS_MAX: u64 = 1_000;
/// Upper bound of `mutex_attempts_max` and `cas_attempts_max`.
const ATTEMPTS_MAX_MAX: u64 = 1_000;
/// Upper bound of `tick_interval_ms`, `ticker_silence_ms` and `heard_relay_ms`.
const TICKER_PERIOD_MS_MAX: u64 = 60_000;
/// Upper bound of `idle_group_audit_ms` (an hour).
const IDLE_GROUP_AUDIT_MS_MAX: u64 = 3_600_000;
const REDIS_TIMEOUT_MS_MAX: u64 = 60_000;

/// What a Redis target set but blank would have meant: no Redis at all.
const REDIS_UNSET_HINT: &str =
    "unset it or give a value (with no Redis setting at all, the coordinator runs on the in-memory store)";

/// A setting that was given (flag, environment or file) but is blank. Taking it as unset would
/// fail open: an environment variable from an optional Secret that rendered empty would run the
/// coordinator on the in-memory store, or leave the admin routes or the data plane open, with
/// nothing but a warning (an admin review finding).
fn set_but_blank(key: &'static str, hint: &str) -> ConfigError {
    ConfigError::Invalid { key, message: format!("is set but empty; {hint}") }
}

/// `value` as given (`None`: not given), or the error if it was given blank.
fn set_not_blank(key: &'static str, value: Option<String>, hint: &str) -> Result<Option<String>, ConfigError> {
    match value {
        Some(v) if v.trim().is_empty() => Err(set_but_blank(key, hint)),
        other => Ok(other),
    }
}

/// A file path as given (`None`: not given), or the error if it was given blank. Flags and
/// environment variables never are (clap refuses an empty path), but a file key can be, e.g. from
/// a template whose variable rendered empty: taken as unset, `tls_client_ca_file = ""` would turn
/// client-certificate verification off and three blank listener keys would serve plain HTTP, with
/// no error.
fn path_not_blank(key: &'static str, value: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    match value {
        Some(p) if p.to_string_lossy().trim().is_empty() => {
            Err(set_but_blank(key, "unset it or give a path (taken as unset, it would turn TLS off)"))
        }
        other => Ok(other),
    }
}

/// The admin token, trimmed (a Secret file's trailing newline: the server trims the token a
/// request presents, so an untrimmed one never matched and every admin request got 401), and held
/// to the client tokens' rule (16 to 512 visible ASCII characters): a one-character token was
/// accepted, and a non-ASCII one can never be sent in a header (an admin review finding).
fn admin_token(given: Option<String>) -> Result<Option<String>, ConfigError> {
    let hint = "unset it to leave the admin routes open, or set a token";
    let Some(token) = set_not_blank("admin_token", given, hint)? else { return Ok(None) };
    let token = token.trim();
    if !(CLIENT_TOKEN_LEN_MIN..=CLIENT_TOKEN_LEN_MAX).contains(&token.len())
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        let message =
            format!("must be {CLIENT_TOKEN_LEN_MIN}..={CLIENT_TOKEN_LEN_MAX} visible ASCII characters without spaces");
        return Err(ConfigError::Invalid { key: "admin_token", message });
    }
    Ok(Some(token.to_string()))
}

/// The Sentinel settings from flags/environment (which win) and the file: sentinels and master
/// name come together, each address is `host:port`, and a sentinel password needs sentinels.
fn resolve_sentinel(args: &ServeArgs, file: &FileConfig) -> Result<Option<RedisSentinelOptions>, ConfigError> {
    let sentinels: Vec<String> = match &args.redis_sentinels {
        Some(list) => list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect(),
        None => file.redis_sentinels.clone().unwrap_or_default().iter().map(|s| s.trim().to_string()).collect(),
    };
    let given = args.redis_sentinels.is_some() || file.redis_sentinels.is_some();
    if given && sentinels.iter().all(String::is_empty) {
        return Err(set_but_blank("redis_sentinels", REDIS_UNSET_HINT));
    }
    let master = args.redis_sentinel_master.clone().or(file.redis_sentinel_master.clone());
    let master = master.map(|m| m.trim().to_string()).filter(|m| !m.is_empty());
    let password = args.redis_sentinel_password.clone().filter(|p| !p.is_empty());
    let invalid = |key, message: &str| Err(ConfigError::Invalid { key, message: message.into() });
    let master_name = match (sentinels.is_empty(), master) {
        (true, None) if password.is_none() => return Ok(None),
        (true, _) => return invalid("redis_sentinels", "a Sentinel master name or password needs sentinel addresses"),
        (false, None) => return invalid("redis_sentinel_master", "sentinel addresses need the master name"),
        (false, Some(master)) => master,
    };
    if master_name.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '@' | ':')) {
        return invalid("redis_sentinel_master", "must not contain whitespace, '/', '@' or ':'");
    }
    if let Some(bad) = sentinels.iter().position(|s| parse_sentinel_address(s).is_none()) {
        // Named by position, not echoed: an entry written as a URL may carry a password.
        let message = format!("sentinel address #{} is not host:port", bad + 1);
        return Err(ConfigError::Invalid { key: "redis_sentinels", message });
    }
    Ok(Some(RedisSentinelOptions { sentinels, master_name, sentinel_password: password }))
}

impl Settings {
    /// With Sentinel, the URL may only name the master (Sentinel chooses the server: a host or
    /// port would be a second, conflicting answer).
    /// Cluster seed nodes exclude a fixed server and Sentinel. They all use TLS (`rediss://`) or
    /// none does: the Cluster client speaks one way to every node. The Redis TLS files need
    /// `rediss://` seeds, as they need a `rediss://` URL (never silently unused).
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        if self.redis_cluster_nodes.is_empty() {
            return Ok(());
        }
        let invalid = |message: String| Err(ConfigError::Invalid { key: "redis_cluster_nodes", message });
        if self.redis_sentinel.is_some() {
            return invalid("cannot be combined with Redis Sentinel".into());
        }
        if self.redis_url.is_some() {
            return invalid("cannot be combined with redis_url".into());
        }
        let tls_seeds = self.redis_cluster_nodes.iter().filter(|node| is_tls_url(node)).count();
        if tls_seeds > 0 && tls_seeds < self.redis_cluster_nodes.len() {
            return invalid(format!(
                "the seed nodes mix rediss:// ({tls_seeds}) and redis:// ({}): every seed must use the same scheme",
                self.redis_cluster_nodes.len() - tls_seeds
            ));
        }
        if tls_seeds == 0 && self.redis_tls.is_configured() {
            return invalid("TLS files are set, so the seed nodes must be rediss://...".into());
        }
        Ok(())
    }

    fn validate_sentinel(&self) -> Result<(), ConfigError> {
        let (Some(sentinel), Some(url)) = (&self.redis_sentinel, &self.redis_url) else { return Ok(()) };
        if !url_names_master(url, &sentinel.master_name) {
            let message = format!(
                "with Sentinel the Redis URL may only name the master: redis[s]://[user:password@]{}[/db] \
                 (no server host or port; Sentinel chooses the server)",
                sentinel.master_name
            );
            return Err(ConfigError::Invalid { key: "redis_url", message });
        }
        Ok(())
    }

    /// TLS files need a `rediss://` URL (never silently unused), and the client certificate and
    /// key come together. The files themselves are read and checked by `RedisStore::open`.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let tls = &self.redis_tls;
        let key = match (&tls.ca_file, &tls.client_cert_file, &tls.client_key_file) {
            (None, None, None) => return Ok(()),
            (_, Some(_), None) => "redis_tls_client_key_file",
            (_, None, Some(_)) => "redis_tls_client_cert_file",
            _ => {
                // Cluster seeds are checked by `validate_cluster`.
                if !self.redis_cluster_nodes.is_empty() || self.redis_url.as_deref().is_some_and(is_tls_url) {
                    return Ok(());
                }
                let message = "TLS files are set, so the Redis URL must be rediss://...".into();
                return Err(ConfigError::Invalid { key: "redis_url", message });
            }
        };
        let message = "the client certificate and key of mutual TLS must be given together".into();
        Err(ConfigError::Invalid { key, message })
    }
}

/// Whether `url` asks for TLS (`rediss://`, or its Valkey spelling `valkeys://`).
fn is_tls_url(url: &str) -> bool {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
    matches!(scheme.as_deref(), Some("rediss" | "valkeys"))
}

/// `$HOSTNAME` (the pod name under Kubernetes), else `coordinator-<pid>`.
fn default_instance_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty() && !h.chars().any(char::is_whitespace))
        .unwrap_or_else(|| format!("coordinator-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_without_flags_or_file() {
        let settings = Settings::resolve(&ServeArgs::default(), FileConfig::default(), 1).expect("resolves");
        assert_eq!(settings.listen, LISTEN_DEFAULT.parse().expect("parses"));
        assert_eq!(settings.redis_url, None);
        assert_eq!(settings.coordinator.tick_interval_ms, CoordinatorOptions::default().tick_interval_ms);
        assert_eq!(settings.body_bytes_max, BODY_BYTES_MAX_DEFAULT);
        assert!(!settings.coordinator.instance_id.is_empty());
        assert_eq!(settings.coordinator.group_sections_max, CONCURRENCY_MAX_DEFAULT / 4);
    }

    #[test]
    fn one_group_may_hold_a_quarter_of_the_request_slots() {
        for (concurrency_max, share) in [(400, 100), (40, 10), (3, 8), (1, 8)] {
            let file = FileConfig { concurrency_max: Some(concurrency_max), ..FileConfig::default() };
            let settings = Settings::resolve(&ServeArgs::default(), file, 1).expect("resolves");
            assert_eq!(settings.coordinator.group_sections_max, share, "concurrency_max {concurrency_max}");
        }
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let file: FileConfig = toml::from_str(
            r#"
            listen = "0.0.0.0:9000"
            redis_url = "redis://file:6379"
            tick_interval_ms = 500
            mutex_ttl_ms = 3000
            instance_id = "from-file"
            "#,
        )
        .expect("toml");
        let args = ServeArgs {
            listen: Some("127.0.0.1:7000".parse().expect("addr")),
            tick_interval_ms: Some(100),
            ..ServeArgs::default()
        };
        let settings = Settings::resolve(&args, file, 1).expect("resolves");
        assert_eq!(settings.listen, "127.0.0.1:7000".parse().expect("addr"));
        assert_eq!(settings.redis_url.as_deref(), Some("redis://file:6379"));
        assert_eq!(settings.coordinator.tick_interval_ms, 100);
        assert_eq!(settings.coordinator.mutex_ttl_ms, 3000);
        assert_eq!(settings.coordinator.instance_id, "from-file");
        assert!(!format!("{settings:?}").contains("redis://"), "Debug hides the URL");
    }

    #[test]
    fn tls_files_come_from_flags_or_the_file_and_need_a_rediss_url() {
        let file: FileConfig = toml::from_str(
            r#"
            redis_url = "rediss://coordinator@redis.internal:6380"
            redis_tls_ca_file = "/etc/rsc/ca.pem"
            redis_tls_client_cert_file = "/etc/rsc/client.pem"
            redis_tls_client_key_file = "/etc/rsc/client.key"
            "#,
        )
        .expect("toml");
        let args = ServeArgs { redis_tls_ca_file: Some("/run/secrets/ca.pem".into()), ..ServeArgs::default() };
        let settings = Settings::resolve(&args, file.clone(), 1).expect("resolves");
        let expected = RedisTlsOptions {
            ca_file: Some("/run/secrets/ca.pem".into()),
            client_cert_file: Some("/etc/rsc/client.pem".into()),
            client_key_file: Some("/etc/rsc/client.key".into()),
        };
        assert_eq!(settings.redis_tls, expected, "the flag wins over the file key");
        assert!(format!("{settings:?}").contains("/run/secrets/ca.pem"), "Debug shows the file paths");

        let plain = FileConfig { redis_url: Some("redis://redis:6379".into()), ..file.clone() };
        let error = Settings::resolve(&ServeArgs::default(), plain, 1).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid { key: "redis_url", .. }), "{error}");
        let no_url = FileConfig { redis_url: None, ..file.clone() };
        let error = Settings::resolve(&ServeArgs::default(), no_url, 1).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid { key: "redis_url", .. }), "{error}");
        let cert_only = FileConfig { redis_tls_client_key_file: None, ..file.clone() };
        let error = Settings::resolve(&ServeArgs::default(), cert_only, 1).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid { key: "redis_tls_client_key_file", .. }), "{error}");
        let ca_only = FileConfig { redis_tls_client_cert_file: None, redis_tls_client_key_file: None, ..file };
        let settings = Settings::resolve(&ServeArgs::default(), ca_only, 1).expect("one-way TLS");
        assert_eq!(settings.redis_tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/rsc/ca.pem")));
        assert_eq!(settings.redis_tls.client_cert_file, None);

        let defaults = Settings::resolve(&ServeArgs::default(), FileConfig::default(), 1).expect("resolves");
        assert_eq!(defaults.redis_tls, RedisTlsOptions::default());
    }

    #[test]
    fn sentinel_settings_come_from_flags_or_the_file_and_default_the_url_to_the_master() {
        let file: FileConfig = toml::from_str(
            r#"
            redis_sentinels = ["10.0.0.1:26379", "10.0.0.2:26379"]
            redis_sentinel_master = "mymaster"
            "#,
        )
        .expect("toml");
        let settings = Settings::resolve(&ServeArgs::default(), file.clone(), 1).expect("resolves");
        let sentinel = settings.redis_sentinel.clone().expect("sentinel mode");
        assert_eq!(sentinel.sentinels, ["10.0.0.1:26379", "10.0.0.2:26379"]);
        assert_eq!(sentinel.master_name, "mymaster");
        assert_eq!(settings.redis_url.as_deref(), Some("redis://mymaster"), "no URL: the master, no credentials");

        let args = ServeArgs {
            redis_sentinels: Some("s1:26379, s2:26380".into()),
            redis_sentinel_password: Some("sentinel-secret".into()),
            redis_url: Some("redis://coordinator:secret@mymaster/2".into()),
            ..ServeArgs::default()
        };
        let settings = Settings::resolve(&args, file, 1).expect("resolves");
        let sentinel = settings.redis_sentinel.clone().expect("sentinel mode");
        assert_eq!(sentinel.sentinels, ["s1:26379", "s2:26380"], "the flag wins over the file key");
        assert_eq!(sentinel.sentinel_password.as_deref(), Some("sentinel-secret"));
        assert_eq!(settings.redis_url.as_deref(), Some("redis://coordinator:secret@mymaster/2"));
        let debug = format!("{settings:?}");
        assert!(!debug.contains("sentinel-secret") && !debug.contains(":secret@"), "{debug}");
        assert!(debug.contains("s1:26379"), "{debug}");

        let direct = Settings::resolve(&ServeArgs::default(), FileConfig::default(), 1).expect("resolves");
        assert_eq!(direct.redis_sentinel, None);
    }

    #[test]
    fn cluster_seed_nodes_come_from_flags_or_the_file_and_exclude_other_redis_targets() {
        let file: FileConfig =
            toml::from_str(r#"redis_cluster_nodes = ["redis://10.0.0.1:7000", " redis://10.0.0.2:7000 "]"#)
                .expect("toml");
        let settings = Settings::resolve(&ServeArgs::default(), file.clone(), 1).expect("resolves");
        assert_eq!(settings.redis_cluster_nodes, ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]);
        assert_eq!(settings.redis_url, None);

        let args = ServeArgs {
            redis_cluster_nodes: Some("redis://app:cluster-secret@h1:7000, redis://app:cluster-secret@h2:7000,".into()),
            ..ServeArgs::default()
        };
        let settings = Settings::resolve(&args, file.clone(), 1).expect("resolves");
        assert_eq!(settings.redis_cluster_nodes.len(), 2, "the flag wins over the file key");
        let debug = format!("{settings:?}");
        assert!(!debug.contains("cluster-secret"), "{debug}");

        let with_url = ServeArgs { redis_url: Some("redis://h:6379".into()), ..ServeArgs::default() };
        let with_sentinel = ServeArgs {
            redis_sentinels: Some("s1:26379".into()),
            redis_sentinel_master: Some("m".into()),
            ..ServeArgs::default()
        };
        for args in [with_url, with_sentinel] {
            match Settings::resolve(&args, file.clone(), 1) {
                Err(ConfigError::Invalid { key: "redis_cluster_nodes", .. }) => {}
                other => panic!("a second Redis target must be refused, got {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn tls_cluster_seeds_take_the_redis_tls_files_and_must_not_mix_schemes() {
        // Seeds, then which of the CA file, client certificate and client key are set.
        let args = |nodes: &str, ca: bool, cert: bool, key: bool| ServeArgs {
            redis_cluster_nodes: Some(nodes.into()),
            redis_tls_ca_file: ca.then(|| "/etc/rsc/ca.pem".into()),
            redis_tls_client_cert_file: cert.then(|| "/etc/rsc/client.pem".into()),
            redis_tls_client_key_file: key.then(|| "/etc/rsc/client.key".into()),
            ..ServeArgs::default()
        };
        let mutual_tls = args("rediss://h1:7000,REDISS://h2:7000", true, true, true);
        let settings = Settings::resolve(&mutual_tls, FileConfig::default(), 1).expect("TLS on a Cluster is accepted");
        assert_eq!(settings.redis_cluster_nodes, ["rediss://h1:7000", "REDISS://h2:7000"]);
        assert_eq!(settings.redis_tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/rsc/ca.pem")));
        assert!(settings.redis_tls.client_cert_file.is_some() && settings.redis_tls.client_key_file.is_some());
        // rediss:// seeds alone: the platform's roots, no client certificate.
        let file: FileConfig = toml::from_str(r#"redis_cluster_nodes = ["rediss://h1:7000"]"#).expect("toml");
        Settings::resolve(&ServeArgs::default(), file, 1).expect("rediss:// seeds without TLS files");

        let reject = |args: ServeArgs, key: &str, says: &str| match Settings::resolve(&args, FileConfig::default(), 1) {
            Err(ConfigError::Invalid { key: got, message }) => {
                assert_eq!(got, key, "{message}");
                assert!(message.contains(says), "{message}");
            }
            other => panic!("expected an invalid {key}, got {:?}", other.map(|_| ())),
        };
        let mixed = "rediss://h1:7000,redis://h2:7000,redis://h3:7000";
        reject(args(mixed, true, true, true), "redis_cluster_nodes", "mix rediss:// (1) and redis:// (2)");
        reject(args(mixed, false, false, false), "redis_cluster_nodes", "same scheme");
        // TLS files with plain seeds: refused, as with a redis:// URL (never silently unused).
        reject(args("redis://h1:7000,redis://h2:7000", true, false, false), "redis_cluster_nodes", "must be rediss://");
        // Half a client identity is still refused on a Cluster.
        reject(args("rediss://h1:7000", true, true, false), "redis_tls_client_key_file", "together");
    }

    #[test]
    fn ambiguous_or_incomplete_sentinel_settings_are_rejected() {
        let sentinel = |url: Option<&str>| ServeArgs {
            redis_sentinels: Some("127.0.0.1:26379".into()),
            redis_sentinel_master: Some("mymaster".into()),
            redis_url: url.map(str::to_string),
            ..ServeArgs::default()
        };
        let reject = |args: ServeArgs, file: FileConfig, expected_key: &str| {
            let error = Settings::resolve(&args, file, 1).unwrap_err();
            assert!(matches!(&error, ConfigError::Invalid { key, .. } if *key == expected_key), "{error}");
        };
        // A URL that names a server next to Sentinel: which one wins would be a guess.
        for url in ["redis://redis.internal:6379", "redis://mymaster:6379", "redis://10.0.0.5/0"] {
            reject(sentinel(Some(url)), FileConfig::default(), "redis_url");
        }
        let file_url = FileConfig { redis_url: Some("redis://redis:6379".into()), ..FileConfig::default() };
        reject(sentinel(None), file_url, "redis_url");
        // TLS through Sentinel names the master with rediss://; TLS files never go silently unused
        // (no URL means redis://<master>, which the files refuse).
        let ca = || Some("/etc/rsc/ca.pem".into());
        reject(ServeArgs { redis_tls_ca_file: ca(), ..sentinel(None) }, FileConfig::default(), "redis_url");
        let tls_server = ServeArgs { redis_tls_ca_file: ca(), ..sentinel(Some("rediss://mymaster:6380")) };
        reject(tls_server, FileConfig::default(), "redis_url");
        let tls = ServeArgs { redis_tls_ca_file: ca(), ..sentinel(Some("rediss://mymaster")) };
        let settings = Settings::resolve(&tls, FileConfig::default(), 1).expect("TLS through Sentinel");
        assert_eq!(settings.redis_url.as_deref(), Some("rediss://mymaster"));
        assert!(settings.redis_tls.is_configured() && settings.redis_sentinel.is_some());
        // Half a Sentinel configuration.
        let no_master = ServeArgs { redis_sentinel_master: None, ..sentinel(None) };
        reject(no_master, FileConfig::default(), "redis_sentinel_master");
        let master_only = FileConfig { redis_sentinel_master: Some("mymaster".into()), ..FileConfig::default() };
        reject(ServeArgs::default(), master_only, "redis_sentinels");
        let password_only = ServeArgs { redis_sentinel_password: Some("x".into()), ..ServeArgs::default() };
        reject(password_only, FileConfig::default(), "redis_sentinels");
        for bad in ["127.0.0.1", "127.0.0.1:0", "redis://127.0.0.1:26379"] {
            let args = ServeArgs { redis_sentinels: Some(bad.into()), ..sentinel(None) };
            reject(args, FileConfig::default(), "redis_sentinels");
        }
        // An entry written as a URL with a password: refused without echoing it.
        let with_password = ServeArgs { redis_sentinels: Some("redis://:hunter2-pw@h:26379".into()), ..sentinel(None) };
        let error = Settings::resolve(&with_password, FileConfig::default(), 1).unwrap_err().to_string();
        assert!(error.contains("#1") && !error.contains("hunter2"), "{error}");
        let bad_name = ServeArgs { redis_sentinel_master: Some("my master".into()), ..sentinel(None) };
        reject(bad_name, FileConfig::default(), "redis_sentinel_master");
        assert!(toml::from_str::<FileConfig>("redis_sentinel_password = \"x\"").is_err(), "not a file key");
    }

    /// A setting given blank (an environment variable from an optional Secret that rendered
    /// empty, `redis_url = ""`) is refused, not taken as unset: unset, it would have run the
    /// coordinator on the in-memory store or left the admin routes or the data plane open, even
    /// when the file names a Redis server.
    #[test]
    fn settings_given_blank_are_refused_rather_than_taken_as_unset() {
        let file_url = || FileConfig { redis_url: Some("redis://file:6379".into()), ..FileConfig::default() };
        let refused = |args: ServeArgs, file: FileConfig, key: &str| {
            let error = Settings::resolve(&args, file, 1).unwrap_err();
            assert!(matches!(&error, ConfigError::Invalid { key: k, .. } if *k == key), "{key}: {error}");
            assert!(error.to_string().contains("set but empty"), "{error}");
        };
        refused(ServeArgs { redis_url: Some(String::new()), ..ServeArgs::default() }, file_url(), "redis_url");
        refused(ServeArgs::default(), FileConfig { redis_url: Some(" ".into()), ..FileConfig::default() }, "redis_url");
        refused(
            ServeArgs { redis_cluster_nodes: Some(" , ".into()), ..ServeArgs::default() },
            file_url(),
            "redis_cluster_nodes",
        );
        refused(
            ServeArgs { redis_sentinels: Some(String::new()), ..ServeArgs::default() },
            file_url(),
            "redis_sentinels",
        );
        refused(ServeArgs { admin_token: Some("  ".into()), ..ServeArgs::default() }, file_url(), "admin_token");
        // The admin token: trimmed, and as long as a client token.
        let admin = |token: &str| ServeArgs { admin_token: Some(token.into()), ..ServeArgs::default() };
        let trimmed =
            Settings::resolve(&admin("admin-token-0123456789\n"), FileConfig::default(), 1).expect("resolves");
        assert_eq!(trimmed.admin_token.as_deref(), Some("admin-token-0123456789"));
        let shared =
            ServeArgs { client_tokens: vec!["admin-token-0123456789".into()], ..admin("admin-token-0123456789") };
        let error = Settings::resolve(&shared, FileConfig::default(), 1).unwrap_err();
        assert!(matches!(&error, ConfigError::Invalid { key: "admin_token", .. }), "one token for both: {error}");
        for bad in ["x", "short-token", "admin token with spaces", "admin-tøken-0123456789"] {
            let error = Settings::resolve(&admin(bad), FileConfig::default(), 1).unwrap_err();
            assert!(matches!(&error, ConfigError::Invalid { key: "admin_token", .. }), "{bad}: {error}");
            assert!(!error.to_string().contains(bad), "the token is not echoed: {error}");
        }
        refused(ServeArgs { client_tokens: vec![String::new()], ..ServeArgs::default() }, file_url(), "client_tokens");
        // Empty lists in the file too.
        let empty = || Some(Vec::new());
        refused(
            ServeArgs::default(),
            FileConfig { redis_cluster_nodes: empty(), ..FileConfig::default() },
            "redis_cluster_nodes",
        );
        refused(
            ServeArgs::default(),
            FileConfig { redis_sentinels: empty(), ..FileConfig::default() },
            "redis_sentinels",
        );
        refused(ServeArgs::default(), FileConfig { client_tokens: empty(), ..file_url() }, "client_tokens");
        // Blank TLS paths in the file (a template whose variable rendered empty): taken as unset,
        // a blank client CA turned mutual TLS off and blank listener keys served plain HTTP.
        let listener = |cert: &str, key: &str, ca: &str| {
            let text = format!("tls_cert_file = {cert:?}\ntls_key_file = {key:?}\ntls_client_ca_file = {ca:?}\n");
            FileConfig { redis_url: file_url().redis_url, ..toml::from_str::<FileConfig>(&text).expect("parses") }
        };
        refused(ServeArgs::default(), listener("/tls/cert.pem", "/tls/key.pem", ""), "tls_client_ca_file");
        refused(ServeArgs::default(), listener("", "", ""), "tls_cert_file");
        refused(ServeArgs::default(), listener("/tls/cert.pem", " ", "/tls/ca.pem"), "tls_key_file");
        for key in ["redis_tls_ca_file", "redis_tls_client_cert_file", "redis_tls_client_key_file"] {
            let file = toml::from_str::<FileConfig>(&format!("redis_url = \"rediss://h:6380\"\n{key} = \"\"\n"));
            refused(ServeArgs::default(), file.expect("parses"), key);
        }
        let given =
            Settings::resolve(&ServeArgs::default(), listener("/tls/cert.pem", "/tls/key.pem", "/tls/ca.pem"), 1);
        let tls = given.expect("resolves").listener.tls.expect("TLS on");
        assert_eq!(tls.client_ca_file.as_deref(), Some(std::path::Path::new("/tls/ca.pem")));
        // Not given at all: the in-memory store and open routes, as documented.
        let unset = Settings::resolve(&ServeArgs::default(), FileConfig::default(), 1).expect("resolves");
        assert!(unset.redis_url.is_none() && unset.admin_token.is_none() && unset.client_tokens.is_empty());
        // A trailing comma in a token list is not a blank list.
        let spaced =
            ServeArgs { client_tokens: vec!["0123456789abcdef".into(), String::new()], ..ServeArgs::default() };
        assert_eq!(Settings::resolve(&spaced, FileConfig::default(), 1).expect("resolves").client_tokens.len(), 1);
    }

    #[test]
    fn a_parse_error_names_the_place_but_never_the_files_text() {
        let secret = "s3cret-token-of-some-length";
        for text in [
            format!("admin_token = \"{secret}\""),
            format!("redis_sentinel_password = \"{secret}\""),
            format!("client_tokens = \"orders:*={secret}\""),
            format!("listen = \"127.0.0.1:1\"\nredis_url = redis://user:{secret}@host:6379"),
            format!("client_tokens = [\"a\", 5, \"{secret}\\\"x\"]"),
        ] {
            let message = FileConfig::parse(&text).err().unwrap_or_else(|| panic!("refused: {text}"));
            assert!(!message.contains(secret) && !message.contains("s3cret"), "{text} -> {message}");
            assert!(message.contains("(line "), "{message}");
        }
        let message = FileConfig::parse("tick_interval_ms = 5\nredis_url = redis://u:p@h").unwrap_err();
        assert!(message.contains("line 2, column"), "{message}");
        assert_eq!(
            blank_quoted(r#"invalid type: string "a\"b", expected `x`"#),
            "invalid type: string \"…\", expected `x`"
        );
    }

    #[test]
    fn unknown_keys_and_zero_values_are_rejected() {
        assert!(toml::from_str::<FileConfig>("tick_intervall_ms = 5").is_err());
        let file = FileConfig { tick_interval_ms: Some(0), ..FileConfig::default() };
        let error = Settings::resolve(&ServeArgs::default(), file, 1).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid { key: "tick_interval_ms", .. }), "{error}");
    }

    #[test]
    fn sizes_and_durations_past_their_bounds_are_rejected() {
        let cases = [
            ("concurrency_max", FileConfig { concurrency_max: Some(usize::MAX), ..FileConfig::default() }),
            ("body_bytes_max", FileConfig { body_bytes_max: Some(usize::MAX), ..FileConfig::default() }),
            ("mutex_ttl_ms", FileConfig { mutex_ttl_ms: Some(MUTEX_TTL_MS_MAX + 1), ..FileConfig::default() }),
            (
                "redis_timeout_ms",
                FileConfig { redis_timeout_ms: Some(REDIS_TIMEOUT_MS_MAX + 1), ..FileConfig::default() },
            ),
            ("mutex_retry_ms", FileConfig { mutex_retry_ms: Some(MUTEX_RETRY_MS_MAX + 1), ..FileConfig::default() }),
            ("mutex_attempts_max", FileConfig { mutex_attempts_max: Some(u32::MAX), ..FileConfig::default() }),
            ("cas_attempts_max", FileConfig { cas_attempts_max: Some(1_001), ..FileConfig::default() }),
            ("tick_interval_ms", FileConfig { tick_interval_ms: Some(u64::MAX), ..FileConfig::default() }),
            ("ticker_silence_ms", FileConfig { ticker_silence_ms: Some(60_001), ..FileConfig::default() }),
            ("heard_relay_ms", FileConfig { heard_relay_ms: Some(u64::MAX / 2), ..FileConfig::default() }),
            ("idle_group_audit_ms", FileConfig { idle_group_audit_ms: Some(3_600_001), ..FileConfig::default() }),
        ];
        for (key, file) in cases {
            let error = Settings::resolve(&ServeArgs::default(), file, 1).unwrap_err();
            assert!(matches!(&error, ConfigError::Invalid { key: k, .. } if *k == key), "{key}: {error}");
        }
        let at_bounds = FileConfig {
            concurrency_max: Some(CONCURRENCY_MAX_MAX as usize),
            body_bytes_max: Some(BODY_BYTES_MAX_MAX as usize),
            mutex_ttl_ms: Some(MUTEX_TTL_MS_MAX),
            redis_timeout_ms: Some(REDIS_TIMEOUT_MS_MAX),
            mutex_retry_ms: Some(MUTEX_RETRY_MS_MAX),
            mutex_attempts_max: Some(ATTEMPTS_MAX_MAX as u32),
            cas_attempts_max: Some(ATTEMPTS_MAX_MAX as u32),
            tick_interval_ms: Some(TICKER_PERIOD_MS_MAX),
            ticker_silence_ms: Some(TICKER_PERIOD_MS_MAX),
            heard_relay_ms: Some(TICKER_PERIOD_MS_MAX),
            idle_group_audit_ms: Some(IDLE_GROUP_AUDIT_MS_MAX),
            ..FileConfig::default()
        };
        Settings::resolve(&ServeArgs::default(), at_bounds, 1).expect("the bounds themselves are accepted");
    }

    #[test]
    fn the_ticker_refresh_period_is_bounded() {
        let file = FileConfig { ticker_refresh_ms: Some(TICKER_REFRESH_MS_MAX + 1), ..FileConfig::default() };
        let error = Settings::resolve(&ServeArgs::default(), file, 1).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid { key: "ticker_refresh_ms", .. }), "{error}");
        let file = FileConfig { ticker_refresh_ms: Some(0), ..FileConfig::default() };
        let settings = Settings::resolve(&ServeArgs::default(), file, 1).expect("0 reads every pass");
        assert_eq!(settings.coordinator.ticker_refresh_ms, 0);
    }

    #[test]
    fn the_lease_ceiling_is_bounded_and_flags_win_over_the_file() {
        for bad in [0, LEASE_CEILING_MS_MAX + 1] {
            let file = FileConfig { max_assignment_lease_ms: Some(bad), ..FileConfig::default() };
            let error = Settings::resolve(&ServeArgs::default(), file, 1).unwrap_err();
            assert!(matches!(error, ConfigError::Invalid { key: "max_assignment_lease_ms", .. }), "{bad}: {error}");
        }
        let defaults = Settings::resolve(&ServeArgs::default(), FileConfig::default(), 1).expect("defaults");
        assert_eq!(defaults.coordinator.max_assignment_lease_ms, 8_000, "the default group's lease");
        let file = FileConfig { max_assignment_lease_ms: Some(20_000), ..FileConfig::default() };
        let args = ServeArgs { max_assignment_lease_ms: Some(30_000), ..ServeArgs::default() };
        assert_eq!(Settings::resolve(&args, file, 1).expect("valid").coordinator.max_assignment_lease_ms, 30_000);
    }

    // --- Listener settings (issue 9: accept window, /metrics exposure, TLS) ---

    #[test]
    fn listener_defaults_accept_for_five_seconds_hide_member_ids_and_serve_plain_http() {
        let settings = Settings::resolve(&ServeArgs::default(), FileConfig::default(), 1).expect("resolves");
        let expected = ListenerSettings {
            shutdown_accept_ms: SHUTDOWN_ACCEPT_MS_DEFAULT,
            metrics_member_labels: false,
            tls: None,
        };
        assert_eq!(settings.listener, expected);
        assert_eq!(SHUTDOWN_ACCEPT_MS_DEFAULT, 5_000);
    }

    #[test]
    fn listener_flags_win_over_the_file() {
        let file: FileConfig = toml::from_str(
            r#"
            shutdown_accept_ms = 2000
            metrics_member_labels = true
            tls_cert_file = "/file/cert.pem"
            tls_key_file = "/file/key.pem"
            tls_client_ca_file = "/file/ca.pem"
            "#,
        )
        .expect("valid TOML");
        let from_file = Settings::resolve(&ServeArgs::default(), file.clone(), 1).expect("resolves").listener;
        let tls = ListenerTlsFiles {
            cert_file: "/file/cert.pem".into(),
            key_file: "/file/key.pem".into(),
            client_ca_file: Some("/file/ca.pem".into()),
        };
        let expected = ListenerSettings { shutdown_accept_ms: 2_000, metrics_member_labels: true, tls: Some(tls) };
        assert_eq!(from_file, expected);
        let args = ServeArgs {
            shutdown_accept_ms: Some(0),
            metrics_member_labels: Some(false),
            tls_cert_file: Some("/flag/cert.pem".into()),
            ..ServeArgs::default()
        };
        let listener = Settings::resolve(&args, file, 1).expect("resolves").listener;
        assert_eq!((listener.shutdown_accept_ms, listener.metrics_member_labels), (0, false));
        assert_eq!(listener.tls.expect("tls").cert_file, PathBuf::from("/flag/cert.pem"));
    }

    #[test]
    fn half_a_tls_setting_and_an_unbounded_accept_window_are_rejected() {
        let reject = |args: ServeArgs, expected_key: &str| {
            let error = Settings::resolve(&args, FileConfig::default(), 1).unwrap_err();
            assert!(matches!(&error, ConfigError::Invalid { key, .. } if *key == expected_key), "{error}");
        };
        reject(ServeArgs { tls_cert_file: Some("/c.pem".into()), ..ServeArgs::default() }, "tls_key_file");
        reject(ServeArgs { tls_key_file: Some("/k.pem".into()), ..ServeArgs::default() }, "tls_cert_file");
        reject(ServeArgs { tls_client_ca_file: Some("/ca.pem".into()), ..ServeArgs::default() }, "tls_cert_file");
        let too_long = ServeArgs { shutdown_accept_ms: Some(SHUTDOWN_ACCEPT_MS_MAX + 1), ..ServeArgs::default() };
        reject(too_long, "shutdown_accept_ms");
        let longest = ServeArgs { shutdown_accept_ms: Some(SHUTDOWN_ACCEPT_MS_MAX), ..ServeArgs::default() };
        assert!(Settings::resolve(&longest, FileConfig::default(), 1).is_ok());
    }
}
