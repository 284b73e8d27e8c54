//! [`Spreader`]: the load balancer of a rolling update. A TCP proxy with one address for the
//! clients that sends each new connection to the next backend of a list the test changes while it
//! runs (round robin), so the clients' requests are spread over every coordinator in the list.
//!
//! Clients that open one connection per request (`idle_per_address_max: 0`) have every request
//! spread; pooled connections stay with their backend until [`Spreader::set_backends`] cuts them.
//! Plain std threads; dropping it cuts every connection and stops accepting.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

struct Shared {
    backends: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
    stopping: AtomicBool,
    /// The open connections (client side, backend side) by number; a connection removes itself
    /// when it ends.
    sockets: Mutex<BTreeMap<u64, [TcpStream; 2]>>,
    connections: AtomicU64,
}

pub struct Spreader {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Spreader {
    /// Listens on a free 127.0.0.1 port and spreads connections over `backends`.
    pub fn start(backends: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the spreader");
        let addr = listener.local_addr().expect("spreader addr");
        let shared = Arc::new(Shared {
            backends: Mutex::new(backends),
            next: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            sockets: Mutex::new(BTreeMap::new()),
            connections: AtomicU64::new(0),
        });
        let accept_shared = shared.clone();
        let acceptor = std::thread::spawn(move || accept_loop(listener, accept_shared));
        Self { addr, shared, acceptor: Some(acceptor) }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// New connections go to `backends` (round robin) from now on; open connections are cut, so
    /// a pooled client reconnects through the new list (its request in flight fails and is
    /// retried on a fresh connection).
    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        assert!(!backends.is_empty(), "a spreader needs a backend");
        *self.shared.backends.lock().unwrap_or_else(|p| p.into_inner()) = backends;
        self.shared.cut();
    }
}

impl Drop for Spreader {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.cut();
        let _ = TcpStream::connect(self.addr); // Wakes the acceptor so it sees `stopping`.
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

impl Shared {
    fn cut(&self) {
        let sockets = std::mem::take(&mut *self.sockets.lock().unwrap_or_else(|p| p.into_inner()));
        for socket in sockets.values().flatten() {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let target = {
            let backends = shared.backends.lock().unwrap_or_else(|p| p.into_inner());
            backends[shared.next.fetch_add(1, Ordering::Relaxed) % backends.len()]
        };
        let Ok(upstream) = TcpStream::connect(target) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let clones = (client.try_clone(), upstream.try_clone(), client.try_clone(), upstream.try_clone());
        let (Ok(c1), Ok(u1), Ok(c2), Ok(u2)) = clones else { continue };
        let id = shared.connections.fetch_add(1, Ordering::Relaxed);
        shared.sockets.lock().unwrap_or_else(|p| p.into_inner()).insert(id, [client, upstream]);
        let (s1, s2) = (shared.clone(), shared.clone());
        std::thread::spawn(move || forward(c1, u1, &s1, id));
        std::thread::spawn(move || forward(u2, c2, &s2, id));
    }
}

/// Copies `from` -> `to` until EOF or an error, then closes both and forgets connection `id`.
fn forward(mut from: TcpStream, mut to: TcpStream, shared: &Shared, id: u64) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
    shared.sockets.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
}
