//! The shutdown gate (seed: "CoordinatorShutdownGate"): once terminating, new critical sections
//! are refused with 503 `COORDINATOR_TERMINATING`, while sections already entered finish their
//! write and mutex release. Ticks stop scheduling transitions.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::core::protocol::{ApiError, ErrorCode};

/// Process-local terminating state.
#[derive(Debug, Default)]
pub struct ShutdownGate {
    terminating: AtomicBool,
    entered: AtomicUsize,
    drained: Notify,
}

/// Held while a critical section runs; leaving it may complete a drain.
#[derive(Debug)]
pub struct Entered {
    gate: Arc<ShutdownGate>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.gate.entered.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.gate.drained.notify_waiters();
        }
    }
}

impl ShutdownGate {
    /// Enters a critical section, or refuses when terminating.
    pub fn enter(self: &Arc<Self>) -> Result<Entered, ApiError> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let entered = Entered { gate: Arc::clone(self) };
        // Checked after counting ourselves in, so a concurrent `begin` either sees us or we see it.
        if self.terminating.load(Ordering::SeqCst) {
            return Err(terminating());
        }
        Ok(entered)
    }

    /// Refuses new work when terminating (for paths that take no critical section).
    pub fn check(&self) -> Result<(), ApiError> {
        if self.terminating.load(Ordering::SeqCst) {
            Err(terminating())
        } else {
            Ok(())
        }
    }

    /// Enters terminating mode. Idempotent.
    pub fn begin(&self) {
        self.terminating.store(true, Ordering::SeqCst);
    }

    pub fn is_terminating(&self) -> bool {
        self.terminating.load(Ordering::SeqCst)
    }

    /// Number of critical sections in progress.
    pub fn in_progress(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }

    /// Waits until every entered critical section has finished.
    pub async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            if self.entered.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

fn terminating() -> ApiError {
    ApiError::new(ErrorCode::CoordinatorTerminating, "coordinator is terminating; retry against another instance")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_new_sections_and_waits_for_entered_ones() {
        let gate = Arc::new(ShutdownGate::default());
        let section = gate.enter().expect("open gate admits");
        gate.begin();
        assert_eq!(gate.enter().unwrap_err().code, ErrorCode::CoordinatorTerminating);
        assert_eq!(gate.check().unwrap_err().code, ErrorCode::CoordinatorTerminating);
        assert_eq!(gate.in_progress(), 1, "the refused attempt is not counted");
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.drained().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "drain waits for the entered section");
        drop(section);
        waiter.await.expect("drain completes");
        assert_eq!(gate.in_progress(), 0);
    }
}
