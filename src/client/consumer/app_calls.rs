//! [`AppCalls`]: the application code (event sink, rebalance listener) running for one consumer,
//! and its end when the consumer is dropped.
//!
//! Owns one rule: once a dropped consumer's sink heard `Closed`, nothing of that consumer reaches
//! the application any more. Every sink emission and listener call runs inside an [`AppCall`],
//! which [`AppCalls::enter`] refuses once the consumer was dropped, and the drop waits for the
//! calls already under way on other threads before the sink hears `Closed`. (The drop used to
//! emit `Closed` at once while the heartbeat task, on another worker, was emitting under the
//! core's lock or about to: its `LeaseExtended` reached a metrics sink after `Closed` and
//! recreated the member's lease series, which then read 0 for ever, and its listener calls came
//! after the drop; a client lifecycle review finding, F6. The producer closes the same race with
//! its `closed` flag.)
//!
//! Never waits for a call on the dropping thread itself: a sink or listener that drops the
//! consumer is that call, so waiting would deadlock. That call ends on its own; the code running
//! it checks [`AppCalls::dropped`] before each further emission or listener call. On a single
//! thread (madsim, tokio's current-thread runtime) every call under way is the dropping thread's,
//! so the drop never waits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct AppCalls {
    state: Mutex<State>,
    /// Signalled whenever an [`AppCall`] ends.
    call_ended: Condvar,
    /// `State::dropped`, readable without the lock (checked per event).
    dropped: AtomicBool,
    /// The sink heard `Left` or `Closed`: the drop adds no `Closed` of its own.
    ended: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    dropped: bool,
    /// The threads inside an [`AppCall`], once per call (at most one per thread but for a sink or
    /// listener that calls back into the consumer).
    threads: Vec<ThreadId>,
    /// How many [`AppCalls::end`] wait for `call_ended` (one today: the consumer's drop; counted
    /// so that a second waiter could not clear it for the first): only then does an ending call
    /// signal it. A signal is a system call (`futex`) whether or not anyone waits, and a call ends
    /// at every core step that emitted events: signalling each time cost ten system calls per
    /// message on the data path (`benches/data_path.rs`, counted with `perf stat -e
    /// syscalls:sys_enter_futex`).
    waiting: usize,
}

/// One stretch of application code running for the consumer; ends when dropped.
pub(super) struct AppCall<'a> {
    calls: &'a AppCalls,
    thread: ThreadId,
}

impl AppCalls {
    /// Starts a call on this thread, unless the consumer was dropped.
    pub(super) fn enter(&self) -> Option<AppCall<'_>> {
        let mut state = self.lock();
        if state.dropped {
            return None;
        }
        let thread = std::thread::current().id();
        state.threads.push(thread);
        Some(AppCall { calls: self, thread })
    }

    /// The consumer was dropped: no further application call may start.
    pub(super) fn dropped(&self) -> bool {
        self.dropped.load(Ordering::SeqCst)
    }

    /// The sink heard the consumer's last event (`Left` or `Closed`).
    pub(super) fn note_ended(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    /// The consumer is dropped: refuses every later call, then waits until the calls under way on
    /// other threads returned. Returns whether the sink already heard `Left` or `Closed`.
    pub(super) fn end(&self) -> bool {
        let mut state = self.lock();
        state.dropped = true;
        self.dropped.store(true, Ordering::SeqCst);
        let me = std::thread::current().id();
        while state.threads.iter().any(|thread| *thread != me) {
            // Counted under the lock, which the wait releases atomically: a call that ends after
            // this sees it and signals.
            state.waiting += 1;
            state = self.call_ended.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
            state.waiting -= 1;
        }
        drop(state);
        self.ended.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Poisoned: a panic while the list was edited (no application code runs under this lock).
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for AppCall<'_> {
    fn drop(&mut self) {
        let mut state = self.calls.lock();
        if let Some(at) = state.threads.iter().position(|thread| *thread == self.thread) {
            state.threads.swap_remove(at);
        }
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.calls.call_ended.notify_all();
        }
    }
}
