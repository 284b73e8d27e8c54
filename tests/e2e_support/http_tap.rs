//! [`HttpTap`]: a TCP proxy in front of one coordinator that forwards bytes unchanged and, on the
//! side, parses the HTTP/1 exchanges passing through and records every answer (request line,
//! status, body, time). It is the wire-level ground truth of what clients were told, including
//! answers that the clients' failover then hid (a 503 retried against the other coordinator).
//!
//! When the coordinator behind it is gone, a new connection is accepted and closed at once (the
//! client sees a closed connection, as it would see a refused one without the tap). Plain std
//! threads; dropping the tap closes every connection and stops accepting.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// One answer seen on the wire.
#[derive(Clone, Debug)]
pub struct TapAnswer {
    pub at: Instant,
    /// `METHOD /path` of the request it answered.
    pub request: String,
    pub status: u16,
    pub body: Vec<u8>,
}

impl TapAnswer {
    /// The `code` of an `ApiError` body, if the body is one.
    pub fn error_code(&self) -> Option<String> {
        let value: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        value.get("code")?.as_str().map(str::to_owned)
    }
}

struct Shared {
    target: SocketAddr,
    stopping: AtomicBool,
    answers: Mutex<Vec<TapAnswer>>,
    parse_errors: Mutex<Vec<String>>,
    sockets: Mutex<Vec<TcpStream>>,
}

pub struct HttpTap {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl HttpTap {
    /// Listens on a free 127.0.0.1 port and forwards to `target`.
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the tap");
        let addr = listener.local_addr().expect("tap addr");
        let shared = Arc::new(Shared {
            target,
            stopping: AtomicBool::new(false),
            answers: Mutex::new(Vec::new()),
            parse_errors: Mutex::new(Vec::new()),
            sockets: Mutex::new(Vec::new()),
        });
        let accept_shared = shared.clone();
        let acceptor = std::thread::spawn(move || accept_loop(listener, accept_shared));
        Self { addr, shared, acceptor: Some(acceptor) }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every answer recorded so far.
    pub fn answers(&self) -> Vec<TapAnswer> {
        self.shared.answers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Exchanges the tap could not parse (must stay empty: the count of answers is then exact).
    pub fn parse_errors(&self) -> Vec<String> {
        self.shared.parse_errors.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for HttpTap {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for socket in self.shared.sockets.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(self.addr); // Wakes the acceptor so it sees `stopping`.
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
        let Ok(upstream) = TcpStream::connect(shared.target) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let clones = (client.try_clone(), upstream.try_clone(), client.try_clone(), upstream.try_clone());
        let (Ok(c1), Ok(u1), Ok(c2), Ok(u2)) = clones else { continue };
        shared.sockets.lock().unwrap_or_else(|p| p.into_inner()).extend([client, upstream]);
        let requests = Arc::new(Mutex::new(VecDeque::new()));
        let (s1, s2, r1, r2) = (shared.clone(), shared.clone(), requests.clone(), requests);
        std::thread::spawn(move || forward(c1, u1, s1, r1, Direction::Request));
        std::thread::spawn(move || forward(u2, c2, s2, r2, Direction::Answer));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Answer,
}

/// Copies `from` -> `to` until EOF or an error, parsing the messages on the way.
fn forward(
    mut from: TcpStream,
    mut to: TcpStream,
    shared: Arc<Shared>,
    requests: Arc<Mutex<VecDeque<String>>>,
    direction: Direction,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut splitter = Splitter::default();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // A request is recorded before it is forwarded, so its answer always finds it queued.
        if direction == Direction::Answer && to.write_all(&buf[..n]).is_err() {
            break;
        }
        match splitter.push(&buf[..n]) {
            Ok(messages) => {
                for (start_line, body) in messages {
                    record(&shared, &requests, direction, start_line, body);
                }
            }
            Err(error) => {
                shared.parse_errors.lock().unwrap_or_else(|p| p.into_inner()).push(error);
            }
        }
        if direction == Direction::Request && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

fn record(
    shared: &Shared,
    requests: &Mutex<VecDeque<String>>,
    direction: Direction,
    start_line: String,
    body: Vec<u8>,
) {
    let mut requests = requests.lock().unwrap_or_else(|p| p.into_inner());
    match direction {
        Direction::Request => {
            let request = start_line.rsplit_once(' ').map_or(start_line.as_str(), |(r, _)| r).to_string();
            requests.push_back(request);
        }
        Direction::Answer => {
            let request = requests.pop_front().unwrap_or_else(|| "<unknown request>".into());
            let status = start_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            let answer = TapAnswer { at: Instant::now(), request, status, body };
            shared.answers.lock().unwrap_or_else(|p| p.into_inner()).push(answer);
        }
    }
}

/// Splits a byte stream into HTTP/1 messages (start line + body), framed by `Content-Length` or
/// chunked transfer encoding. After an error it stays broken and ignores the rest.
#[derive(Default)]
struct Splitter {
    buf: Vec<u8>,
    broken: bool,
}

impl Splitter {
    fn push(&mut self, data: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
        if self.broken {
            return Ok(Vec::new());
        }
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            match parse_message(&self.buf) {
                Ok(Some((consumed, start_line, body))) => {
                    self.buf.drain(..consumed);
                    out.push((start_line, body));
                }
                Ok(None) => return Ok(out),
                Err(error) => {
                    self.broken = true;
                    return Err(error);
                }
            }
        }
    }
}

/// `Ok(Some((bytes consumed, start line, body)))` for a complete message at the start of `buf`,
/// `Ok(None)` when more bytes are needed.
fn parse_message(buf: &[u8]) -> Result<Option<(usize, String, Vec<u8>)>, String> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else { return Ok(None) };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| "head is not UTF-8".to_string())?;
    let mut lines = head.split("\r\n");
    let start_line = lines.next().unwrap_or_default().to_string();
    let mut length = 0usize;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().map_err(|_| format!("bad Content-Length {value:?}"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
    }
    let body_start = head_end + 4;
    if !chunked {
        if buf.len() < body_start + length {
            return Ok(None);
        }
        return Ok(Some((body_start + length, start_line, buf[body_start..body_start + length].to_vec())));
    }
    let mut at = body_start;
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(&buf[at..], b"\r\n") else { return Ok(None) };
        let size_text = std::str::from_utf8(&buf[at..at + line_end]).map_err(|_| "bad chunk size".to_string())?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| format!("bad chunk size {size_text:?}"))?;
        at += line_end + 2;
        if size == 0 {
            // No trailers: the final chunk is followed by an empty line.
            if buf.len() < at + 2 {
                return Ok(None);
            }
            return Ok(Some((at + 2, start_line, body)));
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A self-check of the parser on fixed-length, chunked and split messages.
pub fn self_check() {
    let mut splitter = Splitter::default();
    let first = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 5\r\n\r\nhel";
    assert!(splitter.push(first).expect("parses").is_empty(), "incomplete body");
    let rest = b"loHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let messages = splitter.push(rest).expect("parses");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0], ("HTTP/1.1 503 Service Unavailable".to_string(), b"hello".to_vec()));
    assert_eq!(messages[1].1, b"abc".to_vec());
}
