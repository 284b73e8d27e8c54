//! The store contract: one generic case per behaviour (`contract_<case>` in
//! `store_contract/{fences,metadata,stamp,streams,touch_check}.rs`), each run unchanged against
//! - `RedisStore` on its own freshly spawned `redis-server` (module `redis_store`),
//! - `RedisStore` as an ACL user without FLUSHDB/FLUSHALL (module `redis_acl_store`), which
//!   proves the least-privilege user the seed recommends can run everything the store needs,
//! - `RedisStore` on its own Redis Cluster of 3 primaries with a replica each (module
//!   `redis_cluster_store`; `support::RedisCluster`), with the shards' streams and fence keys
//!   spread over the primaries, so every batched call is split by slot,
//! - `RedisStore` on its own TLS-only Redis Cluster of 3 primaries requiring client certificates
//!   (module `redis_tls_cluster_store`; `RedisCluster::start_tls`), so every connection the
//!   cluster client opens, blocking reads included, is mutual TLS,
//! - `MemoryStore`, the simulation's fake (module `memory_store`),
//!
//! so the fake cannot drift from real Redis, and the Cluster from one server. Cases that need a
//! revision lost and written again (`stamp.rs`) also take the store's way of making that loss: by
//! hand on a real server (on the slot's primary in a Cluster, plain and TLS), by the fake's
//! rollback fault in the fake. The fence cases run once more with every fenced read through the
//! script (gates off) on one server and on a Cluster. `store_contract/redis_only.rs` holds what only a real
//! server can show (layout on the wire, restart, failover, dead and hung servers, renamed and
//! ACL-denied commands).
//!
//! Run: `cargo test --test store_contract` (needs `redis-server` >= 6.2 on PATH or
//! `REDIS_SERVER_BIN`; without it the Redis tests fail with instructions, they never skip).
//! Not built under `--cfg madsim`: `RedisStore` does not exist there.

#![cfg(not(madsim))]

mod support;

#[path = "store_contract/cluster.rs"]
mod cluster;
#[path = "store_contract/doorbell.rs"]
mod doorbell;
#[path = "store_contract/fences.rs"]
mod fences;
#[path = "store_contract/metadata.rs"]
mod metadata;
#[path = "store_contract/redis_only.rs"]
mod redis_only;
#[path = "store_contract/sentinel.rs"]
mod sentinel;
#[path = "store_contract/stamp.rs"]
mod stamp;
#[path = "store_contract/streams.rs"]
mod streams;
#[path = "store_contract/tls.rs"]
mod tls;
#[path = "store_contract/tls_cluster.rs"]
mod tls_cluster;
#[path = "store_contract/touch_check.rs"]
mod touch_check;

pub use doorbell::*;
pub use fences::*;
pub use metadata::*;
pub use stamp::*;
pub use streams::*;
pub use touch_check::*;

/// One contract case on one kind of store: `redis` (its own `redis-server`), `redis_acl` (the
/// same as an ACL user without FLUSHDB/FLUSHALL), `cluster` (its own 6-node Redis Cluster),
/// `tls_cluster` (its own 3-node mutual-TLS Redis Cluster), `memory` (the simulation's fake).
macro_rules! store_case {
    (redis, $case:ident) => {
        #[tokio::test]
        async fn $case() {
            let server = crate::support::RedisServer::start();
            let options = rsc::store::redis::RedisStoreOptions::default();
            let store = rsc::store::redis::RedisStore::connect(&server.url(), options).await.expect("connect");
            crate::$case(&store).await;
        }
    };
    (redis_acl, $case:ident) => {
        #[tokio::test]
        async fn $case() {
            let server = crate::support::RedisServer::start();
            let url = server.create_acl_user("coordinator", "contract-pw");
            let options = rsc::store::redis::RedisStoreOptions::default();
            let store = rsc::store::redis::RedisStore::connect(&url, options).await.expect("connect");
            crate::$case(&store).await;
        }
    };
    (cluster, $case:ident) => {
        #[tokio::test]
        async fn $case() {
            // Six nodes: 3 primaries with a replica each, as a production Cluster runs.
            let cluster = crate::support::redis_cluster::RedisCluster::start(3, 1);
            let options = rsc::store::redis::RedisStoreOptions::default();
            let store =
                rsc::store::redis::RedisStore::connect_cluster(&cluster.nodes(), options).await.expect("connect");
            crate::$case(&store).await;
        }
    };
    (tls_cluster, $case:ident) => {
        #[tokio::test]
        async fn $case() {
            // Three primaries, no replicas (the plain Cluster above covers replicas): only TLS
            // ports, mutual TLS required, TLS on the bus between nodes too.
            let auth = crate::support::redis_server::TlsClientAuth::Yes;
            let cluster = crate::support::redis_cluster::RedisCluster::start_tls(3, 0, auth);
            let options = crate::tls_cluster::mutual_tls_options(&cluster);
            let store =
                rsc::store::redis::RedisStore::connect_cluster(&cluster.nodes(), options).await.expect("connect");
            crate::$case(&store).await;
        }
    };
    (memory, $case:ident) => {
        #[tokio::test]
        async fn $case() {
            let store = rsc::store::memory::MemoryStore::new(0x5eed);
            crate::$case(&store).await;
        }
    };
}

/// Instantiates every case once per store; the `single_server` cases (whose behaviour a Redis
/// Cluster documents differently, see `RedisStore::open_cluster`) everywhere but on the Cluster.
macro_rules! contract_suite {
    (everywhere: [$($case:ident),* $(,)?], single_server: [$($single:ident),* $(,)?] $(,)?) => {
        mod redis_store {
            $(store_case!(redis, $case);)*
            $(store_case!(redis, $single);)*
        }

        mod redis_acl_store {
            $(store_case!(redis_acl, $case);)*
            $(store_case!(redis_acl, $single);)*
        }

        mod redis_cluster_store {
            $(store_case!(cluster, $case);)*
        }

        mod redis_tls_cluster_store {
            $(store_case!(tls_cluster, $case);)*
        }

        mod memory_store {
            $(store_case!(memory, $case);)*
            $(store_case!(memory, $single);)*
        }
    };
}

contract_suite!(
    everywhere: [
        contract_create_only_if_absent,
        contract_cas_success_and_conflict,
        contract_revision_without_successor_is_refused,
        contract_liveness_guard_failure_writes_nothing,
        contract_liveness_removal,
        contract_touch_and_load,
        contract_touch_and_check_unchanged_and_changed,
        contract_touch_and_check_leaves_no_key_for_a_vanished_group,
        contract_liveness_counters_are_exact_and_refuse_overflow,
        contract_delete_if_stamp,
        contract_a_write_needs_a_write_id,
        contract_mutex,
        contract_index_and_rebuild,
        contract_heard_relay_blobs_reach_their_owner_and_expire,
        contract_identity_and_probe,
        contract_stream_ids_increase,
        contract_ensure_group_idempotent_and_delivers_preexisting,
        contract_new_vs_own_pending,
        contract_xack,
        contract_claim_all_pending,
        contract_maxlen,
        contract_missing_group_errors,
        contract_wait_for_entries,
        contract_fence_raise_counts_up_and_stores_the_nonce,
        contract_fence_raise_floor_sets_only_a_key_without_a_counter,
        contract_fenced_operations_accept_the_exact_fence,
        contract_fenced_acks_count_what_they_acknowledged_at_any_size,
        contract_an_older_fence_is_refused_and_touches_nothing,
        contract_the_same_counter_with_another_nonce_is_refused,
        contract_a_newer_fence_is_accepted_and_replaces_the_key,
        contract_a_missing_fence_key_accepts_any_fence,
        contract_a_counter_beyond_the_largest_is_refused_and_never_installed,
        contract_fenced_operations_map_missing_groups_as_unfenced_ones,
        contract_batched_fenced_reads_and_acks_keep_each_shards_outcome,
    ],
    single_server: [contract_one_missing_group_fails_a_whole_read],
);

/// The fence cases once more on Redis with every fenced read through the script (no gates,
/// `RedisStoreOptions::fenced_read_gates` off): the path a gated read falls back to.
macro_rules! scripted_reads_suite {
    ($($case:ident),* $(,)?) => {
        mod redis_store_scripted_reads {
            $(
                #[tokio::test]
                async fn $case() {
                    let server = crate::support::RedisServer::start();
                    let options =
                        rsc::store::redis::RedisStoreOptions { fenced_read_gates: false, ..Default::default() };
                    let store = rsc::store::redis::RedisStore::connect(&server.url(), options).await.expect("connect");
                    crate::$case(&store).await;
                }
            )*
        }

        mod redis_cluster_store_scripted_reads {
            $(
                #[tokio::test]
                async fn $case() {
                    let cluster = crate::support::redis_cluster::RedisCluster::start(3, 1);
                    let options =
                        rsc::store::redis::RedisStoreOptions { fenced_read_gates: false, ..Default::default() };
                    let store = rsc::store::redis::RedisStore::connect_cluster(&cluster.nodes(), options)
                        .await
                        .expect("connect");
                    crate::$case(&store).await;
                }
            )*
        }
    };
}

scripted_reads_suite!(
    contract_fenced_operations_accept_the_exact_fence,
    contract_an_older_fence_is_refused_and_touches_nothing,
    contract_the_same_counter_with_another_nonce_is_refused,
    contract_a_newer_fence_is_accepted_and_replaces_the_key,
    contract_a_missing_fence_key_accepts_any_fence,
    contract_a_counter_beyond_the_largest_is_refused_and_never_installed,
    contract_fenced_operations_map_missing_groups_as_unfenced_ones,
    contract_batched_fenced_reads_and_acks_keep_each_shards_outcome,
);

/// Instantiates every case that needs a lost-and-rewritten revision once per store, with that
/// store's way of making the loss.
macro_rules! contract_loss_suite {
    ($($case:ident),* $(,)?) => {
        mod redis_store_after_loss {
            $(
                #[tokio::test]
                async fn $case() {
                    let server = crate::support::RedisServer::start();
                    let options = rsc::store::redis::RedisStoreOptions::default();
                    let store = rsc::store::redis::RedisStore::connect(&server.url(), options).await.expect("connect");
                    crate::$case(&store, &crate::HandRewrite(&server)).await;
                }
            )*
        }

        mod redis_acl_store_after_loss {
            $(
                #[tokio::test]
                async fn $case() {
                    let server = crate::support::RedisServer::start();
                    let url = server.create_acl_user("coordinator", "contract-pw");
                    let options = rsc::store::redis::RedisStoreOptions::default();
                    let store = rsc::store::redis::RedisStore::connect(&url, options).await.expect("connect");
                    crate::$case(&store, &crate::HandRewrite(&server)).await;
                }
            )*
        }

        mod redis_cluster_store_after_loss {
            $(
                #[tokio::test]
                async fn $case() {
                    let cluster = crate::support::redis_cluster::RedisCluster::start(3, 1);
                    let options = rsc::store::redis::RedisStoreOptions::default();
                    let store = rsc::store::redis::RedisStore::connect_cluster(&cluster.nodes(), options)
                        .await
                        .expect("connect");
                    crate::$case(&store, &crate::ClusterHandRewrite(&cluster)).await;
                }
            )*
        }

        mod redis_tls_cluster_store_after_loss {
            $(
                #[tokio::test]
                async fn $case() {
                    let auth = crate::support::redis_server::TlsClientAuth::Yes;
                    let cluster = crate::support::redis_cluster::RedisCluster::start_tls(3, 0, auth);
                    let options = crate::tls_cluster::mutual_tls_options(&cluster);
                    let store = rsc::store::redis::RedisStore::connect_cluster(&cluster.nodes(), options)
                        .await
                        .expect("connect");
                    crate::$case(&store, &crate::ClusterHandRewrite(&cluster)).await;
                }
            )*
        }

        mod memory_store_after_loss {
            $(
                #[tokio::test]
                async fn $case() {
                    let store = rsc::store::memory::MemoryStore::new(0x5eed);
                    crate::$case(&store, &crate::RollbackRewrite(store.clone())).await;
                }
            )*
        }
    };
}

contract_loss_suite!(contract_a_lost_and_rewritten_revision_refuses_the_old_stamp);

#[tokio::test]
async fn redis_store_probe_names_a_renamed_command() {
    let args = ["--rename-command", "XAUTOCLAIM", ""].map(String::from).to_vec();
    let server = support::RedisServer::start_with(support::ServerConfig { extra_args: args, ..Default::default() });
    let options = rsc::store::redis::RedisStoreOptions::default();
    let store = rsc::store::redis::RedisStore::connect(&server.url(), options).await.expect("connect");
    contract_probe_names_a_missing_command(&store).await;
}

#[tokio::test]
async fn memory_store_probe_names_an_unsupported_command() {
    let store = rsc::store::memory::MemoryStore::new(0x5eed);
    store.set_unsupported("XAUTOCLAIM");
    contract_probe_names_a_missing_command(&store).await;
}
