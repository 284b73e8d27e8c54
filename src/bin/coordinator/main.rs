//! `coordinator`: the coordinator process and its admin CLI.
//!
//! - `coordinator serve`: serves the HTTP API (`rsc::http::router::app`) from Redis (`--redis-url`
//!   / `REDIS_URL`) or, without a URL, from an in-memory store that is loudly not durable.
//! - `coordinator admin <command>`: talks to a running coordinator over HTTP.
//!
//! Exit codes: 0 success (including a graceful SIGTERM/SIGINT shutdown); 1 a runtime failure or an
//! error answer from the coordinator; 2 bad arguments or configuration (a malformed Redis URL or an
//! unreadable or invalid TLS file included); 3 the store is unreachable or incompatible (the
//! startup probe failed, a TLS handshake was refused).
//!
//! This binary is not built for the simulation (`--cfg madsim`): it needs real signals, real
//! sockets and `RedisStore`, none of which exist there.

#[cfg(not(madsim))]
mod admin;
#[cfg(not(madsim))]
mod cli;
#[cfg(not(madsim))]
mod config;
#[cfg(not(madsim))]
mod serve;

#[cfg(madsim)]
fn main() {
    eprintln!("the coordinator binary is not built for the simulation; use `cargo sim`");
    std::process::exit(2);
}

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    use clap::Parser;

    let cli = cli::Cli::parse();
    init_tracing();
    install_panic_hook();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return std::process::ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            cli::Command::Serve(args) => serve::main(args).await,
            cli::Command::Admin(args) => admin::main(args).await,
        }
    });
    std::process::ExitCode::from(code)
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`); colours only on a terminal.
#[cfg(not(madsim))]
fn init_tracing() {
    use std::io::IsTerminal;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Logs every panic at ERROR through `tracing`, then runs the default hook (its `thread '...'
/// panicked at` line and backtrace note stay on stderr). A panic in a spawned task (a connection
/// handler, the listener, the ticker) ends only that task and the process carries on, so without
/// this it left no ERROR line for log-based alerting (or the e2e tests' log check) to find.
#[cfg(not(madsim))]
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        tracing::error!(thread = thread.name().unwrap_or("<unnamed>"), "{info}");
        default(info);
    }));
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The hook logs a panic at ERROR with its place and message (the default hook still runs and
    /// prints to the test's stderr).
    #[test]
    fn a_panic_is_logged_at_error() {
        super::install_panic_hook();
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let outcome =
            tracing::subscriber::with_default(subscriber, || std::panic::catch_unwind(|| panic!("a planted panic")));
        assert!(outcome.is_err());
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(log.contains(" ERROR "), "{log}");
        assert!(log.contains("panicked at src/bin/coordinator/main.rs"), "{log}");
        assert!(log.contains("a planted panic"), "{log}");
    }
}
