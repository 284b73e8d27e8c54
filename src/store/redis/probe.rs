//! Server identity and the startup compatibility probe.
//!
//! Owns the list of commands the layout needs and the order they are checked in. The probe
//! fails fast naming the first command the server lacks (renamed, disabled, or too old) or
//! denies (ACL), so a misconfigured deployment stops at startup instead of at its first
//! failover. It writes only throwaway keys under its own hash tag
//! (`redis-stream:coord:{__probe__:<nonce>}:probe-*`, which the metadata SCAN never matches) and
//! deletes them before returning, whatever the outcome.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;

use ::redis::{Cmd, Value};

use super::scripts::{number, text};
use super::RedisStore;
use crate::store::{ProbeReport, ServerIdentity, StoreError};

/// Oldest server this layout runs on: XAUTOCLAIM arrived in Redis 6.2.
const VERSION_MIN: (u32, u32) = (6, 2);

/// Every command the store sends, directly or from a script, in probe order. The probe itself
/// also needs `COMMAND` (COMMAND INFO); an ACL user must be allowed it.
use crate::store::REQUIRED_COMMANDS as COMMANDS;

/// The value of `field:` in an INFO section.
pub(super) fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':').map(|v| v.trim().to_string()))
}

/// `major.minor` of a version string like `7.0.15`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A per-probe nonce so concurrent probes of several coordinators never share keys. Not a
/// security token; std's per-process random hasher keys are enough.
fn nonce() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn cmd(name: &str, args: &[&str]) -> Cmd {
    let mut cmd = ::redis::cmd(name);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

impl RedisStore {
    async fn info(&self, section: &str) -> Result<String, StoreError> {
        self.info_sections(&[section]).await
    }

    /// One INFO naming `sections` (several only on Redis 7.0+).
    async fn info_sections(&self, sections: &[&str]) -> Result<String, StoreError> {
        let reply: Value = self.query("INFO", cmd("INFO", sections)).await?;
        match &reply {
            Value::VerbatimString { text, .. } => Ok(text.clone()),
            other => text(other).ok_or_else(|| StoreError::Protocol(format!("INFO {sections:?}: unexpected reply"))),
        }
    }

    pub(super) async fn server_identity(&self) -> Result<ServerIdentity, StoreError> {
        if self.is_cluster() {
            return self.cluster_identity().await;
        }
        // One INFO naming both sections (Redis 7.0+): one command per identity check, which every
        // ticker pass makes. Redis 6.2 takes one section per INFO: both then go in one round trip.
        let (server, replication) = if self.inner.info_one_section.load(Ordering::Relaxed) {
            self.info_pair().await?
        } else {
            match self.info_sections(&["server", "replication"]).await {
                Ok(both) if info_field(&both, "master_replid").is_some() => (both.clone(), both),
                // Redis 6.2 answers `ERR syntax error` to a second section. Anything else (a denial,
                // an outage) is no news about the server's INFO, and is the caller's.
                Err(StoreError::Protocol(text)) if text.to_ascii_lowercase().contains("syntax error") => {
                    self.inner.info_one_section.store(true, Ordering::Relaxed);
                    self.info_pair().await?
                }
                Ok(_) => self.info_pair().await?,
                Err(error) => return Err(error),
            }
        };
        let run_id =
            info_field(&server, "run_id").ok_or_else(|| StoreError::Protocol("INFO server has no run_id".into()))?;
        let replication_id = info_field(&replication, "master_replid")
            .ok_or_else(|| StoreError::Protocol("INFO replication has no master_replid".into()))?;
        Ok(ServerIdentity { run_id, replication_id, primaries: Vec::new() })
    }

    /// `INFO server` and `INFO replication`, pipelined (servers before 7.0).
    async fn info_pair(&self) -> Result<(String, String), StoreError> {
        let mut pipe = ::redis::pipe();
        pipe.add_command(cmd("INFO", &["server"])).add_command(cmd("INFO", &["replication"]));
        let (server, replication): (Value, Value) = self.pipeline("INFO", pipe).await?;
        let section = |reply: &Value, name: &str| match reply {
            Value::VerbatimString { text, .. } => Ok(text.clone()),
            other => text(other).ok_or_else(|| StoreError::Protocol(format!("INFO {name}: unexpected reply"))),
        };
        Ok((section(&server, "server")?, section(&replication, "replication")?))
    }

    /// The INFO `section` of the server, or of every serving primary of a Cluster.
    async fn server_infos(&self, section: &str) -> Result<Vec<String>, StoreError> {
        if !self.is_cluster() {
            return Ok(vec![self.info(section).await?]);
        }
        let mut infos = Vec::new();
        for primary in self.cluster_primaries().await? {
            infos.push(self.node_info(&primary, section).await?);
        }
        Ok(infos)
    }

    /// Refuses a single server that is a replica (a replica host or a managed reader endpoint
    /// named by mistake). A read-only one fails every write with `READONLY`; a writable one
    /// (`replica-read-only no`) passed the probe, and the coordinator's metadata writes and fence
    /// raises landed where consumers reading the primary never see them, to be wiped by the next
    /// resync. A Cluster's primaries are found by their slots, and Sentinel's client checks the
    /// role of the server it is given.
    async fn check_primary(&self) -> Result<(), StoreError> {
        if self.is_cluster() {
            return Ok(());
        }
        let replication = self.info("replication").await?;
        match info_field(&replication, "role").as_deref() {
            Some("master") | None => Ok(()),
            Some(role) => Err(StoreError::Unsupported {
                command: "role".into(),
                detail: format!(
                    "the server is a {role}, not a primary: name the primary (writes to a replica are lost at its \
                     next resync)"
                ),
            }),
        }
    }

    /// Refuses a server (any primary of a Cluster) whose `maxmemory-policy` evicts keys without a
    /// TTL (`allkeys-*`): an evicted metadata key fails its group closed, but an evicted fence key
    /// accepts any fence until the shard's owner next presents its own, so a late operation of a
    /// previous owner would run at Redis beside the current one (DESIGN §10). Read from `INFO
    /// memory` (the coordinator's user has `+info`; `CONFIG GET` is often denied). The policy
    /// can still be changed at run time; the README says so.
    async fn check_eviction_policy(&self) -> Result<(), StoreError> {
        for memory in self.server_infos("memory").await? {
            let Some(policy) = info_field(&memory, "maxmemory_policy") else { continue };
            if policy.starts_with("allkeys-") {
                return Err(StoreError::Unsupported {
                    command: "maxmemory-policy".into(),
                    detail: format!(
                        "the server's maxmemory-policy is {policy}, which evicts keys without a TTL: an evicted \
                         fence key lets a previous owner's late read or ack run beside the current owner; \
                         use noeviction (recommended) or a volatile-* policy"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Checks the version of the server (every primary of a Cluster) and returns the first one's.
    /// On a Cluster the commands are checked and exercised on the primary that serves the probe's
    /// keys; the others are assumed to share its configuration (ACL users and renamed commands
    /// are per node: configure them alike).
    pub(super) async fn run_probe(&self) -> Result<ProbeReport, StoreError> {
        let mut reported = None;
        for server in self.server_infos("server").await? {
            let version = info_field(&server, "redis_version")
                .ok_or_else(|| StoreError::Protocol("INFO server has no redis_version".into()))?;
            let parsed = major_minor(&version)
                .ok_or_else(|| StoreError::Protocol(format!("unparsable redis_version {version:?}")))?;
            if parsed < VERSION_MIN {
                return Err(StoreError::Unsupported {
                    command: "XAUTOCLAIM".into(),
                    detail: format!("server version {version} is older than 6.2, which added XAUTOCLAIM"),
                });
            }
            reported.get_or_insert(version);
        }
        let version = reported.ok_or_else(|| StoreError::Protocol("INFO server: no server answered".into()))?;
        self.check_eviction_policy().await?;
        self.check_primary().await?;
        self.check_commands_exist().await?;
        let base = format!("redis-stream:coord:{{__probe__:{:016x}}}", nonce());
        let exercised = self.exercise(&base).await;
        let cleanup = self.query::<Value>("DEL", probe_keys(&base)).await;
        exercised?;
        cleanup?;
        let identity = self.server_identity().await?;
        Ok(ProbeReport { server_version: version, identity })
    }

    /// COMMAND INFO lists nil for a command the server does not know (too old, or renamed away
    /// with `rename-command`).
    async fn check_commands_exist(&self) -> Result<(), StoreError> {
        let mut info = cmd("COMMAND", &["INFO"]);
        for name in COMMANDS {
            info.arg(*name);
        }
        let reply: Value = self.query("COMMAND", info).await?;
        let Value::Array(entries) = &reply else {
            return Err(StoreError::Protocol("COMMAND INFO: unexpected reply".into()));
        };
        if entries.len() != COMMANDS.len() {
            return Err(StoreError::Protocol("COMMAND INFO: wrong number of entries".into()));
        }
        for (name, entry) in COMMANDS.iter().zip(entries) {
            if matches!(entry, Value::Nil) {
                return Err(StoreError::Unsupported {
                    command: (*name).to_string(),
                    detail: "the server does not know this command (renamed, disabled, or too old)".into(),
                });
            }
        }
        Ok(())
    }

    /// Runs every command once on throwaway keys, so an ACL denial surfaces now and names the
    /// command, then runs each script through its success path.
    async fn exercise(&self, base: &str) -> Result<(), StoreError> {
        let hash = format!("{base}:probe-hash");
        let set = format!("{base}:probe-set");
        let mutex = format!("{base}:probe-mutex");
        let stream = format!("{base}:probe-stream");
        let pattern = format!("{base}:*");
        let steps: Vec<(&str, Cmd)> = vec![
            ("PING", cmd("PING", &[])),
            ("HSET", cmd("HSET", &[&hash, "f", "v"])),
            ("HGET", cmd("HGET", &[&hash, "f"])),
            ("HMGET", cmd("HMGET", &[&hash, "f", "g"])),
            ("HINCRBY", cmd("HINCRBY", &[&hash, "n", "1"])),
            ("HGETALL", cmd("HGETALL", &[&hash])),
            ("HDEL", cmd("HDEL", &[&hash, "n"])),
            ("EXISTS", cmd("EXISTS", &[&hash])),
            // Fence gates expire (DESIGN §10).
            ("PEXPIRE", cmd("PEXPIRE", &[&hash, "60000"])),
            ("SET", cmd("SET", &[&mutex, "token", "NX", "PX", "60000"])),
            ("GET", cmd("GET", &[&mutex])),
            ("SADD", cmd("SADD", &[&set, "a"])),
            ("SMEMBERS", cmd("SMEMBERS", &[&set])),
            ("SREM", cmd("SREM", &[&set, "a"])),
            ("SCAN", cmd("SCAN", &["0", "MATCH", &pattern, "COUNT", "10"])),
            ("XADD", cmd("XADD", &[&stream, "MAXLEN", "~", "10", "*", "f", "v"])),
            ("XGROUP", cmd("XGROUP", &["CREATE", &stream, "g", "0", "MKSTREAM"])),
            ("XREADGROUP", cmd("XREADGROUP", &["GROUP", "g", "c", "COUNT", "1", "STREAMS", &stream, ">"])),
            ("XAUTOCLAIM", cmd("XAUTOCLAIM", &[&stream, "g", "c2", "0", "0-0", "COUNT", "1"])),
            ("XACK", cmd("XACK", &[&stream, "g", "0-1"])),
            // The consumer's doorbell (never BLOCK here).
            ("XREAD", cmd("XREAD", &["COUNT", "1", "STREAMS", &stream, "0-0"])),
            ("XINFO", cmd("XINFO", &["GROUPS", &stream])),
            ("DEL", cmd("DEL", &[&set])),
        ];
        for (name, step) in steps {
            let _: Value = self.query(name, step).await?;
        }
        self.exercise_scripts(base).await
    }

    /// Loads each script (SCRIPT LOAD) and runs it on probe keys, checking the reply shape.
    async fn exercise_scripts(&self, base: &str) -> Result<(), StoreError> {
        for (name, script) in self.inner.scripts.all() {
            self.load_script(name, script).await?;
        }
        let meta = format!("{base}:probe-metadata");
        let live = format!("{base}:probe-liveness");
        let mutex = format!("{base}:probe-mutex");
        let scripts = &self.inner.scripts;
        let expect = |name: &str, reply: &Value, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(StoreError::Protocol(format!("probe: {name} replied {reply:?}")))
            }
        };

        let mut write = scripts.write.prepare_invoke();
        write.key(&meta).key(&live).arg("").arg("").arg(1).arg("{}").arg(1).arg(1).arg(0).arg("probe").arg(0);
        let reply = self.invoke("write script", write).await?;
        expect("write script", &reply, super::scripts::parse_write(&reply).is_ok())?;

        let mut touch = scripts.touch.prepare_invoke();
        touch.key(&meta).key(&live).arg("m").arg(1);
        let reply = self.invoke("touch script", touch).await?;
        let touched = matches!(&reply, Value::Array(items) if items.first().and_then(number) == Some(1));
        expect("touch script", &reply, touched)?;

        let mut delete = scripts.delete.prepare_invoke();
        delete.key(&meta).key(&live).arg(1).arg("probe");
        let reply = self.invoke("delete script", delete).await?;
        // The stamp the write above stored: the delete takes its success path (its DEL runs).
        let deleted = matches!(super::scripts::parse_delete(&reply), Ok(crate::store::WriteOutcome::Written { .. }));
        expect("delete script", &reply, deleted)?;

        let mut forget = scripts.forget_liveness.prepare_invoke();
        forget.key(&meta).key(&live);
        let reply = self.invoke("forget-liveness script", forget).await?;
        expect("forget-liveness script", &reply, number(&reply).is_some())?;

        let mut release = scripts.release.prepare_invoke();
        release.key(&mutex).arg("token");
        let reply = self.invoke("mutex release script", release).await?;
        expect("mutex release script", &reply, number(&reply) == Some(1))?;
        self.exercise_fence_scripts(base).await
    }

    /// Raises a probe fence and runs each fenced script with it on the probe stream (group `g`,
    /// created by [`exercise`](Self::exercise)), so an ACL user that may not run a command inside
    /// them (HINCRBY, HMGET, HSET, the stream commands) is refused now, naming it.
    async fn exercise_fence_scripts(&self, base: &str) -> Result<(), StoreError> {
        use crate::store::{FenceCheck, FenceRaise, MetadataStore, ReadFrom, StreamStore};
        // Named as fence keys are (`…:fence:<group>`), so the scripts open and close its gate.
        let key = format!("{base}:probe:fence:g");
        let stream = format!("{base}:probe-stream");
        let raised = self.raise_fences(&[FenceRaise { key: key.clone(), nonce: nonce(), floor: 0 }]).await?;
        let fence = match raised.as_slice() {
            [fence] if fence.counter == 1 => *fence,
            other => return Err(StoreError::Protocol(format!("probe: fence raise script replied {other:?}"))),
        };
        if self.read_fences(std::slice::from_ref(&key)).await? != vec![Some(fence)] {
            return Err(StoreError::Protocol("probe: the raised fence does not read back".into()));
        }
        let check = FenceCheck { key, fence };
        let exercised = async {
            // New entries go through the gate; own pending entries always through the read script.
            self.fenced_xreadgroup(&check, "g", "c", &stream, ReadFrom::New, 1).await?;
            self.fenced_xreadgroup(&check, "g", "c", &stream, ReadFrom::OwnPending, 1).await?;
            self.fenced_xack(&check, &stream, "g", &[]).await?;
            self.fenced_claim_all_pending(&check, &stream, "g", "c", 0).await?;
            Ok::<(), StoreError>(())
        }
        .await;
        // The gate the raise opened, whatever happened (its name holds the random nonce, so
        // `probe_keys` cannot name it; it would expire on its own within seconds anyway).
        let mut del = ::redis::cmd("DEL");
        del.arg(super::fences::gate_key(&check.key, &check.fence));
        let cleanup = self.query::<Value>("DEL", del).await;
        exercised?;
        cleanup.map(|_| ())
    }
}

/// DEL of every key the probe may have created.
fn probe_keys(base: &str) -> Cmd {
    let mut del = ::redis::cmd("DEL");
    let suffixes =
        ["probe-hash", "probe-set", "probe-mutex", "probe-stream", "probe-metadata", "probe-liveness", "probe:fence:g"];
    for suffix in suffixes {
        del.arg(format!("{base}:{suffix}"));
    }
    del
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_and_versions_parse() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n";
        assert_eq!(info_field(info, "redis_version").as_deref(), Some("7.0.15"));
        assert_eq!(info_field(info, "run_id").as_deref(), Some("abc"));
        assert_eq!(info_field(info, "run"), None);
        assert_eq!(major_minor("7.0.15"), Some((7, 0)));
        assert!(major_minor("6.0.16") < Some(VERSION_MIN));
        assert!(major_minor("6.2.0") >= Some(VERSION_MIN));
    }
}
