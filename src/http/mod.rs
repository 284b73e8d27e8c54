//! The HTTP edge: the coordinator's API router ([`router::app`], route table in [`routes`]),
//! serving it and calling it, the same way on tokio and on madsim's simulated TCP.

pub mod auth;
pub mod client;
pub mod error;
mod handlers;
pub mod health;
pub mod router;
pub mod routes;
pub mod serve;

pub use handlers::{AddShardsBody, ChangeConfigBody, CreateGroupBody, DeleteQuery, RebuildIndexResponse};
