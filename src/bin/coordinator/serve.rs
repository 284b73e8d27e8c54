//! `coordinator serve`: connect the store, run the startup probe (fail fast), serve the API with
//! `rsc::http::serve` (never `axum::serve`), run the ticker, and shut down gracefully.
//!
//! Shutdown on SIGTERM or SIGINT: enter terminating mode (new mutations get 503
//! `COORDINATOR_TERMINATING`, `/readyz` turns 503, ticks stop) while the listener keeps accepting
//! new connections for `shutdown_accept_ms` (routing, `/healthz`, `/readyz` and `/metrics` are
//! answered as usual), so clients and load balancers that have not yet seen the instance leave
//! the endpoints get a typed answer instead of a refused connection. Meanwhile wait up to
//! `shutdown_timeout_ms` for entered critical sections to finish their write and mutex release.
//! When both are over, stop accepting, let open connections finish (bounded by
//! `shutdown_timeout_ms` again), and exit 0. A second signal exits at once with code 1.
//!
//! With `tls_cert_file` / `tls_key_file` the listener speaks only TLS (`https://`), and with
//! `tls_client_ca_file` only to clients presenting a certificate from that CA; the files are read
//! and checked before the listener binds (a bad file exits with code 2).
//!
//! With Sentinel settings the store asks the sentinels for the master at every connection (the
//! URL then only names the master). Without a Redis URL or Sentinel the store is in memory: the
//! process warns at startup and every `/readyz` answer carries the warning, because nothing
//! survives a restart.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::cli::ServeArgs;
use super::config::{ConfigError, FileConfig, Settings};
use rsc::core::protocol::ApiError;
use rsc::http::router::{app, HttpOptions, Readiness};
use rsc::http::serve::{serve_tls_with, serve_with, ServeConfig};
use rsc::http::tls;
use rsc::service::Coordinator;
use rsc::store::memory::MemoryStore;
use rsc::store::redis::{RedisStore, RedisStoreOptions};
use rsc::store::{MetadataStore, StoreError};

/// Shown at startup and in `/readyz` when no Redis URL is configured.
pub const NOT_DURABLE: &str =
    "serving from an in-memory store (no REDIS_URL / --redis-url): nothing is durable, all groups vanish on exit";

/// Why `serve` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Bad arguments or configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Redis URL or Cluster seeds, a TLS file or the Sentinel settings are invalid, or the
    /// server (or every sentinel, or every seed) cannot be reached (TLS included).
    #[error("cannot connect to Redis: {0}")]
    Connect(StoreError),
    /// The startup compatibility probe failed (unsupported version, missing or denied command).
    #[error("the Redis store failed the startup compatibility probe: {}", .0.message)]
    Probe(ApiError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    /// A TLS file of the listener is unreadable or invalid.
    #[error("cannot set up the listener's TLS: {0}")]
    Tls(#[from] rsc::http::tls::TlsSetupError),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

impl ServeError {
    /// The process exit code (see main.rs).
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::Config(_) | ServeError::Connect(StoreError::Config(_)) | ServeError::Tls(_) => 2,
            ServeError::Connect(_) | ServeError::Probe(_) => 3,
            ServeError::Bind { .. } | ServeError::Signals(_) => 1,
        }
    }
}

/// Runs `serve` and maps the outcome to an exit code.
pub async fn main(args: ServeArgs) -> u8 {
    match run(args).await {
        Ok(()) => 0,
        Err(error) => {
            tracing::error!(%error, "coordinator stopped");
            eprintln!("error: {error}");
            error.exit_code()
        }
    }
}

async fn run(args: ServeArgs) -> Result<(), ServeError> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let settings = Settings::resolve(&args, file, process_seed())?;
    tracing::info!(?settings, "starting coordinator");
    let readiness = Readiness::default();
    if !settings.redis_cluster_nodes.is_empty() {
        let options = RedisStoreOptions {
            timeout_ms: settings.redis_timeout_ms,
            tls: settings.redis_tls.clone(),
            ..RedisStoreOptions::default()
        };
        let store =
            RedisStore::connect_cluster(&settings.redis_cluster_nodes, options).await.map_err(ServeError::Connect)?;
        return serve_store(store, &settings, readiness).await;
    }
    match settings.redis_url.clone() {
        None => {
            tracing::warn!("{NOT_DURABLE}");
            readiness.add_warning(NOT_DURABLE);
            serve_store(MemoryStore::new_serving(settings.coordinator.rng_seed), &settings, readiness).await
        }
        Some(url) => {
            let options = RedisStoreOptions {
                timeout_ms: settings.redis_timeout_ms,
                tls: settings.redis_tls.clone(),
                sentinel: settings.redis_sentinel.clone(),
                ..RedisStoreOptions::default()
            };
            let store = RedisStore::connect(&url, options).await.map_err(ServeError::Connect)?;
            serve_store(store, &settings, readiness).await
        }
    }
}

async fn serve_store<S: MetadataStore>(store: S, settings: &Settings, readiness: Readiness) -> Result<(), ServeError> {
    let coordinator = Coordinator::new(store, settings.coordinator.clone());
    coordinator.metrics().set_member_series(settings.listener.metrics_member_labels);
    let tls = match &settings.listener.tls {
        None => None,
        Some(files) => Some(tls::server_config(&files.cert_file, &files.key_file, files.client_ca_file.as_deref())?),
    };
    let report = readiness.probe(&coordinator).await.map_err(ServeError::Probe)?;
    tracing::info!(server_version = %report.server_version, "store probe passed");
    if settings.admin_token.is_none() {
        tracing::warn!("no admin token configured (COORDINATOR_ADMIN_TOKEN): admin routes are open");
    }
    if settings.client_tokens.is_empty() {
        tracing::warn!(
            "no client token configured (--client-token / COORDINATOR_CLIENT_TOKENS): the data plane is open, and \
             any client that reaches it can report loss evidence or add shards of a lost add-shards"
        );
    }
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|source| ServeError::Bind { addr: settings.listen, source })?;
    let signals = Signals::install().map_err(ServeError::Signals)?;
    let options = HttpOptions {
        body_bytes_max: settings.body_bytes_max,
        concurrency_max: settings.concurrency_max,
        admin_token: settings.admin_token.clone(),
        client_tokens: settings.client_tokens.clone(),
        readiness,
    };
    let router = app(coordinator.clone(), options);
    let shutdown_timeout = Duration::from_millis(settings.shutdown_timeout_ms);
    let config = ServeConfig {
        header_read_timeout: Duration::from_millis(settings.header_read_timeout_ms),
        drain_timeout: shutdown_timeout,
        ..ServeConfig::default()
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stop_rx.await;
    };
    let server = match tls {
        None => tokio::spawn(serve_with(listener, router, config, stopped)),
        Some(tls) => tokio::spawn(serve_tls_with(listener, router, config, tls, stopped)),
    };
    let ticker = tokio::spawn({
        let coordinator = coordinator.clone();
        async move { coordinator.run_ticker().await }
    });
    let scheme = if settings.listener.tls.is_some() { "https" } else { "http" };
    tracing::info!(listen = %settings.listen, scheme, instance = %settings.coordinator.instance_id, "coordinator serving");

    let mut signals = signals;
    let signal = signals.next().await;
    let accept_ms = settings.listener.shutdown_accept_ms;
    let accept_until = tokio::time::Instant::now() + Duration::from_millis(accept_ms);
    tracing::info!(
        signal,
        "shutting down: new mutations get 503 COORDINATOR_TERMINATING; accepting new connections for {accept_ms} ms"
    );
    tokio::spawn(async move {
        let signal = signals.next().await;
        tracing::warn!(signal, "second signal: exiting at once");
        std::process::exit(1);
    });
    coordinator.begin_shutdown();
    if rsc::time::timeout(shutdown_timeout, coordinator.drained()).await.is_err() {
        tracing::warn!(?shutdown_timeout, "critical sections still running at the shutdown timeout; stopping anyway");
    }
    // Keep the listener open until endpoints had time to drop this instance: a connection refused
    // now would be an error a client cannot tell from a crash, whereas the 503s and routing
    // answers it gets meanwhile say exactly what to do.
    rsc::time::sleep_until(accept_until).await;
    tracing::info!("accept window over: closing the listener and draining open connections");
    let _ = stop_tx.send(());
    if let Err(error) = server.await {
        tracing::warn!(%error, "server task failed");
    }
    // The ticker sees the terminating flag after its current pass and sleep.
    let tick = Duration::from_millis(settings.coordinator.tick_interval_ms);
    if rsc::time::timeout(tick + shutdown_timeout, ticker).await.is_err() {
        tracing::warn!("ticker did not stop in time");
    }
    tracing::info!("coordinator stopped");
    Ok(())
}

/// Seeds the embedded store and is mixed into the coordinator's own draw from the OS
/// (`CoordinatorOptions::rng_seed`): distinct per process. (This binary never runs under the
/// simulation, so the wall clock is fine here.)
fn process_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ (u64::from(std::process::id()) << 32)
}

/// SIGTERM and SIGINT.
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self { terminate: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    /// The name of the next signal received.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                biased;
                _ = self.terminate.recv() => "SIGTERM",
                _ = self.interrupt.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_store_configuration_exits_2_and_an_unreachable_store_exits_3() {
        let bad_url = rsc::store::redis::RedisStore::open("not a url", Default::default()).expect_err("rejected");
        assert!(matches!(bad_url, StoreError::Config(_)), "{bad_url:?}");
        assert_eq!(ServeError::Connect(bad_url).exit_code(), 2);
        assert_eq!(ServeError::Connect(StoreError::Unavailable("refused".into())).exit_code(), 3);
    }

    #[test]
    fn an_unreadable_listener_tls_file_exits_2() {
        let missing = std::path::Path::new("/nonexistent/rsc/coordinator.pem");
        let error = tls::server_config(missing, missing, None).expect_err("no such file");
        assert_eq!(ServeError::Tls(error).exit_code(), 2);
    }
}
