//! Running several store calls at once on one task.
//!
//! Owns only [`join_all`]. Never spawns: dropping the caller drops every call (cancel safety is
//! the caller's, as for any future).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Runs the futures concurrently on this task and returns their outputs in order (the crate
/// has no `futures` dependency; this is its `join_all`, without spawning, so dropping the caller
/// drops every call).
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
