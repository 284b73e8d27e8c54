//! End-to-end production tests: the real `coordinator` binary (a child process on a free port),
//! real `redis-server` processes (tests/support), and the real client libraries talking HTTP to
//! it. Each test is one story of the "Production deployment" issue:
//!
//! 1. a consumer crashes mid-run among three while 10,000 messages flow: nothing is lost, acked
//!    entries never come back, no shard is read by two consumers at once;
//! 2. a rolling update: two coordinators behind the clients' address list, SIGTERM to the first;
//! 3. real write loss: a failover to a replica that missed the latest metadata writes;
//! 4. least privilege: an ACL user without FLUSHDB/FLUSHALL works end to end, and a server with a
//!    command renamed away makes `coordinator serve` fail fast naming it;
//! 5. bad input over real HTTP writes nothing, and stalled request bodies do not starve other
//!    clients;
//!
//! 6. metadata edited behind the coordinator's back fails closed and is never overwritten;
//!
//! plus shards added under traffic through the admin CLI (`reshard`), a read still on its way
//! to Redis when its shard is revoked (`slow_reads`), the whole fleet on a Redis Cluster through
//! a slot migration under traffic and a failover that loses metadata writes (`cluster`), a
//! group run on a mutual-TLS Cluster (`cluster_tls`), a
//! consumer process stopped past its lease whose reads, acks and claims after its shards moved are all refused at Redis (`fencing`), new connections after SIGTERM getting the
//! documented answers (`shutdown`), TLS and mutual TLS on the listener (`https`), what
//! `/metrics` exposes (`metrics_exposure`), and the previous release's coordinator and consumer
//! next to this build's through a rolling update and back (`mixed_versions`), with the wire rule
//! and the ACL users across the two releases (`mixed_wire`); both need `.ci/build-old-release`
//! and fail without it unless `E2E_SKIP_OLD_RELEASE=1` (outside CI).
//!
//! Safety is checked against ground truth (`e2e_support::ground_truth`): every XREADGROUP and
//! XAUTOCLAIM each consumer issued, with its time span. Leases are short (assignment lease 1.5 s,
//! member TTL 2 s, heartbeat 200 ms), every wait is bounded, and every process is killed on drop.
//!
//! One file per story under `tests/e2e/`; the harness is `tests/e2e_support/`.
//!
//! Run: `cargo nextest run --test e2e` (needs `redis-server` >= 6.2 on PATH). Real tokio; not
//! built under `--cfg madsim`.

#![cfg(not(madsim))]

mod e2e_support;
#[path = "http_api/schema.rs"]
mod schema;
mod support;

#[path = "e2e/acl.rs"]
mod acl;
#[path = "e2e/bad_input.rs"]
mod bad_input;
#[path = "e2e/cluster.rs"]
mod cluster;
#[path = "e2e/cluster_tls.rs"]
mod cluster_tls;
#[path = "e2e/corruption.rs"]
mod corruption;
#[path = "e2e/crash.rs"]
mod crash;
#[path = "e2e/fencing.rs"]
mod fencing;
#[path = "e2e/https.rs"]
mod https;
#[path = "e2e/lost_add_shards.rs"]
mod lost_add_shards;
#[path = "e2e/metrics_exposure.rs"]
mod metrics_exposure;
#[path = "e2e/mixed_versions.rs"]
mod mixed_versions;
#[path = "e2e/mixed_wire.rs"]
mod mixed_wire;
#[path = "e2e/reshard.rs"]
mod reshard;
#[path = "e2e/rolling_update.rs"]
mod rolling_update;
#[path = "e2e/security.rs"]
mod security;
#[path = "e2e/shutdown.rs"]
mod shutdown;
#[path = "e2e/slow_reads.rs"]
mod slow_reads;
#[path = "e2e/write_loss.rs"]
mod write_loss;

#[test]
fn the_harness_checkers_can_fail() {
    e2e_support::ground_truth::self_check();
    e2e_support::http_tap::self_check();
    e2e_support::process::self_check();
}
