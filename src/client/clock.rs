//! The clients' one clock: milliseconds since an origin [`Instant`] on the `tokio::time` clock
//! (madsim's simulated clock under `--cfg madsim`).
//!
//! The pure cores ([`super::core::ConsumerCore`], [`super::producer::RoutingCache`]) take `now_ms`
//! as a parameter and never read a clock; the async drivers read it here, in one place. Share one
//! `Clock` between every client of a process (and, in the simulation, of a run) so event times
//! line up. Conversions round *down*: a deadline computed from a floored send time is never later
//! than the true one, and `now_ms < deadline_ms` with a floored `now_ms` is the conservative check.

use std::time::Duration;

use tokio::time::Instant;

/// Milliseconds since a fixed origin.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self { origin: Instant::now() }
    }

    /// A clock with an explicit origin (the simulation passes the run's start).
    pub fn with_origin(origin: Instant) -> Self {
        Self { origin }
    }

    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Milliseconds elapsed since the origin, rounded down.
    pub fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// Milliseconds from the origin to `at`, rounded down (0 before the origin).
    pub fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// The instant `ms` milliseconds after the origin.
    pub fn instant_at(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
