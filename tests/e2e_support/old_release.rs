//! The previous release's binaries (the commit pinned in `tests/compat/OLD_RELEASE`, built by
//! `.ci/build-old-release` into `target/old-release/`), for the mixed-version story.
//!
//! [`OldRelease::find`] locates them; absent binaries fail the story (build them with
//! `.ci/build-old-release`, which `.ci/test-all` runs first), unless `E2E_SKIP_OLD_RELEASE=1`
//! opts out explicitly outside CI: a plain `cargo nextest run --test e2e` must not report the
//! mixed-version stories green without running them. [`OldConsumer`] runs the old `examples/consumer` as a
//! child process against one coordinator address and turns what it prints into the shared
//! [`Ledger`]: every entry it received (timestamped when its line arrived), every failed ack, and
//! the shards it currently reads (from its rebalance listener's lines). It is killed on drop.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rsc::core::model::{GroupId, ShardId};
use rsc::store::EntryId;

use super::fleet::{Delivered, Ledger};

/// Where the old binaries are: `E2E_OLD_RELEASE_DIR`, else `target/old-release/`.
fn release_dir() -> PathBuf {
    match std::env::var_os("E2E_OLD_RELEASE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/old-release"),
    }
}

/// The pinned commit (`tests/compat/OLD_RELEASE`).
pub fn pinned_commit() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/compat/OLD_RELEASE");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display())).trim().to_string()
}

/// The variable that, set to `1`, skips the mixed-version stories when the old binaries are
/// missing (outside CI).
pub const SKIP_OLD_RELEASE: &str = "E2E_SKIP_OLD_RELEASE";

/// The previous release's `coordinator` and `consumer` executables.
#[derive(Clone, Debug)]
pub struct OldRelease {
    pub commit: String,
    pub coordinator: String,
    pub consumer: String,
}

impl OldRelease {
    /// The old binaries, or `None` (with a message on stderr) when they were not built and
    /// `E2E_SKIP_OLD_RELEASE=1` opts out of the mixed-version stories. Panics when they are
    /// absent without that opt-out (and under CI, `CI` set, even with it), and always when they
    /// were built from another commit than the pinned one (stale: rebuild them).
    pub fn find() -> Option<Self> {
        let dir = release_dir();
        let (coordinator, consumer) = (dir.join("coordinator"), dir.join("consumer"));
        let commit = pinned_commit();
        if !coordinator.exists() || !consumer.exists() {
            let message = format!(
                "the previous release's binaries are not in {} (build them with .ci/build-old-release)",
                dir.display()
            );
            let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
            if set("CI") {
                panic!("{message}; CI must build them before the tests");
            }
            if std::env::var_os(SKIP_OLD_RELEASE).is_none_or(|v| v != "1") {
                panic!("{message}, or set {SKIP_OLD_RELEASE}=1 to skip the mixed-version stories");
            }
            eprintln!("SKIPPED ({SKIP_OLD_RELEASE}=1): {message}");
            return None;
        }
        let built = std::fs::read_to_string(dir.join("COMMIT")).unwrap_or_default().trim().to_string();
        assert_eq!(built, commit, "{} holds another commit's binaries: run .ci/build-old-release", dir.display());
        let text = |p: PathBuf| p.to_string_lossy().into_owned();
        Some(Self { commit, coordinator: text(coordinator), consumer: text(consumer) })
    }

    /// The release's README: from the source `.ci/build-old-release` exported, else from git.
    pub fn readme(&self) -> String {
        if let Ok(text) = std::fs::read_to_string(release_dir().join("src/README.md")) {
            return text;
        }
        let output = Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR"), "show", &format!("{}:README.md", self.commit)])
            .output()
            .expect("run git show");
        assert!(output.status.success(), "git show {}:README.md failed", self.commit);
        String::from_utf8(output.stdout).expect("README is UTF-8")
    }
}

/// One line the old consumer printed, with when it arrived.
#[derive(Clone, Debug)]
pub struct OutputLine {
    pub at: Instant,
    pub stderr: bool,
    pub text: String,
}

#[derive(Default)]
struct Seen {
    lines: Vec<OutputLine>,
    /// The shards its listener was last told it reads.
    reading: BTreeSet<ShardId>,
}

/// The old release's `examples/consumer` as a child process.
pub struct OldConsumer {
    member: String,
    child: Option<Child>,
    seen: Arc<Mutex<Seen>>,
}

impl OldConsumer {
    /// Starts `release`'s consumer as `member` of `group`, talking to `coordinator` and Redis at
    /// `redis_url`; its deliveries and failed acks go into `ledger`.
    pub fn start(
        release: &OldRelease,
        member: &str,
        coordinator: SocketAddr,
        redis_url: &str,
        group: &GroupId,
        ledger: Ledger,
    ) -> Self {
        let mut child = Command::new(&release.consumer)
            .arg(member)
            .env("COORDINATOR_ADDR", coordinator.to_string())
            .env("REDIS_URL", redis_url)
            .env("STREAM_PREFIX", &group.stream_prefix)
            .env("CONSUMER_GROUP", &group.consumer_group)
            .env_remove("COORDINATOR_CLIENT_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the old consumer");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        for (stream, is_stderr) in
            [(Box::new(stdout) as Box<dyn std::io::Read + Send>, false), (Box::new(stderr), true)]
        {
            let (seen, ledger, member) = (seen.clone(), ledger.clone(), member.to_string());
            std::thread::spawn(move || {
                for text in BufReader::new(stream).lines().map_while(Result::ok) {
                    let at = Instant::now();
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    record(&mut seen, &ledger, &member, at, is_stderr, &text);
                    seen.lines.push(OutputLine { at, stderr: is_stderr, text });
                }
            });
        }
        Self { member: member.into(), child: Some(child), seen }
    }

    pub fn member(&self) -> &str {
        &self.member
    }

    /// The shards it reads, as its rebalance listener last reported them.
    pub fn reading(&self) -> BTreeSet<ShardId> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).reading.clone()
    }

    /// Everything it printed so far.
    pub fn output(&self) -> Vec<OutputLine> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).lines.clone()
    }

    /// Ctrl-C (SIGINT): the example finishes its batch, drains, reports REVOKED and leaves.
    /// Waits (at most `timeout`) for it to exit.
    pub async fn leave(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("the old consumer is running");
        let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("run kill(1)");
        assert!(status.success(), "kill -INT failed");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "the old consumer did not leave within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for OldConsumer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Parses one line of the example's output (its formats at the pinned commit):
/// `shard <s> entry <id>: <key> = <payload>`, `assigned|revoked|lost shards [<s>, ...]`, and on
/// stderr `ack <id> failed: <error>`.
fn record(seen: &mut Seen, ledger: &Ledger, member: &str, at: Instant, stderr: bool, text: &str) {
    if stderr {
        if text.starts_with("ack ") && text.contains(" failed: ") {
            ledger.lock().ack_failures.push(format!("{member}: {text}"));
        }
        return;
    }
    if let Some(rest) = text.strip_prefix("shard ") {
        let parsed = rest.split_once(" entry ").and_then(|(shard, rest)| {
            let (id, rest) = rest.split_once(": ")?;
            let payload = rest.split_once(" = ")?.1;
            Some((shard.parse::<ShardId>().ok()?, id.parse::<EntryId>().ok()?, payload))
        });
        let (shard, entry, payload) = parsed.unwrap_or_else(|| panic!("unparsed delivery line {text:?}"));
        let payload = payload.as_bytes().to_vec();
        ledger.lock().delivered.push(Delivered { entry, shard, member: member.into(), at, payload });
        return;
    }
    for (prefix, reading) in [("assigned shards ", true), ("revoked shards ", false), ("lost shards ", false)] {
        if let Some(rest) = text.strip_prefix(prefix) {
            let list = rest.split(']').next().unwrap_or_default().trim_start_matches('[');
            for shard in list.split(',').filter_map(|s| s.trim().parse::<ShardId>().ok()) {
                if reading {
                    seen.reading.insert(shard);
                } else {
                    seen.reading.remove(&shard);
                }
            }
        }
    }
}
