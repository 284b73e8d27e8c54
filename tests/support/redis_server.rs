//! One `redis-server` child process per handle, for integration tests.
//!
//! Owns the process, its port and its temporary directory; kills the process (SIGKILL) and removes
//! the directory on drop. Never binds anything but 127.0.0.1 and never touches a server it did
//! not start. Admin commands go through the `redis` crate's synchronous client, a fresh
//! connection per call, so they work across restarts.
//!
//! With [`ServerConfig::tls`] the server listens only on a TLS port (`--port 0 --tls-port <port>`)
//! with certificates generated into its directory (`support::tls`); admin commands then use TLS
//! with the generated CA and client certificate, and [`RedisServer::url`] is `rediss://`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::proxy::TcpProxy;
use super::tls::TlsFiles;

/// How long a server may take to answer PING after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts to find a free port when the one picked was taken in the meantime.
const PORT_ATTEMPTS_MAX: usize = 8;

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// How a server is started. `Default`: no persistence, no extra arguments, a primary.
#[derive(Clone, Debug, Default)]
pub struct ServerConfig {
    /// AOF on with `appendfsync always` (every acknowledged write survives SIGKILL + restart).
    pub persistence: bool,
    /// Extra `--option value` arguments, e.g. `["--rename-command", "XAUTOCLAIM", ""]`.
    pub extra_args: Vec<String>,
    /// Start as a replica of 127.0.0.1:<port>.
    pub replica_of: Option<u16>,
    /// TLS only (no plain port), with `tls-auth-clients` set to this.
    pub tls: Option<TlsClientAuth>,
    /// With [`Self::tls`]: these certificates instead of a CA of its own (the nodes of one
    /// cluster must trust each other). The caller owns and removes their files.
    pub tls_files: Option<TlsFiles>,
}

/// `tls-auth-clients`: whether a TLS server asks clients for a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsClientAuth {
    /// One-way TLS: no client certificate asked for.
    No,
    /// A client certificate is checked if presented.
    Optional,
    /// Mutual TLS: a client without a certificate signed by the CA is refused.
    Yes,
}

/// A running (or deliberately stopped) `redis-server`.
pub struct RedisServer {
    binary: PathBuf,
    port: u16,
    dir: PathBuf,
    config: ServerConfig,
    tls: Option<TlsFiles>,
    child: Option<Child>,
}

pub(super) fn binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// `(major, minor)` of the redis-server binary, read once per test process.
pub fn server_version() -> (u32, u32) {
    static VERSION: OnceLock<(u32, u32)> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let bin = binary();
        let output = Command::new(&bin).arg("--version").output().unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}. These tests need a real redis-server >= 6.2 \
                 (apt-get install redis-server; CI installs it) or REDIS_SERVER_BIN=/path/to/redis-server",
                bin.display()
            )
        });
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let version = text.split_whitespace().find_map(|w| w.strip_prefix("v=")).unwrap_or("");
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let parsed = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        assert!(parsed >= (6, 2), "redis-server {version:?} is too old: these tests need >= 6.2 (XAUTOCLAIM)");
        parsed
    })
}

pub(super) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port on 127.0.0.1");
    listener.local_addr().expect("local addr").port()
}

pub(super) fn fresh_dir() -> PathBuf {
    let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rsc-redis-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the server's temporary directory");
    dir
}

/// The `process_id` field of an `INFO server` answer (a server's or a sentinel's).
pub(super) fn process_id(info: redis::RedisResult<redis::Value>) -> Option<u32> {
    let info: String = redis::from_redis_value(info.ok()?).ok()?;
    info.lines().find_map(|l| l.strip_prefix("process_id:")?.trim().parse().ok())
}

/// One raw RESP PING; true on `+PONG` (false while loading, refusing, or not yet listening).
pub(super) fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 16];
    matches!(stream.read(&mut reply), Ok(n) if reply[..n].starts_with(b"+PONG"))
}

impl RedisServer {
    /// A primary without persistence on a free port.
    pub fn start() -> Self {
        Self::start_with(ServerConfig::default())
    }

    /// A server with `config` on a free port (retrying if the port is taken before it binds).
    pub fn start_with(config: ServerConfig) -> Self {
        server_version();
        let mut server = Self::unstarted(config, 0);
        for attempt in 1..=PORT_ATTEMPTS_MAX {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(log) if log.contains("Address already in use") && attempt < PORT_ATTEMPTS_MAX => continue,
                Err(log) => panic!("redis-server did not start on port {}:\n{log}", server.port),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// One attempt to start a server with `config` on exactly `port`; Err carries why not (the
    /// harness's own test uses it to show a port another server answers is refused).
    pub fn try_start_on(config: ServerConfig, port: u16) -> Result<Self, String> {
        let mut server = Self::unstarted(config, port);
        server.spawn_and_wait().map(|()| server)
    }

    /// A server not yet spawned: its own directory, and TLS files when `config` asks for TLS.
    fn unstarted(config: ServerConfig, port: u16) -> Self {
        let dir = fresh_dir();
        let tls =
            config.tls.map(|_| config.tls_files.clone().unwrap_or_else(|| super::tls::generate(&dir.join("tls"))));
        RedisServer { binary: binary(), port, dir, config, tls, child: None }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = match (&self.tls, self.config.tls) {
            (Some(files), Some(auth)) => {
                let auth = match auth {
                    TlsClientAuth::No => "no",
                    TlsClientAuth::Optional => "optional",
                    TlsClientAuth::Yes => "yes",
                };
                let path = |p: &Path| p.display().to_string();
                vec![
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    self.port.to_string(),
                    "--tls-cert-file".into(),
                    path(&files.server_cert),
                    "--tls-key-file".into(),
                    path(&files.server_key),
                    "--tls-ca-cert-file".into(),
                    path(&files.ca_cert),
                    "--tls-auth-clients".into(),
                    auth.into(),
                ]
            }
            _ => vec!["--port".into(), self.port.to_string()],
        };
        args.extend([
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            self.log_path().display().to_string(),
            "--daemonize".into(),
            "no".into(),
            "--save".into(),
            String::new(),
            // A replica's full sync starts at once instead of after the default 5 s wait for
            // more replicas to join the same diskless transfer.
            "--repl-diskless-sync-delay".into(),
            "0".into(),
        ]);
        if self.config.persistence {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        } else {
            args.extend(["--appendonly", "no"].map(String::from));
        }
        if server_version() >= (7, 0) {
            // DEBUG (e.g. DEBUG SLEEP) is refused by default since 7.0.
            args.extend(["--enable-debug-command", "local"].map(String::from));
        }
        if let Some(primary) = self.config.replica_of {
            args.extend(["--replicaof".to_string(), "127.0.0.1".to_string(), primary.to_string()]);
        }
        args.extend(self.config.extra_args.iter().cloned());
        args
    }

    /// Spawns the process on `self.port` and waits for PING. Err: the log, if it exited or hung.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let _ = std::fs::remove_file(self.log_path());
        let child = Command::new(&self.binary)
            .args(self.args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}. These tests need a real redis-server >= 6.2 \
                     (apt-get install redis-server; CI installs it) or REDIS_SERVER_BIN",
                    self.binary.display()
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            let ready = match self.tls {
                Some(_) => matches!(self.try_cmd(&["PING"]), Ok(redis::Value::SimpleString(ref s)) if s == "PONG"),
                None => answers_ping(self.port),
            };
            if ready {
                // A port picked by `free_port` can be taken by another test process's server
                // before ours binds it: then ours exits with "Address already in use" while the
                // other one answers the PING. Only our own process counts as started.
                return match self.answering_pid() {
                    Some(pid) if pid == self.pid() => Ok(()),
                    other => {
                        self.kill();
                        Err(format!("Address already in use: port {} is answered by pid {other:?}", self.port))
                    }
                };
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}\n{}", self.log_tail()));
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(format!("no PONG within {READY_TIMEOUT:?}\n{}", self.log_tail()))
    }

    /// The last lines of the server log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `redis://127.0.0.1:<port>` (default user); `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.port)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// The generated CA, server and client certificates of a TLS server.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// A client for admin commands: plain, or TLS trusting the generated CA and presenting the
    /// generated client certificate.
    pub fn admin_client(&self) -> redis::RedisResult<redis::Client> {
        let Some(files) = &self.tls else { return redis::Client::open(self.url()) };
        let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        let certificates = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&files.client_cert),
                client_key: read(&files.client_key),
            }),
            root_cert: Some(read(&files.ca_cert)),
        };
        redis::Client::build_with_tls(self.url(), certificates)
    }

    /// True while the process runs (also while frozen).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is not running").id()
    }

    /// Runs one command as the default user; Err carries the server's or the transport's error.
    pub fn try_cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = self.admin_client()?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn)
    }

    /// Runs one command as the default user; panics on any error.
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        self.try_cmd(args).unwrap_or_else(|e| panic!("{args:?} on port {} failed: {e}", self.port))
    }

    /// `process_id` of whatever answers on this server's port, if anything does.
    fn answering_pid(&self) -> Option<u32> {
        process_id(self.try_cmd(&["INFO", "server"]))
    }

    /// A field of `INFO <section>`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info: String = redis::from_redis_value(self.cmd(&["INFO", section])).expect("INFO is text");
        info.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(|v| v.trim().to_string()))
    }

    pub fn run_id(&self) -> String {
        self.info_field("server", "run_id").expect("INFO server has run_id")
    }

    pub fn replication_id(&self) -> String {
        self.info_field("replication", "master_replid").expect("INFO replication has master_replid")
    }

    /// SIGKILL and reap: a crash. Data not yet persisted is lost (with `persistence`, none is).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Graceful stop: SHUTDOWN (which writes the AOF out), then reap.
    pub fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = self.try_cmd(&["SHUTDOWN"]); // The connection drops as the server exits.
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the process again on the same port, directory and configuration (a new `run_id`).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "start_again: the server is still running; kill() or shutdown() it first");
        if let Err(log) = self.spawn_and_wait() {
            panic!("redis-server did not restart on port {}:\n{log}", self.port);
        }
    }

    /// `shutdown()` + `start_again()`.
    pub fn restart(&mut self) {
        self.shutdown();
        self.start_again();
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.pid().to_string()]).status().expect("run kill(1)");
        assert!(status.success(), "kill {signal} failed");
    }

    /// SIGSTOP: the server keeps its sockets (connects are accepted by the kernel) but never
    /// answers — the "hung server" case that only a client-side deadline can handle.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after `freeze()`.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// A replica of this server, started and fully synced.
    pub fn start_replica(&self) -> RedisServer {
        let replica = RedisServer::start_with(ServerConfig { replica_of: Some(self.port), ..ServerConfig::default() });
        replica.wait_link_up();
        replica
    }

    /// A replica whose replication link runs through a [`TcpProxy`], so the test can pause the
    /// stream of writes (`link.pause()`) and then promote the replica without them.
    pub fn start_replica_via_proxy(&self) -> (RedisServer, TcpProxy) {
        let link = TcpProxy::start(self.port);
        let replica =
            RedisServer::start_with(ServerConfig { replica_of: Some(link.port()), ..ServerConfig::default() });
        replica.wait_link_up();
        (replica, link)
    }

    /// Waits until this replica reports `master_link_status:up` (initial sync done).
    pub fn wait_link_up(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            // A connection the server resets while it reconfigures replication (a Sentinel
            // failover) is "not yet", not a failure of the test.
            let info: Option<String> =
                self.try_cmd(&["INFO", "replication"]).ok().and_then(|v| redis::from_redis_value(v).ok());
            let up = info.is_some_and(|info| info.lines().any(|l| l.trim() == "master_link_status:up"));
            if up {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("replica on port {} never synced:\n{}", self.port, self.log_tail());
    }

    /// On a primary: blocks until `replicas` replicas acknowledged every write so far (WAIT).
    ///
    /// WAIT only waits for the writes of its own connection, and each admin command uses a fresh
    /// one, so a write that creates nothing (a key set and deleted in one MULTI, never visible to
    /// other clients) is made first on the same connection: once the replicas acknowledged it,
    /// they hold every earlier write too.
    pub fn wait_replicated(&self, replicas: u64) {
        let client = self.admin_client().expect("admin client");
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2)).expect("connect for WAIT");
        conn.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
        let marker = "rsc-test:wait-replicated-marker";
        redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(marker)
            .arg("1")
            .ignore()
            .cmd("DEL")
            .arg(marker)
            .ignore()
            .query::<()>(&mut conn)
            .expect("marker write");
        let acked: u64 = redis::cmd("WAIT").arg(replicas).arg(5_000).query(&mut conn).expect("WAIT");
        assert!(acked >= replicas, "only {acked} of {replicas} replicas acknowledged within 5 s");
    }

    /// On a replica: `REPLICAOF NO ONE` — it becomes a primary with a new replication id.
    pub fn promote(&self) {
        self.cmd(&["REPLICAOF", "NO", "ONE"]);
    }

    /// Creates a user with every command except FLUSHDB and FLUSHALL (the seed's least-privilege
    /// advice) and returns its URL.
    pub fn create_acl_user(&self, name: &str, password: &str) -> String {
        let secret = format!(">{password}");
        self.cmd(&["ACL", "SETUSER", name, "reset", "on", &secret, "~*", "&*", "+@all", "-flushdb", "-flushall"]);
        format!("{}://{name}:{password}@127.0.0.1:{}", self.scheme(), self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
