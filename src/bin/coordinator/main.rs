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
