//! The client libraries: the consumer ([`consumer::Consumer`]) and the producer
//! ([`producer::Producer`]), plus what they share — the key → shard hash, the coordinator
//! transport trait, the clock and the event stream.
//!
//! Each library is a pure core (no I/O, no clock: `now_ms` is a parameter) and a thin async
//! driver, so the same code runs on tokio against real Redis and under madsim against the fake
//! store, and the cores are unit-tested without either. Nothing here uses `std::thread`, a wall
//! clock, a `HashMap` iteration order, or randomness.

pub mod clock;
pub mod consumer;
pub mod events;
pub mod hash;
pub mod producer;
#[cfg(test)]
pub(crate) mod testing;
pub mod transport;

use std::sync::Arc;

pub use clock::Clock;
pub use consumer::{AckError, CloseError, Consumer, ConsumerConfig, Delivery, PollError, RebalanceListener};
pub use events::{ClientEvent, EventSink, NoopSink, StopReason, VecSink};
pub use producer::{Producer, ProducerConfig, PublishError, RoutingCache};
pub use transport::{CoordinatorTransport, TransportError};

/// What every client of a process shares: the clock its `now_ms` comes from and where its events
/// go. `Default`: a clock starting now, events dropped.
#[derive(Clone)]
pub struct ClientEnv {
    pub clock: Clock,
    pub events: Arc<dyn EventSink>,
}

impl ClientEnv {
    pub fn new(clock: Clock, events: Arc<dyn EventSink>) -> Self {
        Self { clock, events }
    }
}

impl Default for ClientEnv {
    fn default() -> Self {
        Self { clock: Clock::new(), events: Arc::new(NoopSink) }
    }
}

impl std::fmt::Debug for ClientEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientEnv").field("clock", &self.clock).finish_non_exhaustive()
    }
}
