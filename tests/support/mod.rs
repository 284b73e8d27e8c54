//! Shared integration-test harness: real `redis-server` processes and a pausable TCP proxy.
//!
//! Use from an integration test with `mod support;`. Every server binds 127.0.0.1 on a free
//! port, lives in its own temporary directory, and is killed when its handle drops (also when
//! the test panics), so tests run in parallel under `cargo nextest` without leaking processes.
//! A missing `redis-server` makes the test FAIL with a message saying how to install it (CI
//! installs it); set `REDIS_SERVER_BIN` to use a binary that is not on `PATH`.
//!
//! Recipes:
//! - restart with data kept and a new `run_id`: `RedisServer::start_with(ServerConfig { persistence:
//!   true, ..Default::default() })`, then `restart()` (graceful) or `kill()` + `start_again()`
//!   (AOF with `appendfsync always`, so even SIGKILL keeps every acknowledged write);
//! - failover that loses the last writes: `let (replica, link) = primary.start_replica_via_proxy()`,
//!   write, `primary.wait_replicated(1)`, `link.pause()`, write more (acknowledged, never
//!   replicated), `replica.promote()` — the promoted replica has a new replication id and lacks
//!   the writes made after the pause;
//! - clients that follow a failover on one address: point them at a `TcpProxy`, then
//!   `proxy.set_target(new_port)` + `proxy.cut()`;
//! - a hung server (connects succeed, nothing answers): `server.freeze()` / `server.thaw()`;
//! - a least-privilege user: `server.create_acl_user(name, password)` returns a URL.

#![allow(dead_code)] // Each integration test binary uses a different part of the harness.

pub mod cpu;
pub mod proxy;
pub mod redis_cluster;
pub mod redis_server;
pub mod sentinel;
pub mod tls;

pub use proxy::TcpProxy;
pub use redis_server::{RedisServer, ServerConfig};
