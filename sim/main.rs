//! The `sim` binary: deterministic simulation of the coordinator, its clients and a faultable
//! Redis on madsim. Build and run it only with `--cfg madsim` (the `cargo sim` alias does that):
//!
//! ```text
//! cargo sim run <plan|all> --seeds A..B [--check-determinism] [--without-planted]
//! cargo sim replay <plan> <seed>       # full trace in target/sim-traces/
//! cargo sim show <plan> <seed>         # the drawn parameters only
//! cargo sim planted --seeds A..B       # every planted bug must be caught
//! cargo sim regressions                # every capsule in fault-plans/capsules/
//! cargo sim replay --capsule FILE      # a capsule's recorded run (also `run --capsule FILE`)
//! cargo sim capsule <plan> <seed>      # write a seed's capsule
//! cargo sim shrink FILE                # reduce a failing capsule, keeping its violation kind
//! cargo sim timeline <plan> <seed>     # one run as an HTML timeline in target/sim-timelines/
//! cargo sim run all --seeds A..B --jobs 4   # seeds in 4 child processes, progress on stderr
//! cargo sim bench [standard,swarm] [--seeds 0..10] [--baseline <other sim binary>]
//! ```
//!
//! The lab's rooms: `plan` (the TOML format, drawing every parameter from the seed), `world` and
//! `programs` (the simulated deployment running the production code), `redis_node` (the in-memory
//! Redis on its own node), `faults` (the fault injector), `records` (ground truth and the trace),
//! `checkers` (one file per invariant), `runner` and `cli`, `capsule` (recorded runs: replay and
//! shrinking) and `regressions` (the capsule corpus); the developer's tools: `timeline` (one
//! run drawn as an HTML page), `sweep` (seeds in child processes) and `bench` (sim/wall against
//! another build). The format and the checked properties are documented in `fault-plans/README.md`.
//!
//! Under a normal build this file compiles to a stub that explains how to run it, so
//! `cargo build --all-targets` and clippy work in both modes. The pure parts (plans, checkers) are
//! built and unit-tested in both modes (`cargo test --bin sim`).
#![cfg_attr(not(madsim), allow(dead_code))]

#[cfg(madsim)]
mod bench;
/// Failure capsules: whole recorded runs, replayed and shrunk without their plan files.
mod capsule;
mod checkers;
#[cfg(madsim)]
mod cli;
#[cfg(madsim)]
mod coord_rpc;
/// What runs reached (statuses, errors, rules, faults, rare situations).
mod coverage;
#[cfg(madsim)]
mod faults;
#[cfg(madsim)]
mod forger;
mod plan;
#[cfg(madsim)]
mod programs;
mod records;
#[cfg(madsim)]
mod redis_node;
mod regressions;
#[cfg(madsim)]
mod runner;
#[cfg(madsim)]
mod sweep;
mod timeline;
mod transport;
#[cfg(madsim)]
mod world;

/// Allocation-heavy (every simulated message, timer and task is a small box): mimalloc runs a seed
/// faster than the system allocator. Addresses never reach the simulation's decisions, so a seed's
/// run is the same with either.
#[cfg(madsim)]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(not(madsim))]
fn main() {
    eprintln!(
        "the simulation runs only under madsim; use the cargo alias:\n  \
         cargo sim run <plan|all> --seeds 0..100\n  \
         cargo sim replay <plan> <seed>\n\
         (`cargo sim` = cargo run --release --bin sim with --cfg madsim into target/sim; plans are in fault-plans/)"
    );
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    cli::main()
}
