//! The HTTP edge: serving an axum router and calling it, the same way on tokio and on madsim's
//! simulated TCP.

pub mod client;
pub mod serve;
