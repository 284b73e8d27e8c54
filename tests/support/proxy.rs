//! A TCP proxy on 127.0.0.1 for integration tests: forwards every accepted connection to a target
//! port, and can pause forwarding, cut every connection, switch targets, or hold each new
//! connection for a while before it reaches the target (a slow connect: TLS, a far server).
//!
//! Used for the replication link (pause it, then promote the replica: the writes made during the
//! pause are acknowledged by the primary and never reach the new primary) and for clients that
//! must follow a failover while keeping one address. Owns its threads and sockets; dropping it
//! cuts every connection and stops accepting. Plain std threads: test harness only, never code
//! that runs under the simulation.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Pause state shared by the forwarders. `epoch` changes on `cut()`, which ends every forwarder
/// that was started before it (also one parked by a pause).
struct Gate {
    paused: bool,
    epoch: u64,
}

struct Shared {
    target: AtomicU16,
    /// How long each new connection waits before the proxy connects it to the target.
    connect_delay_ms: AtomicU64,
    stopping: AtomicBool,
    gate: Mutex<Gate>,
    wake: Condvar,
    sockets: Mutex<Vec<TcpStream>>,
}

pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpProxy {
    /// Listens on a free port and forwards to 127.0.0.1:`target`.
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let shared = Arc::new(Shared {
            target: AtomicU16::new(target),
            connect_delay_ms: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            gate: Mutex::new(Gate { paused: false, epoch: 0 }),
            wake: Condvar::new(),
            sockets: Mutex::new(Vec::new()),
        });
        let accept_shared = shared.clone();
        let acceptor = std::thread::spawn(move || accept_loop(listener, accept_shared));
        TcpProxy { port, shared, acceptor: Some(acceptor) }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// New connections go to `target` from now on (existing ones stay until `cut()`).
    pub fn set_target(&self, target: u16) {
        self.shared.target.store(target, Ordering::SeqCst);
    }

    /// Every connection accepted from now on waits `ms` before it is connected to the target
    /// (nothing it sends is forwarded meanwhile).
    pub fn set_connect_delay_ms(&self, ms: u64) {
        self.shared.connect_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Stops forwarding in both directions. When this returns, no byte read afterwards is
    /// delivered until `resume()`; bytes held by a pause are dropped by `cut()`.
    pub fn pause(&self) {
        self.shared.gate.lock().expect("gate").paused = true;
    }

    /// Resumes forwarding after `pause()`; held bytes are delivered in order.
    pub fn resume(&self) {
        self.shared.gate.lock().expect("gate").paused = false;
        self.shared.wake.notify_all();
    }

    /// Closes every proxied connection (both sides see a reset/EOF) and drops held bytes.
    pub fn cut(&self) {
        // Sockets first: that fails a forwarder blocked in a write while holding the gate.
        for socket in self.shared.sockets.lock().expect("sockets").drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        self.shared.gate.lock().expect("gate").epoch += 1;
        self.shared.wake.notify_all();
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.cut();
        // Wake the acceptor so it sees `stopping`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let delay_ms = shared.connect_delay_ms.load(Ordering::SeqCst);
        if delay_ms == 0 {
            connect_through(client, &shared);
        } else {
            let shared = shared.clone();
            let accepted_in = shared.gate.lock().expect("gate").epoch;
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(delay_ms));
                // A `cut()` while it waited closes it too.
                if shared.gate.lock().expect("gate").epoch != accepted_in {
                    let _ = client.shutdown(Shutdown::Both);
                    return;
                }
                connect_through(client, &shared);
            });
        }
    }
}

/// Connects `client` to the target and starts forwarding both ways.
fn connect_through(client: TcpStream, shared: &Arc<Shared>) {
    let target = shared.target.load(Ordering::SeqCst);
    let Ok(upstream) = TcpStream::connect(("127.0.0.1", target)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let epoch = shared.gate.lock().expect("gate").epoch;
    let clones = (client.try_clone(), upstream.try_clone(), client.try_clone(), upstream.try_clone());
    let (Ok(c1), Ok(u1), Ok(c2), Ok(u2)) = clones else { return };
    shared.sockets.lock().expect("sockets").extend([client, upstream]);
    let (s1, s2) = (shared.clone(), shared.clone());
    std::thread::spawn(move || forward(c1, u1, s1, epoch));
    std::thread::spawn(move || forward(u2, c2, s2, epoch));
}

/// Copies `from` -> `to` until EOF, an error, or a `cut()`; waits while paused.
fn forward(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>, epoch: u64) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // The gate is held while writing, so `pause()` returning means no write is in flight.
        let gate = shared.gate.lock().expect("gate");
        let gate = shared.wake.wait_while(gate, |g| g.paused && g.epoch == epoch).expect("gate");
        if gate.epoch != epoch || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
