//! One `redis-server --sentinel` child process per handle, for integration tests of failover.
//!
//! Owns the process, its port, its temporary directory and its config file (Sentinel rewrites
//! that file, so it must be writable); kills the process (SIGKILL) and removes the directory on
//! drop. Never binds anything but 127.0.0.1 and never touches a server it did not start.
//!
//! Recipe (quorum 1, so one sentinel fails over alone): `let sentinel = SentinelServer::start(
//! &primary, SentinelConfig::default())`, `sentinel.wait_replicas(1)`, then `primary.kill()` and
//! `sentinel.wait_master_port(replica.port(), ...)`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::{binary, free_port, fresh_dir, process_id, RedisServer};
use super::tls::TlsFiles;

/// How long a sentinel may take to answer PING after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts to find a free port when the one picked was taken in the meantime.
const PORT_ATTEMPTS_MAX: usize = 8;

/// How a sentinel monitors its primary.
#[derive(Clone, Debug)]
pub struct SentinelConfig {
    /// The monitored master name.
    pub master_name: String,
    /// `down-after-milliseconds`: how long the primary may be silent before it is down.
    pub down_after_ms: u64,
    /// `failover-timeout`.
    pub failover_timeout_ms: u64,
    /// `requirepass` of the sentinel itself.
    pub password: Option<String>,
    /// TLS only (no plain port) with these files (the monitored servers' own, so each side trusts
    /// the other), and `tls-replication yes`: it speaks TLS to the servers it monitors too.
    pub tls: Option<TlsFiles>,
}

impl Default for SentinelConfig {
    fn default() -> Self {
        Self {
            master_name: "mymaster".into(),
            down_after_ms: 1_000,
            failover_timeout_ms: 5_000,
            password: None,
            tls: None,
        }
    }
}

/// A running `redis-server --sentinel` monitoring one primary with quorum 1.
pub struct SentinelServer {
    port: u16,
    dir: PathBuf,
    config: SentinelConfig,
    child: Option<Child>,
}

impl SentinelServer {
    /// A sentinel on a free port monitoring `primary` (quorum 1), answering PING and naming the
    /// primary as master before this returns.
    pub fn start(primary: &RedisServer, config: SentinelConfig) -> Self {
        let dir = fresh_dir();
        let mut sentinel = SentinelServer { port: 0, dir, config, child: None };
        for attempt in 1..=PORT_ATTEMPTS_MAX {
            sentinel.port = free_port();
            match sentinel.spawn_and_wait(primary.port()) {
                Ok(()) => {
                    sentinel.wait_master_port(primary.port(), READY_TIMEOUT);
                    return sentinel;
                }
                Err(log) if log.contains("Address already in use") && attempt < PORT_ATTEMPTS_MAX => continue,
                Err(log) => panic!("sentinel did not start on port {}:\n{log}", sentinel.port),
            }
        }
        unreachable!("the loop returns or panics")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("sentinel.log")
    }

    fn write_config(&self, primary_port: u16) -> PathBuf {
        let c = &self.config;
        let name = &c.master_name;
        let listen = match &c.tls {
            None => format!("port {}\n", self.port),
            Some(files) => format!(
                "port 0\ntls-port {}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                 tls-auth-clients no\ntls-replication yes\n",
                self.port,
                files.server_cert.display(),
                files.server_key.display(),
                files.ca_cert.display()
            ),
        };
        let mut text = format!(
            "{listen}bind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {name} 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} {failover}\n\
             sentinel parallel-syncs {name} 1\n",
            dir = self.dir.display(),
            log = self.log_path().display(),
            down = c.down_after_ms,
            failover = c.failover_timeout_ms,
        );
        if let Some(password) = &c.password {
            text.push_str(&format!("requirepass {password}\n"));
        }
        let path = self.dir.join("sentinel.conf");
        std::fs::write(&path, text).expect("write the sentinel config file");
        path
    }

    fn spawn_and_wait(&mut self, primary_port: u16) -> Result<(), String> {
        let _ = std::fs::remove_file(self.log_path());
        let conf = self.write_config(primary_port);
        let child = Command::new(binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server --sentinel: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if self.try_cmd(&["PING"]).is_ok() {
                // Another process may have taken the port before ours bound it (then ours exits
                // with "Address already in use"): only our own process counts as started.
                let pid = process_id(self.try_cmd(&["INFO", "server"]));
                if pid.is_some() && pid == self.child.as_ref().map(Child::id) {
                    return Ok(());
                }
                self.kill();
                return Err(format!("Address already in use: port {} is answered by pid {pid:?}", self.port));
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}\n{}", self.log_tail()));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(format!("no PONG within {READY_TIMEOUT:?}\n{}", self.log_tail()))
    }

    /// The last lines of the sentinel log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, the form `RedisSentinelOptions::sentinels` takes.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs one command on the sentinel (authenticated when it has a password).
    pub fn try_cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let userinfo = self.config.password.as_ref().map(|p| format!(":{p}@")).unwrap_or_default();
        let client = match &self.config.tls {
            None => redis::Client::open(format!("redis://{userinfo}127.0.0.1:{}", self.port))?,
            Some(files) => {
                let ca = std::fs::read(&files.ca_cert).unwrap_or_else(|e| panic!("read the CA: {e}"));
                let certificates = redis::TlsCertificates { client_tls: None, root_cert: Some(ca) };
                redis::Client::build_with_tls(format!("rediss://{userinfo}127.0.0.1:{}", self.port), certificates)?
            }
        };
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn)
    }

    /// The master's port as this sentinel reports it now (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn master_port(&self) -> Option<u16> {
        let name = self.config.master_name.clone();
        let value = self.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &name]).ok()?;
        let addr: Option<(String, String)> = redis::from_redis_value(value).ok()?;
        addr.and_then(|(_, port)| port.parse().ok())
    }

    /// Polls until the sentinel names `port` as the master; panics with the log after `timeout`.
    pub fn wait_master_port(&self, port: u16, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.master_port() == Some(port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sentinel never named port {port} as master within {timeout:?}:\n{}", self.log_tail());
    }

    /// Polls until the sentinel knows `count` replicas of its master (it must know one before it
    /// can fail over); panics with the log after 15 s.
    pub fn wait_replicas(&self, count: usize) {
        let name = self.config.master_name.clone();
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            let known = self
                .try_cmd(&["SENTINEL", "REPLICAS", &name])
                .ok()
                .and_then(|v| redis::from_redis_value::<Vec<redis::Value>>(v).ok())
                .map_or(0, |replicas| replicas.len());
            if known >= count {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sentinel never saw {count} replica(s):\n{}", self.log_tail());
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
