//! The HTTP edge: the coordinator's API router ([`router::app`], route table in [`routes`]),
//! serving it and calling it, the same way on tokio and on madsim's simulated TCP. TLS ([`tls`])
//! exists only outside the simulation: it is a property of production deployments, not of the
//! coordination protocol the simulation checks (see `tls.rs` for why it is compiled out).

pub mod auth;
pub mod client;
pub mod error;
mod handlers;
pub mod health;
pub mod router;
pub mod routes;
pub mod serve;
#[cfg(not(madsim))]
pub mod tls;

pub use handlers::{AddShardsBody, ChangeConfigBody, CreateGroupBody, DeleteQuery, RebuildIndexResponse};
