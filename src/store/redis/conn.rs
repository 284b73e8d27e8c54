//! Connections to one Redis server, with a deadline on every round trip.
//!
//! Owns: one shared multiplexed connection for ordinary commands, and a small pool of dedicated
//! connections for blocking reads (`XREADGROUP ... BLOCK`), which would otherwise stall every
//! command queued behind them on the shared connection.
//! Never: waits without a deadline, retries a command on its own (a command that timed out may
//! still have run; the caller's retry decides, and every write is a revision CAS), or keeps a
//! connection that failed or timed out — the next call connects afresh, which is how the store
//! follows a restarted or failed-over server.

use std::future::Future;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, RedisResult};
use tokio::sync::Mutex;

use super::errors::{map_error, timed_out, Redactor};
use crate::store::StoreError;

/// Idle dedicated connections kept for blocking reads.
const BLOCKING_IDLE_MAX: usize = 4;

/// The shared connection, tagged with a generation so a failure on an old connection never
/// discards a newer one another caller already opened.
#[derive(Default)]
struct Slot {
    current: Option<(u64, MultiplexedConnection)>,
    generation: u64,
}

/// Which connection a round trip uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The shared multiplexed connection.
    Shared,
    /// A dedicated connection from the blocking pool, returned to it after a clean reply.
    Blocking,
}

pub(crate) struct Connector {
    client: Client,
    config: AsyncConnectionConfig,
    timeout_ms: u64,
    redactor: Redactor,
    shared: Mutex<Slot>,
    blocking_idle: Mutex<Vec<MultiplexedConnection>>,
}

impl Connector {
    pub(crate) fn new(client: Client, timeout_ms: u64, redactor: Redactor) -> Self {
        // The crate's own response timeout (500 ms by default) is turned off: the deadline of
        // `run` governs, and it must be longer for a blocking read. The connect timeout is kept
        // so the crate gives up on a dead address instead of leaving a half-open attempt behind.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(timeout_ms)))
            .set_response_timeout(None);
        Self {
            client,
            config,
            timeout_ms,
            redactor,
            shared: Mutex::new(Slot::default()),
            blocking_idle: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        self.client.get_multiplexed_async_connection_with_config(&self.config).await
    }

    async fn checkout(&self, lane: Lane) -> RedisResult<(u64, MultiplexedConnection)> {
        match lane {
            Lane::Shared => {
                let mut slot = self.shared.lock().await;
                if let Some((generation, conn)) = &slot.current {
                    return Ok((*generation, conn.clone()));
                }
                let conn = self.connect().await?;
                slot.generation += 1;
                slot.current = Some((slot.generation, conn.clone()));
                Ok((slot.generation, conn))
            }
            Lane::Blocking => {
                let idle = self.blocking_idle.lock().await.pop();
                match idle {
                    Some(conn) => Ok((0, conn)),
                    None => Ok((0, self.connect().await?)),
                }
            }
        }
    }

    async fn discard_shared(&self, generation: u64) {
        let mut slot = self.shared.lock().await;
        if matches!(&slot.current, Some((g, _)) if *g == generation) {
            slot.current = None;
        }
    }

    /// Runs one round trip (connecting first if needed) under the store's deadline plus
    /// `extra_ms` (a blocking read's BLOCK time). `command` names the work in errors.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        lane: Lane,
        command: &str,
        extra_ms: u64,
        work: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<(T, MultiplexedConnection)>>,
    {
        let limit_ms = self.timeout_ms.saturating_add(extra_ms);
        let mut used: Option<u64> = None;
        let outcome = tokio::time::timeout(Duration::from_millis(limit_ms), async {
            let (generation, conn) = self.checkout(lane).await?;
            used = Some(generation);
            work(conn).await
        })
        .await;
        match outcome {
            Ok(Ok((value, conn))) => {
                if lane == Lane::Blocking {
                    let mut idle = self.blocking_idle.lock().await;
                    if idle.len() < BLOCKING_IDLE_MAX {
                        idle.push(conn);
                    }
                }
                Ok(value)
            }
            Ok(Err(err)) => {
                // Server replies (NOGROUP, NOPERM, ...) leave the connection healthy; anything at
                // the transport level means it must be replaced.
                if err.is_io_error() || err.is_unrecoverable_error() {
                    self.forget(lane, used).await;
                }
                Err(map_error(command, &err, &self.redactor))
            }
            Err(_elapsed) => {
                self.forget(lane, used).await;
                Err(timed_out(command, limit_ms))
            }
        }
    }

    async fn forget(&self, lane: Lane, generation: Option<u64>) {
        // A blocking-lane connection is owned by the failed call and simply dropped.
        if let (Lane::Shared, Some(generation)) = (lane, generation) {
            self.discard_shared(generation).await;
        }
    }
}
