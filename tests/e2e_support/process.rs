//! The real `coordinator` binary as a child process, and a raw HTTP/1 client to probe it.
//!
//! [`CoordinatorProcess`] owns one `coordinator serve` process: it picks a free port (retrying if
//! the port was taken before the process bound it), waits for `/readyz`, keeps the process's
//! stderr in a file for assertions and failure messages, sends SIGTERM with `kill -TERM <pid>`,
//! and SIGKILLs and reaps the process on drop. The admin token is always set, so admin routes are
//! exercised with authentication. [`http`] speaks HTTP/1.1 over a plain socket (one request per
//! connection), so malformed and oversized requests can be sent exactly as written; [`https`] does
//! the same over TLS, for a coordinator started with listener TLS ([`Listener`]).
//!
//! Every coordinator keeps accepting for [`SHUTDOWN_ACCEPT_MS_E2E`] after SIGTERM unless its
//! [`Listener`] arguments set `--shutdown-accept-ms` themselves.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use rsc::core::model::GroupId;
use rsc::core::protocol::ApiError;
use rsc::http::routes::{group_path, RouteId};
use rsc::http::tls::ClientTls;

/// The admin bearer token every coordinator of these tests is started with.
pub const ADMIN_TOKEN: &str = "e2e-admin-token-0123";
/// The shutdown accept window of these tests' coordinators (shorter than the 5 s default, so
/// SIGTERM stories stay quick).
pub const SHUTDOWN_ACCEPT_MS_E2E: u64 = 1_000;
/// How long a coordinator may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Attempts to find a free listen port.
const PORT_ATTEMPTS_MAX: usize = 5;
/// Deadline of one raw HTTP exchange.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `coordinator serve` with this URL serves from its embedded in-memory store (no `--redis-url`).
pub const EMBEDDED_STORE: &str = "";

/// The `redis_url` of a Redis Cluster in e2e tests: this prefix, then the seed URLs joined with
/// `,` ([`cluster_target`]); coordinators get `--redis-cluster-nodes`, fleets `connect_cluster`.
pub const CLUSTER_TARGET_PREFIX: &str = "cluster:";

/// The e2e `redis_url` naming a Redis Cluster by its seed nodes.
pub fn cluster_target(nodes: &[String]) -> String {
    format!("{CLUSTER_TARGET_PREFIX}{}", nodes.join(","))
}

/// The `coordinator` binary this build made, or the one `E2E_COORDINATOR_BIN` names (to run a
/// story against another build, e.g. an older commit's, for a before/after comparison).
fn binary() -> String {
    std::env::var("E2E_COORDINATOR_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_coordinator").to_string())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

fn fresh_dir() -> PathBuf {
    let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rsc-e2e-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the coordinator's temporary directory");
    dir
}

/// `--max-assignment-lease-ms` of every e2e coordinator: the e2e groups' lease
/// ([`super::fast_config`]), so correction rounds wait what they would in a deployment that
/// sets its ceiling to the lease it uses. Tests with longer leases set their own in the serve
/// config ([`LONG_LEASES_SERVE_CONFIG`]).
const E2E_LEASE_CEILING_MS: u64 = 1_500;

/// The serve config of a test whose group uses the default (8 s) lease.
pub const LONG_LEASES_SERVE_CONFIG: &str = "max_assignment_lease_ms = 8000\n";

/// `coordinator serve` arguments for `redis_url` on `port`: a fast tick and a short shutdown,
/// then `extra` (which may set its own `--shutdown-accept-ms`).
fn serve_command(binary: &str, redis_url: &str, name: &str, port: u16, log: &Path, extra: &[String]) -> Command {
    let mut command = Command::new(binary);
    command.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
    if let Some(nodes) = redis_url.strip_prefix(CLUSTER_TARGET_PREFIX) {
        command.args(["--redis-cluster-nodes", nodes]);
    } else if redis_url != EMBEDDED_STORE {
        command.args(["--redis-url", redis_url]);
    }
    command.args(["--instance-id", name, "--tick-interval-ms", "100", "--shutdown-timeout-ms", "5000"]);
    if !extra.iter().any(|arg| arg == "--shutdown-accept-ms") {
        command.args(["--shutdown-accept-ms", &SHUTDOWN_ACCEPT_MS_E2E.to_string()]);
    }
    command
        .args(extra)
        .env_remove("REDIS_URL")
        // The longest lease the e2e groups use; an environment variable, which the previous
        // release (mixed-version tests) ignores.
        .env("RSC_MAX_ASSIGNMENT_LEASE_MS", E2E_LEASE_CEILING_MS.to_string())
        .env("COORDINATOR_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("create the coordinator log"));
    command
}

/// How a `coordinator serve` that was expected to fail ended.
#[derive(Debug)]
pub struct FailedStart {
    pub status: ExitStatus,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `coordinator serve` against `redis_url` and waits (at most `timeout`) for it to exit.
/// Panics if it is still running then (it was expected to fail fast).
pub async fn serve_expecting_exit(redis_url: &str, timeout: Duration) -> FailedStart {
    serve_expecting_exit_with(redis_url, &[], timeout).await
}

/// [`serve_expecting_exit`] with `extra` serve arguments (e.g. `--redis-tls-ca-file <file>`).
pub async fn serve_expecting_exit_with(redis_url: &str, extra: &[String], timeout: Duration) -> FailedStart {
    let dir = fresh_dir();
    let log = dir.join("coordinator.log");
    let started = Instant::now();
    let mut child =
        serve_command(&binary(), redis_url, "e2e-doomed", free_port(), &log, extra).spawn().expect("spawn coordinator");
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_dir_all(&dir);
            panic!("coordinator serve did not exit within {timeout:?}; log:\n{stderr}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    FailedStart { status, stderr, elapsed: started.elapsed() }
}

/// How a coordinator's listener is started beyond the defaults: extra `serve` arguments (e.g.
/// `--shutdown-accept-ms`, `--metrics-member-labels`, `--tls-cert-file ...`) and, for a TLS
/// listener, the client TLS the harness probes it with.
#[derive(Clone, Debug, Default)]
pub struct Listener {
    pub args: Vec<String>,
    pub tls: Option<ClientTls>,
}

/// One running `coordinator serve` process. SIGKILLed and reaped on drop.
pub struct CoordinatorProcess {
    name: String,
    addr: SocketAddr,
    dir: PathBuf,
    /// Bumped by every restart; each incarnation logs to its own file.
    incarnation: u32,
    child: Option<Child>,
    exit: Option<ExitStatus>,
    listener: Listener,
    /// The `coordinator` executable it runs.
    binary: String,
}

impl CoordinatorProcess {
    /// Starts `coordinator serve` on `redis_url` and waits until `/readyz` answers 200.
    pub async fn start(redis_url: &str, name: &str) -> Self {
        Self::start_with_config(redis_url, name, "").await
    }

    /// [`Self::start`] with a `--config` TOML file holding `config_toml` (serve settings that have
    /// no flag, e.g. `concurrency_max`).
    pub async fn start_with_config(redis_url: &str, name: &str, config_toml: &str) -> Self {
        Self::start_with_listener(redis_url, name, config_toml, Listener::default()).await
    }

    /// [`Self::start_with_config`] with extra listener arguments (and TLS to probe it with).
    pub async fn start_with_listener(redis_url: &str, name: &str, config_toml: &str, listener: Listener) -> Self {
        Self::start_binary(&binary(), redis_url, name, config_toml, listener).await
    }

    /// [`Self::start_with_listener`] running `binary` (e.g. the previous release's coordinator).
    pub async fn start_binary(
        binary: &str,
        redis_url: &str,
        name: &str,
        config_toml: &str,
        listener: Listener,
    ) -> Self {
        let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
        let dir = fresh_dir();
        let (name, binary) = (name.to_string(), binary.to_string());
        let mut process = Self { name, addr, dir, incarnation: 0, child: None, exit: None, listener, binary };
        std::fs::write(process.dir.join("serve.toml"), config_toml).expect("write the serve config");
        for attempt in 1..=PORT_ATTEMPTS_MAX {
            process.addr.set_port(free_port());
            match process.launch(redis_url).await {
                Ok(()) => return process,
                Err(log) if log.contains("cannot listen") && attempt < PORT_ATTEMPTS_MAX => continue,
                Err(log) => panic!("coordinator {} did not become ready:\n{log}", process.name),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// Kills this process (SIGKILL, a crash) and starts a new incarnation on the same address,
    /// serving from `redis_url`; waits until it is ready.
    pub async fn restart(&mut self, redis_url: &str) {
        self.kill();
        self.incarnation += 1;
        for attempt in 1..=PORT_ATTEMPTS_MAX {
            match self.launch(redis_url).await {
                Ok(()) => return,
                // The old socket may linger for a moment.
                Err(log) if log.contains("cannot listen") && attempt < PORT_ATTEMPTS_MAX => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(log) => panic!("coordinator {} did not restart:\n{log}", self.name),
            }
        }
    }

    /// Spawns on `self.addr` and waits for `/readyz`. Err: the log, if it exited or never got ready.
    async fn launch(&mut self, redis_url: &str) -> Result<(), String> {
        let mut command =
            serve_command(&self.binary, redis_url, &self.name, self.addr.port(), &self.log_path(), &self.listener.args);
        let config = self.dir.join("serve.toml");
        if config.exists() {
            // A config file that sets the lease ceiling itself (a test with long leases) wins over
            // the e2e default, which would otherwise win as an environment variable.
            if std::fs::read_to_string(&config).is_ok_and(|text| text.contains("max_assignment_lease_ms")) {
                command.env_remove("RSC_MAX_ASSIGNMENT_LEASE_MS");
            }
            command.arg("--config").arg(config);
        }
        self.child = Some(command.spawn().expect("spawn coordinator serve"));
        self.exit = None;
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("exited with {status}:\n{}", self.log()));
            }
            if let Ok(answer) = self.request("GET", "/readyz", &[], Vec::new()).await {
                // Another process may have taken the port before ours bound it: ours then exits
                // with "cannot listen" (caught above) while the other one answers. Ours logs that
                // it serves before it answers anything.
                if answer.status == 200 && self.log().contains("coordinator serving") {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
        Err(format!("not ready within {READY_TIMEOUT:?}:\n{}", self.log()))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("coordinator-{}.log", self.incarnation))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id of the running incarnation.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the coordinator is running").id()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        let scheme = if self.listener.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// One request on a fresh connection: [`https`] with the listener's client TLS if it has one,
    /// else [`http`].
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> std::io::Result<HttpAnswer> {
        match &self.listener.tls {
            Some(tls) => https(tls, self.addr, method, path, headers, body).await,
            None => http(self.addr, method, path, headers, body).await,
        }
    }

    /// Everything the current incarnation wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Panics if the current incarnation logged anything at ERROR level (a refused invalid
    /// state, a server error answered to a client, ...) or panicked anywhere (see
    /// [`error_lines`]).
    pub fn assert_no_error_logged(&self) {
        let log = self.log();
        let errors = error_lines(&log);
        assert!(errors.is_empty(), "coordinator {} logged errors:\n{}", self.name, errors.join("\n"));
    }

    /// Sends SIGTERM (`kill -TERM <pid>`): the graceful shutdown path.
    pub fn sigterm(&self) {
        let pid = self.child.as_ref().expect("the coordinator is running").id();
        let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("run kill(1)");
        assert!(status.success(), "kill -TERM {pid} failed");
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit {
                return Some(status);
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.exit = Some(status);
                    self.child = None;
                    continue;
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            self.exit = child.wait().ok();
        }
    }

    /// `GET path` without authentication.
    pub async fn get(&self, path: &str) -> HttpAnswer {
        self.request("GET", path, &[], Vec::new())
            .await
            .unwrap_or_else(|e| panic!("GET {path} on {}: {e}\n{}", self.name, self.log()))
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        let answer = self.get("/metrics").await;
        assert_eq!(answer.status, 200, "/metrics");
        String::from_utf8(answer.body).expect("metrics are UTF-8")
    }

    /// `GET /v1/groups/{p}/{g}` with the admin token: the recorded metadata, revision, liveness.
    pub async fn describe(&self, group: &GroupId) -> Value {
        let answer = self.try_describe(group).await;
        assert_eq!(answer.status, 200, "describe: {}", String::from_utf8_lossy(&answer.body));
        answer.json()
    }

    /// [`Self::describe`]'s answer, whatever its status (503 while the store is failing over).
    pub async fn try_describe(&self, group: &GroupId) -> HttpAnswer {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let path = group_path(RouteId::Describe, group);
        self.request("GET", &path, &[("Authorization", &auth)], Vec::new())
            .await
            .unwrap_or_else(|e| panic!("describe on {}: {e}", self.name))
    }

    /// Runs `coordinator admin <args>` against this process (token from the environment) and
    /// returns its exit status, stdout and stderr.
    pub async fn admin(&self, args: &[&str]) -> (ExitStatus, String, String) {
        let mut command = Command::new(binary());
        command.arg("admin").args(["--url", &self.url()]).args(args).env("COORDINATOR_ADMIN_TOKEN", ADMIN_TOKEN);
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("admin task")
            .expect("run coordinator admin");
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).to_string();
        (output.status, text(output.stdout), text(output.stderr))
    }

    /// Creates `group` with `shards` shards and `config` through the admin CLI.
    pub async fn create_group(&self, group: &GroupId, shards: u32, config: &rsc::core::model::GroupConfig) {
        let config_json = serde_json::to_string(config).expect("config JSON");
        let shards = shards.to_string();
        let args = [
            "create-group",
            "--prefix",
            &group.stream_prefix,
            "--group",
            &group.consumer_group,
            "--shards",
            &shards,
            "--config-json",
            &config_json,
        ];
        let (status, stdout, stderr) = self.admin(&args).await;
        assert!(status.success(), "create-group failed ({status}): {stdout}{stderr}");
        let answer: Value = serde_json::from_str(&stdout).expect("create-group prints JSON");
        assert_eq!(answer["storeRevision"].as_u64(), Some(1), "{answer}");
    }
}

/// The lines of a coordinator log that [`CoordinatorProcess::assert_no_error_logged`] refuses:
/// an ERROR event, or a panic. A panic in a spawned task (a connection handler, the ticker) kills
/// only that task and the process carries on; the binary's panic hook logs it at ERROR, and the
/// default hook's `thread '...' panicked at` line is caught too, should the hook be missing.
pub fn error_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" ERROR ") || l.contains("panicked at")).collect()
}

/// [`error_lines`] refuses what it should, and only that.
pub fn self_check() {
    let clean = "2026-01-01T00:00:00Z  INFO rsc: coordinator serving\n2026-01-01T00:00:01Z  WARN rsc: slow";
    assert!(error_lines(clean).is_empty(), "{clean}");
    let error = "2026-01-01T00:00:00Z ERROR rsc::http: answered 500";
    assert_eq!(error_lines(error), vec![error]);
    let default_hook = "thread 'tokio-runtime-worker' panicked at src/http/serve.rs:71:5:\nboom";
    assert_eq!(error_lines(default_hook), vec!["thread 'tokio-runtime-worker' panicked at src/http/serve.rs:71:5:"]);
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One HTTP answer as received.
#[derive(Clone, Debug)]
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The body as an `ApiError` (panics otherwise: every error body must be one).
    pub fn error(&self) -> ApiError {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not an ApiError ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends one request on a fresh connection (`Connection: close`) exactly as given and reads the
/// answer. The body is written from a separate task, so an answer sent before the server read the
/// whole body (413) is still received; write errors after that are ignored.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> std::io::Result<HttpAnswer> {
    let stream = connect(addr).await?;
    exchange(stream, addr, method, path, headers, body).await
}

/// [`http`] over TLS: the handshake with `tls` (the library's client TLS), then the same exchange.
/// Any failure — handshake, a server refusing the client's certificate (under TLS 1.3 seen only at
/// the first read), no answer — is an `Err`.
pub async fn https(
    tls: &ClientTls,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> std::io::Result<HttpAnswer> {
    let stream = connect(addr).await?;
    let stream = tokio::time::timeout(HTTP_TIMEOUT, tls.connect(addr, stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    exchange(stream, addr, method, path, headers, body).await
}

async fn connect(addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    tokio::time::timeout(HTTP_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

/// One request written exactly as given on `stream`, and its answer.
async fn exchange<S>(
    stream: S,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> std::io::Result<HttpAnswer>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let write = tokio::spawn(async move {
        let _ = writer.write_all(head.as_bytes()).await;
        let _ = writer.write_all(&body).await;
        // Keep the write half open until the answer is read: closing it early could end the
        // exchange before the server answers.
        writer
    });
    let mut received = Vec::new();
    let read = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
                // A reset after the answer arrived (the server closed with unread body bytes).
                Err(error) if !received.is_empty() => {
                    let _ = error;
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    };
    tokio::time::timeout(HTTP_TIMEOUT, read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))??;
    write.abort();
    parse_answer(&received)
}

/// Parses one complete HTTP/1 answer (head and, by `Content-Length`, body).
pub fn parse_answer(bytes: &[u8]) -> std::io::Result<HttpAnswer> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| bad("no complete answer head"))?;
    let head = std::str::from_utf8(&bytes[..end]).map_err(|_| bad("answer head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.trim().to_string(), v.trim().to_string())).collect();
    let mut body = bytes[end + 4..].to_vec();
    let length = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.parse());
    if let Some(Ok(length)) = length {
        if body.len() < length {
            return Err(bad("answer body is shorter than its Content-Length"));
        }
        body.truncate(length);
    }
    Ok(HttpAnswer { status, headers, body })
}
