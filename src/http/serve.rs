//! Serving an axum [`Router`] so that it runs unchanged on tokio and on madsim's simulated TCP.
//!
//! `axum::serve` cannot be used: it calls the real `tokio::spawn`, which has no reactor under
//! madsim. Instead [`serve`] accepts on `tokio::net::TcpListener` (madsim's under `--cfg madsim`)
//! and spawns one hyper HTTP/1 connection task per accepted stream. Two helpers make hyper work in
//! both runtimes and are shared with the client ([`super::client`]):
//! - [`TokioTimeTimer`]: hyper's `Timer` on `tokio::time` (hyper-util's `TokioTimer` panics under
//!   madsim, and `header_read_timeout` panics without a timer).
//! - [`FlushOnWrite`]: skips `poll_flush` when nothing was written since the last flush. madsim's
//!   TCP sends one packet (>= 1 ms of virtual time) per flush, which otherwise makes keep-alive
//!   quadratic in simulated time.
//!
//! This module owns sockets and connection tasks only; it never looks inside requests.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// hyper's header-count limit, raised above the router's [`super::router::HEADERS_MAX`] so the
/// router's typed JSON 431 answers every ordinary excess; hyper's bare 431 is the backstop.
pub const HEADERS_MAX_HYPER: usize = 256;

/// How long a handler may wait for a request body; attached to every request by [`serve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyReadTimeout(pub Duration);

/// Connection settings of [`serve_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeConfig {
    /// A connection that does not deliver a full request head this long after it opened (or
    /// after the previous response) is closed.
    pub header_read_timeout: Duration,
    /// HTTP/1.1 keep-alive.
    pub keep_alive: bool,
    /// After shutdown, how long to wait for open connections to finish their current request.
    pub drain_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self { header_read_timeout: Duration::from_secs(10), keep_alive: true, drain_timeout: Duration::from_secs(5) }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, with [`ServeConfig::default`].
pub async fn serve(listener: TcpListener, router: Router, shutdown: impl Future<Output = ()>) {
    serve_with(listener, router, ServeConfig::default(), shutdown).await;
}

/// Serves `router` on `listener` until `shutdown` completes: then it stops accepting, asks every
/// open connection to close after its current request (HTTP/1 graceful shutdown), and returns
/// once they did or `drain_timeout` passed.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    shutdown: impl Future<Output = ()>,
) {
    let drain_timeout = config.drain_timeout;
    accept_until(listener, drain_timeout, shutdown, |stream, stop, open| {
        tokio::spawn(serve_connection(stream, router.clone(), config.clone(), stop, open));
    })
    .await;
}

/// [`serve_with`] over TLS: every accepted connection first completes a TLS handshake with `tls`
/// (within `header_read_timeout`, so a client that stalls it holds nothing for long); one that
/// fails (plain HTTP, an untrusted or missing client certificate under mutual TLS) is closed
/// without an HTTP answer. Not in the simulation (see [`super::tls`]).
#[cfg(not(madsim))]
pub async fn serve_tls_with(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    tls: std::sync::Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let drain_timeout = config.drain_timeout;
    accept_until(listener, drain_timeout, shutdown, |stream, stop, open| {
        let (acceptor, router, config) = (acceptor.clone(), router.clone(), config.clone());
        tokio::spawn(async move {
            match crate::time::timeout(config.header_read_timeout, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, router, config, stop, open).await,
                Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        });
    })
    .await;
}

/// The accept loop shared by plain and TLS serving: hands every accepted stream to `spawn` with
/// the stop signal and a liveness token (an `mpsc::Sender` clone the connection task holds until
/// it ends), and after `shutdown` completes, stops accepting, signals stop and waits for the
/// tokens to be dropped, at most `drain_timeout`.
async fn accept_until(
    listener: TcpListener,
    drain_timeout: Duration,
    shutdown: impl Future<Output = ()>,
    mut spawn: impl FnMut(tokio::net::TcpStream, watch::Receiver<bool>, mpsc::Sender<()>),
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a clone of `open_tx`; `recv` returns `None` once all are gone.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => spawn(stream, stop_rx.clone(), open_tx.clone()),
                Err(error) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    crate::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_tx);
    tokio::select! {
        biased;
        _ = open_rx.recv() => {}
        _ = crate::time::sleep(drain_timeout) => {}
    }
}

async fn serve_connection<S>(
    stream: S,
    router: Router,
    config: ServeConfig,
    mut stop: watch::Receiver<bool>,
    _open: mpsc::Sender<()>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let io = TokioIo::new(FlushOnWrite::new(stream));
    // Request bodies get the same bound as request heads: a client that stalls mid-body must not
    // hold a concurrency slot (and a connection) forever.
    let router = router.layer(axum::Extension(BodyReadTimeout(config.header_read_timeout)));
    let service = TowerToHyperService::new(router);
    let connection = http1::Builder::new()
        .timer(TokioTimeTimer)
        .header_read_timeout(config.header_read_timeout)
        .max_headers(HEADERS_MAX_HYPER)
        .keep_alive(config.keep_alive)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let stopping = async {
        // `Err`: the server is gone, which means stop as well.
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        biased;
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
        _ = stopping => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// hyper's [`hyper::rt::Timer`] on `tokio::time` (simulated time under madsim).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioTimeTimer;

/// A `crate::time::Sleep` as a hyper `Sleep`.
struct TimerSleep(Pin<Box<crate::time::Sleep>>);

impl Future for TimerSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for TimerSleep {}

impl hyper::rt::Timer for TokioTimeTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(TimerSleep(Box::pin(crate::time::sleep(duration))))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(TimerSleep(Box::pin(crate::time::sleep_until(from_std(deadline)))))
    }

    fn now(&self) -> std::time::Instant {
        into_std(tokio::time::Instant::now())
    }
}

// The one place the two runtimes' `Instant` types differ: madsim's `tokio::time::Instant` *is*
// `std::time::Instant` (on the simulated clock); tokio's wraps it.
#[cfg(madsim)]
fn from_std(at: std::time::Instant) -> tokio::time::Instant {
    at
}

#[cfg(madsim)]
fn into_std(at: tokio::time::Instant) -> std::time::Instant {
    at
}

#[cfg(not(madsim))]
fn from_std(at: std::time::Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(at)
}

#[cfg(not(madsim))]
fn into_std(at: tokio::time::Instant) -> std::time::Instant {
    at.into_std()
}

/// A stream whose `poll_flush` is a no-op when nothing was written since the last flush.
#[derive(Debug)]
pub struct FlushOnWrite<S> {
    inner: S,
    dirty: bool,
}

impl<S> FlushOnWrite<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, dirty: false }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FlushOnWrite<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FlushOnWrite<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.dirty = true;
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.dirty = true;
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.dirty {
            return Poll::Ready(Ok(()));
        }
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(result, Poll::Ready(Ok(()))) {
            self.dirty = false;
        }
        result
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Counts flushes that reach the inner stream.
    #[derive(Default)]
    struct CountingSink {
        written: Vec<u8>,
        flushes: usize,
    }

    impl AsyncWrite for CountingSink {
        fn poll_write(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.written.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn flush_reaches_the_stream_only_after_a_write() {
        let mut stream = FlushOnWrite::new(CountingSink::default());
        stream.flush().await.expect("flush");
        assert_eq!(stream.inner.flushes, 0, "nothing written: no flush");
        stream.write_all(b"abc").await.expect("write");
        stream.flush().await.expect("flush");
        stream.flush().await.expect("flush");
        assert_eq!(stream.inner.flushes, 1);
        stream.write_all(b"d").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!((stream.inner.flushes, stream.inner.written.as_slice()), (2, b"abcd".as_slice()));
    }

    #[tokio::test]
    async fn timer_sleeps_on_tokio_time() {
        use hyper::rt::Timer;
        let timer = TokioTimeTimer;
        let start = timer.now();
        timer.sleep(Duration::from_millis(20)).await;
        timer.sleep_until(timer.now() + Duration::from_millis(5)).await;
        assert!(timer.now().duration_since(start) >= Duration::from_millis(25));
    }
}
