//! Timers for code that runs on both runtimes: `sleep`, `sleep_until` and `timeout` with
//! tokio's meaning, which the simulation can afford to poll often.
//!
//! Owns: nothing on tokio — the functions are tokio's own. Under madsim, a [`Sleep`] that
//! registers one simulator timer for its deadline however often it is polled, and whose timer,
//! once the `Sleep` is gone (done, or dropped unfinished, like a `timeout` whose future won),
//! wakes nobody.
//! Why: madsim's own `Sleep` adds a timer to the simulator's heap on *every* pending poll and
//! never removes one. A `timeout` around a store call is polled once per message of its exchange,
//! so each call left several timers behind, each waking its task again when its deadline passed,
//! long after the call was answered: a spurious poll of the whole task, which polled its own
//! live timeouts again and added more. That was the largest item of a simulation's profile.
//! Never: changes when anything wakes up for real — a live `Sleep` completes at its deadline, as
//! madsim's does (it is madsim's timer that fires).

#[cfg(not(madsim))]
pub use tokio::time::{sleep, sleep_until, timeout, Sleep};

#[cfg(madsim)]
pub use self::simulated::{sleep, sleep_until, timeout, Sleep};

#[cfg(madsim)]
mod simulated {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    use tokio::time::error::Elapsed;
    use tokio::time::Instant;

    /// Waits until `duration` has elapsed (at least 1 ms, as tokio and madsim do).
    pub fn sleep(duration: Duration) -> Sleep {
        Sleep { inner: tokio::time::sleep(duration), relay: None }
    }

    /// Waits until `deadline` (at least 1 ms from now, as madsim does).
    pub fn sleep_until(deadline: Instant) -> Sleep {
        Sleep { inner: tokio::time::sleep_until(deadline), relay: None }
    }

    /// `future`, or [`Elapsed`] once `duration` has passed; the deadline is taken now, when
    /// `timeout` is called, as tokio takes it.
    pub fn timeout<F: Future>(duration: Duration, future: F) -> impl Future<Output = Result<F::Output, Elapsed>> {
        let deadline = sleep(duration);
        async move {
            tokio::select! {
                biased;
                out = future => Ok(out),
                () = deadline => Err(Elapsed),
            }
        }
    }

    /// A madsim `Sleep` polled with a [`Relay`] as its waker, so that its one timer reaches the
    /// task that polled last, and nobody once this is dropped.
    #[derive(Debug)]
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct Sleep {
        inner: tokio::time::Sleep,
        /// `None` until the first pending poll registered the timer.
        relay: Option<Arc<Relay>>,
    }

    impl Sleep {
        /// The instant at which this completes.
        pub fn deadline(&self) -> Instant {
            self.inner.deadline()
        }

        /// Whether the deadline has passed.
        pub fn is_elapsed(&self) -> bool {
            self.inner.is_elapsed()
        }

        /// Moves the deadline to `deadline` (as tokio's `Sleep::reset`): the timer of the old
        /// one wakes nobody, the next pending poll registers one for the new one.
        pub fn reset(mut self: Pin<&mut Self>, deadline: Instant) {
            if let Some(relay) = self.relay.take() {
                relay.silence();
            }
            self.inner = tokio::time::sleep_until(deadline);
        }
    }

    impl Future for Sleep {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.inner.is_elapsed() {
                return Poll::Ready(());
            }
            if let Some(relay) = &self.relay {
                if relay.redirect(cx.waker()) {
                    return Poll::Pending;
                }
            }
            // First pending poll, or the timer already fired without the deadline having passed
            // (not something madsim does): register a timer, once.
            let relay = Arc::new(Relay { waker: Mutex::new(Some(cx.waker().clone())) });
            let waker = Waker::from(Arc::clone(&relay));
            let pending = Pin::new(&mut self.inner).poll(&mut Context::from_waker(&waker));
            if let Some(old) = self.relay.replace(relay) {
                old.silence();
            }
            pending
        }
    }

    impl Drop for Sleep {
        fn drop(&mut self) {
            if let Some(relay) = &self.relay {
                relay.silence();
            }
        }
    }

    /// The waker a registered timer holds: passes its wake-up on to the task's current waker,
    /// if any.
    #[derive(Debug)]
    struct Relay {
        /// `None` once the timer fired, or the `Sleep` is gone.
        waker: Mutex<Option<Waker>>,
    }

    impl Relay {
        /// Points the relay at `waker`; false when the timer has fired already (nothing to point).
        fn redirect(&self, waker: &Waker) -> bool {
            let mut slot = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
            match slot.as_mut() {
                Some(current) => {
                    current.clone_from(waker);
                    true
                }
                None => false,
            }
        }

        fn silence(&self) {
            self.waker.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
    }

    impl Wake for Relay {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            let waker = self.waker.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

#[cfg(all(test, madsim))]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tokio::time::Instant;

    /// Counts the polls of the future it wraps.
    struct Counted<F> {
        inner: Pin<Box<F>>,
        polls: Arc<AtomicUsize>,
    }

    impl<F: Future> Future for Counted<F> {
        type Output = F::Output;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            self.inner.as_mut().poll(cx)
        }
    }

    /// A future that is pending `n` times (waking itself each time) before it is ready: an
    /// exchange of `n` messages.
    struct Chatty(usize);

    impl Future for Chatty {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 == 0 {
                return Poll::Ready(());
            }
            self.0 -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[madsim::test]
    async fn a_sleep_ends_at_its_deadline_however_often_it_is_polled() {
        let started = Instant::now();
        let sleep = super::sleep(Duration::from_millis(300));
        // Polled again and again while pending, as a select! loop polls it.
        let both = async {
            tokio::join!(sleep, async {
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                }
            })
        };
        both.await;
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(301), "{took:?}");
    }

    /// A sleep polled by one task and then awaited by another wakes the one that polled last,
    /// at its deadline (the timer registered by the first poll is redirected, not duplicated); a
    /// reset deadline is the one kept.
    #[madsim::test]
    async fn a_sleep_wakes_the_task_that_polled_it_last_at_its_deadline() {
        let started = Instant::now();
        let mut sleep = Box::pin(super::sleep(Duration::from_millis(300)));
        let first = std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx))).await;
        assert!(first.is_pending());
        let polls = Arc::new(AtomicUsize::new(0));
        let waiter = tokio::spawn(Counted { inner: sleep, polls: Arc::clone(&polls) });
        waiter.await.expect("the second task");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(301), "{took:?}");
        assert_eq!(polls.load(Ordering::SeqCst), 2, "polled once pending, once at the deadline");

        let started = Instant::now();
        let mut sleep = Box::pin(super::sleep(Duration::from_millis(300)));
        assert!(std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx))).await.is_pending());
        sleep.as_mut().reset(started + Duration::from_millis(100));
        sleep.await;
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(101), "{took:?}");
    }

    #[madsim::test]
    async fn a_timeout_answers_the_future_or_elapsed_at_its_deadline() {
        assert_eq!(super::timeout(Duration::from_millis(100), async { 7 }).await, Ok(7));
        let started = Instant::now();
        let late = super::timeout(Duration::from_millis(100), super::sleep(Duration::from_secs(5))).await;
        assert!(late.is_err());
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(101), "{took:?}");
    }

    /// madsim's own `timeout` leaves a timer per pending poll, each of which wakes the task at the
    /// old deadline, long after the future won: with `tokio::time::timeout` here (five timers)
    /// this task is polled again at 1 s, with nothing to do.
    #[madsim::test]
    async fn a_timeout_that_lost_wakes_nobody_at_its_deadline() {
        let polls = Arc::new(AtomicUsize::new(0));
        let task = Counted {
            inner: Box::pin(async {
                super::timeout(Duration::from_secs(1), Chatty(5)).await.expect("the exchange wins");
                super::sleep(Duration::from_secs(3)).await;
            }),
            polls: Arc::clone(&polls),
        };
        let handle = tokio::spawn(task);
        super::sleep(Duration::from_millis(500)).await;
        let before = polls.load(Ordering::SeqCst);
        super::sleep(Duration::from_millis(2_000)).await;
        assert_eq!(polls.load(Ordering::SeqCst), before, "woken after the timeout was over");
        handle.await.expect("task");
        assert_eq!(polls.load(Ordering::SeqCst), before + 1, "woken once more, by its sleep");
    }
}
