//! The clients' one clock: milliseconds since the clock was made, on a clock that **counts time the
//! machine spent suspended** (CLOCK_BOOTTIME on Linux), plus the conversions to tokio timers.
//!
//! Why not tokio's `Instant`: it reads CLOCK_MONOTONIC, which stops while a VM or laptop is
//! suspended. A consumer that measured its lease on it would resume after a suspension believing
//! its lease still runs, and read shards the coordinator has long given to someone else (the planted
//! bug `lease-on-stopping-clock` does exactly that, on [`Clock::stopping`]). Timers are still tokio
//! timers (MONOTONIC: they fire late after a suspension), so every lease decision re-reads this
//! clock on every wake and immediately before every store call; [`Clock::sleep_until_ms`] wakes at
//! least every [`RECHECK_MS`] so a suspension is noticed soon after resume even with no other wake.
//!
//! Sources (the one `cfg(madsim)` switch of the clients):
//! - production: CLOCK_BOOTTIME via `rustix` on Linux and Android; elsewhere the monotonic clock
//!   (suspended time is then not counted: documented in `DESIGN.md` §7);
//! - `cfg(madsim)`: madsim's virtual time, shifted by this process's injected clock faults
//!   ([`ClockFaults`]: suspensions and rate drift), since madsim has one global clock;
//! - tests: [`Clock::with_faults`] over tokio time, in either build.
//!
//! The pure cores ([`super::consumer::core::ConsumerCore`], [`super::producer::RoutingCache`]) take
//! `now_ms` as a parameter and never read a clock; the async drivers read it here, in one place.
//! Conversions round *down*: a deadline computed from a floored send time is never later than the
//! true one, and `now_ms < deadline_ms` with a floored `now_ms` is the conservative check.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The longest a [`Clock::sleep_until_ms`] sleeps before re-reading the clock: after a suspension
/// (which tokio's monotonic timers do not see) a deadline that passed meanwhile is noticed at most
/// this long after resume.
pub const RECHECK_MS: u64 = 250;

/// Nominal clock rate in parts per million of true time.
pub const RATE_NOMINAL_PPM: u64 = 1_000_000;

/// Milliseconds since the clock was made (see the module docs). Cheap to clone; clones share the
/// origin and the source.
#[derive(Clone, Debug)]
pub struct Clock {
    source: Source,
    /// The source's readings when the clock was made (µs): (suspend-aware, monotonic).
    origin_us: (u64, u64),
    reading: Reading,
}

#[derive(Clone, Debug)]
enum Source {
    /// The operating system's clocks; `monotonic_origin` anchors the monotonic reading.
    #[cfg(not(madsim))]
    System { monotonic_origin: Instant },
    /// Tokio time (madsim's virtual time under the simulation) with injected faults.
    Faulty(ClockFaults),
}

/// Which of the source's clocks `now_ms` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// Counts suspended time (CLOCK_BOOTTIME): the only clock a lease may be measured on.
    SuspendAware,
    /// Stops while suspended (CLOCK_MONOTONIC, what tokio's `Instant` reads).
    Monotonic,
}

impl Clock {
    /// A clock whose origin is now, on the suspend-aware system clock (under `cfg(madsim)`: on
    /// madsim's virtual time with no faults; the simulation passes its own via
    /// [`Clock::with_faults`]).
    pub fn new() -> Self {
        #[cfg(not(madsim))]
        let source = Source::System { monotonic_origin: Instant::now() };
        #[cfg(madsim)]
        let source = Source::Faulty(ClockFaults::new());
        Self::from_source(source)
    }

    /// A clock over tokio time with the suspensions and rate drift `faults` injects (the
    /// simulation's per-process clock; tests).
    pub fn with_faults(faults: ClockFaults) -> Self {
        Self::from_source(Source::Faulty(faults))
    }

    fn from_source(source: Source) -> Self {
        let mut clock = Self { source, origin_us: (0, 0), reading: Reading::SuspendAware };
        clock.origin_us = clock.raw_us();
        clock
    }

    /// The same clock read the wrong way: on the clock that **stops** while the machine is
    /// suspended. Only the planted bug `lease-on-stopping-clock` uses it; never measure a lease
    /// on it.
    pub fn stopping(&self) -> Self {
        Self { reading: Reading::Monotonic, ..self.clone() }
    }

    /// The source's (suspend-aware, monotonic) readings in µs.
    fn raw_us(&self) -> (u64, u64) {
        match &self.source {
            #[cfg(not(madsim))]
            Source::System { monotonic_origin } => {
                let monotonic = duration_us(Instant::now().saturating_duration_since(*monotonic_origin));
                (system::suspend_aware_us().unwrap_or(monotonic), monotonic)
            }
            Source::Faulty(faults) => faults.readings_us(),
        }
    }

    fn now_us(&self) -> u64 {
        let (aware, monotonic) = self.raw_us();
        match self.reading {
            Reading::SuspendAware => aware.saturating_sub(self.origin_us.0),
            Reading::Monotonic => monotonic.saturating_sub(self.origin_us.1),
        }
    }

    /// Milliseconds elapsed since the origin, rounded down.
    pub fn now_ms(&self) -> u64 {
        self.now_us() / 1_000
    }

    /// Sleeps until [`Clock::now_ms`] reads at least `deadline_ms`. Timers are tokio's (they do
    /// not see a suspension), so it re-reads this clock at least every [`RECHECK_MS`].
    pub async fn sleep_until_ms(&self, deadline_ms: u64) {
        loop {
            let now_ms = self.now_ms();
            if now_ms >= deadline_ms {
                return;
            }
            crate::time::sleep(Duration::from_millis((deadline_ms - now_ms).min(RECHECK_MS))).await;
        }
    }

    /// The tokio instant at which this clock is expected to read `ms` (for exporting deadlines as
    /// "seconds remaining"; a suspension or drift makes it approximate, never use it to decide).
    pub fn instant_at(&self, ms: u64) -> Instant {
        let (now, now_ms) = (Instant::now(), self.now_ms());
        if ms >= now_ms {
            now + Duration::from_millis(ms - now_ms)
        } else {
            now.checked_sub(Duration::from_millis(now_ms - ms)).unwrap_or(now)
        }
    }

    /// Milliseconds on this clock at the tokio instant `at` (approximate, like
    /// [`Clock::instant_at`]; 0 before the origin).
    pub fn ms_at(&self, at: Instant) -> u64 {
        let (now, now_ms) = (Instant::now(), self.now_ms());
        if at >= now {
            now_ms.saturating_add(duration_ms(at - now))
        } else {
            now_ms.saturating_sub(duration_ms(now - at))
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Injected clock faults of one process (one machine): suspensions, during which the monotonic
/// clock stops while the suspend-aware clock runs on, and rate drift of both. Shared by handle:
/// the simulation's fault injector holds one per node and each process of that node reads it.
///
/// Time comes from tokio (madsim's virtual time under the simulation), so it is deterministic there.
#[derive(Clone, Debug)]
pub struct ClockFaults {
    state: Arc<Mutex<FaultState>>,
}

#[derive(Debug)]
struct FaultState {
    /// Tokio instant of the last change, and both readings (µs) then.
    anchor: Instant,
    aware_us: u64,
    monotonic_us: u64,
    rate_ppm: u64,
    suspended: bool,
}

impl FaultState {
    /// Both readings now, without moving the anchor.
    fn readings_us(&self, now: Instant) -> (u64, u64) {
        let true_us = u128::from(duration_us(now.saturating_duration_since(self.anchor)));
        let elapsed =
            u64::try_from(true_us * u128::from(self.rate_ppm) / u128::from(RATE_NOMINAL_PPM)).unwrap_or(u64::MAX);
        let monotonic = if self.suspended { 0 } else { elapsed };
        (self.aware_us.saturating_add(elapsed), self.monotonic_us.saturating_add(monotonic))
    }

    /// Re-anchors at `now`, so a change applies from now on only.
    fn reanchor(&mut self, now: Instant) {
        (self.aware_us, self.monotonic_us) = self.readings_us(now);
        self.anchor = now;
    }
}

impl ClockFaults {
    /// A fault-free clock state (both readings 0 now, nominal rate).
    pub fn new() -> Self {
        let state = FaultState {
            anchor: Instant::now(),
            aware_us: 0,
            monotonic_us: 0,
            rate_ppm: RATE_NOMINAL_PPM,
            suspended: false,
        };
        Self { state: Arc::new(Mutex::new(state)) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut FaultState, Instant) -> R) -> R {
        let now = Instant::now();
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner), now)
    }

    fn readings_us(&self) -> (u64, u64) {
        self.with(|s, now| s.readings_us(now))
    }

    /// The machine is suspended from now on: the monotonic clock stops, the suspend-aware one runs.
    pub fn suspend(&self) {
        self.with(|s, now| {
            s.reanchor(now);
            s.suspended = true;
        });
    }

    /// The machine resumed: both clocks run again.
    pub fn resume(&self) {
        self.with(|s, now| {
            s.reanchor(now);
            s.suspended = false;
        });
    }

    /// A suspension of `span` that already ended: the suspend-aware clock jumps ahead by `span`,
    /// the monotonic one does not (what a process sees when it runs again; for tests).
    pub fn suspended_for(&self, span: Duration) {
        self.with(|s, now| {
            s.reanchor(now);
            s.aware_us = s.aware_us.saturating_add(duration_us(span));
        });
    }

    /// Both clocks run at `rate_ppm` parts per million of true time from now on
    /// ([`RATE_NOMINAL_PPM`]: nominal).
    pub fn set_rate_ppm(&self, rate_ppm: u64) {
        self.with(|s, now| {
            s.reanchor(now);
            s.rate_ppm = rate_ppm;
        });
    }
}

impl Default for ClockFaults {
    fn default() -> Self {
        Self::new()
    }
}

/// The operating system's suspend-aware clock.
#[cfg(not(madsim))]
mod system {
    /// CLOCK_BOOTTIME in µs (counts suspended time).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(super) fn suspend_aware_us() -> Option<u64> {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        let secs = u64::try_from(t.tv_sec).ok()?;
        let micros = u64::try_from(t.tv_nsec).ok()? / 1_000;
        secs.checked_mul(1_000_000)?.checked_add(micros)
    }

    /// No suspend-aware clock wired up here: the caller falls back to the monotonic clock.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub(super) fn suspend_aware_us() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests;
