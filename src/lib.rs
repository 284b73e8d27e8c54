//! Redis Stream Coordinator: exclusive shard ownership for consumer groups over sharded Redis
//! Streams, with a deterministic simulation that checks it.
//!
//! Layout (one room per concern):
//! - [`core`]: the pure decision core (model, protocol, decisions). No I/O, no clock, no RNG.
//! - [`store`]: the metadata and stream stores (real Redis, and the faultable in-memory fake).
//! - [`service`]: the coordinator workflow around the core (mutex, CAS, shutdown gate, ticks).
//! - [`http`]: the axum edge, served the same way on tokio and on madsim.
//! - [`client`]: consumer and producer libraries.
//! - [`time`]: `sleep` and `timeout` for both runtimes, cheap to poll under the simulation.

pub mod client;
pub mod core;
pub mod http;
pub mod metrics;
pub mod service;
pub mod store;
pub mod time;
