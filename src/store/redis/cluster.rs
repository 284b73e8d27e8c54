//! What a Redis Cluster needs beyond routing by key: commands that must reach every primary.
//!
//! Owns: the list of primaries serving slots (CLUSTER SLOTS), one command sent to one named node,
//! the cluster's identity (every serving primary's `run_id` and `master_replid`, the slots one
//! node's view lists for it and the slots it claims itself), and the SCAN of every primary.
//! Never: treats a settled slot move between primaries as a new identity (the identity names the
//! primaries, not which slots they serve), trusts one node's view of who serves a slot without
//! that primary's own account, or SCANs a replica (it may lag).
//!
//! The identity is conservative: a failover, restart or replacement of any serving primary
//! changes it; so does a primary that gains its first slot or gives away its last (adding or
//! removing a node), and a slot that starts or stops being disputed (claimed by no listed
//! primary, by two, or not by the one the view names unless that one is a live primary that
//! handed it to the one other claimant: a view behind a settled handover). The coordinator maps
//! each change to the slots it may have cost (`ServerIdentity::may_have_lost`). A slot migration
//! between serving primaries leaves it unchanged once the handover settled, and is never a loss
//! itself: MIGRATE moves keys synchronously and loses nothing.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Cmd, FromRedisValue, Value};

use super::conn::{Conn, Lane};
use super::scripts::{number, text};
use super::RedisStore;
use crate::store::{PrimaryIdentity, ServerIdentity, StoreError};

/// One serving primary: its address and node id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Primary {
    pub host: String,
    pub port: u16,
    pub node_id: String,
    /// The slot ranges it serves (inclusive, in reply order).
    pub slots: Vec<(u16, u16)>,
}

/// The primaries of a CLUSTER SLOTS reply (`[[start, end, [host, port, id, ...], replicas...]]`),
/// sorted and without repeats.
pub(super) fn parse_slots_primaries(reply: &Value) -> Result<Vec<Primary>, StoreError> {
    let bad = || StoreError::Protocol(format!("CLUSTER SLOTS: unexpected reply {reply:?}"));
    let Value::Array(ranges) = reply else { return Err(bad()) };
    let mut primaries: BTreeMap<(String, u16, String), Vec<(u16, u16)>> = BTreeMap::new();
    for range in ranges {
        let Value::Array(parts) = range else { return Err(bad()) };
        let slot = |i: usize| parts.get(i).and_then(number).and_then(|s| u16::try_from(s).ok());
        let (Some(start), Some(end)) = (slot(0), slot(1)) else { return Err(bad()) };
        let Some(Value::Array(node)) = parts.get(2) else { return Err(bad()) };
        let host = node.first().and_then(text).ok_or_else(bad)?;
        let port = node.get(1).and_then(number).and_then(|p| u16::try_from(p).ok()).ok_or_else(bad)?;
        let node_id = node.get(2).and_then(text).unwrap_or_default();
        primaries.entry((host, port, node_id)).or_default().push((start, end));
    }
    Ok(primaries.into_iter().map(|((host, port, node_id), slots)| Primary { host, port, node_id, slots }).collect())
}

/// How long a [`RedisStore::cluster_identity`] read that found a dispute waits before reading
/// again: long enough for a migration's handover between two primaries (consecutive `SETSLOT`
/// calls) to settle, short against a tick.
const DISPUTE_REREAD_MS: u64 = 50;

/// The slots `node` serves by its own account: the ranges its own CLUSTER SLOTS reply (`own_view`,
/// parsed) lists under its node id, or under its address when the view named no id. Another node
/// now at its address (a replacement, with a new id) claims nothing for it.
pub(super) fn own_claim(node: &Primary, own_view: &[Primary]) -> Vec<(u16, u16)> {
    let mine = |entry: &&Primary| {
        if node.node_id.is_empty() {
            entry.host == node.host && entry.port == node.port
        } else {
            entry.node_id == node.node_id
        }
    };
    let mut claimed: Vec<(u16, u16)> = own_view.iter().filter(mine).flat_map(|entry| entry.slots.clone()).collect();
    claimed.sort_unstable();
    claimed
}

/// The slot ranges `node`'s own CLUSTER SLOTS reply (`own_view`, parsed) names another node for,
/// with that node's id (its `host:port` when the reply names no id): whom it handed them to.
pub(super) fn handed_by(node: &Primary, own_view: &[Primary]) -> Vec<(u16, u16, String)> {
    let mine = |entry: &Primary| {
        if node.node_id.is_empty() {
            entry.host == node.host && entry.port == node.port
        } else {
            entry.node_id == node.node_id
        }
    };
    let mut handed: Vec<(u16, u16, String)> = own_view
        .iter()
        .filter(|entry| !mine(entry))
        .flat_map(|entry| {
            let to =
                if entry.node_id.is_empty() { format!("{}:{}", entry.host, entry.port) } else { entry.node_id.clone() };
            entry.slots.iter().map(move |(start, end)| (*start, *end, to.clone()))
        })
        .collect();
    handed.sort_unstable();
    handed
}

/// The text of an INFO reply (RESP3 answers a verbatim string).
fn info_text(reply: &Value, section: &str) -> Result<String, StoreError> {
    match reply {
        Value::VerbatimString { text, .. } => Ok(text.clone()),
        other => text(other).ok_or_else(|| StoreError::Protocol(format!("INFO {section}: unexpected reply"))),
    }
}

impl RedisStore {
    /// Every primary serving at least one slot, as the node answering CLUSTER SLOTS sees them.
    pub(super) async fn cluster_primaries(&self) -> Result<Vec<Primary>, StoreError> {
        let reply: Value = self.query("CLUSTER SLOTS", ::redis::cmd("CLUSTER").arg("SLOTS").clone()).await?;
        let primaries = parse_slots_primaries(&reply)?;
        if primaries.is_empty() {
            return Err(StoreError::Unavailable("CLUSTER SLOTS: no primary serves any slot".into()));
        }
        Ok(primaries)
    }

    /// One command on one node of the cluster (by address), on the shared cluster connection.
    pub(super) async fn on_node<T: FromRedisValue + Send>(
        &self,
        command: &str,
        node: &Primary,
        cmd: Cmd,
    ) -> Result<T, StoreError> {
        let routing =
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: node.host.clone(), port: node.port });
        let value: Value = self
            .inner
            .conn
            .run(Lane::Shared, command, 0, |c: Conn| async move {
                match c {
                    Conn::Cluster(mut cluster) => {
                        let value = cluster.route_command(cmd, routing).await?;
                        Ok((value, Conn::Cluster(cluster)))
                    }
                    Conn::Single(mut single) => {
                        let value: Value = cmd.query_async(&mut single).await?;
                        Ok((value, Conn::Single(single)))
                    }
                }
            })
            .await?;
        T::from_redis_value(value).map_err(|e| StoreError::Protocol(format!("{command}: {e}")))
    }

    /// The cluster's identity: per primary the view lists serving slots (sorted by address),
    /// `<host>:<port>/<node id>` with its `run_id`, and its `master_replid`, each joined with `,`;
    /// with the slots the view lists for it and the slots it claims itself ([`own_claim`]).
    ///
    /// The view is one node's CLUSTER SLOTS, which may be stale: mid-failover, or on one side of
    /// a partition, it can name a deposed primary for slots a promoted replica now serves. So each
    /// listed primary is also asked for its own account, and a slot the accounts do not settle on
    /// one primary is disputed ([`ServerIdentity::disputed`]), which counts as possibly lost. A
    /// slot migration is disputed for as long as its handover takes (the last `SETSLOT NODE`
    /// reaches the two primaries one after the other, and the other nodes by gossip), so a read
    /// that finds a dispute is repeated once after [`DISPUTE_REREAD_MS`]; the second read is the
    /// identity, its disputes included.
    pub(super) async fn cluster_identity(&self) -> Result<ServerIdentity, StoreError> {
        let identity = self.read_cluster_identity().await?;
        if identity.disputed_slots().is_empty() {
            return Ok(identity);
        }
        tokio::time::sleep(std::time::Duration::from_millis(DISPUTE_REREAD_MS)).await;
        self.read_cluster_identity().await
    }

    /// One read of the identity: the view, then each primary it lists ([`primary_identity`]).
    ///
    /// [`primary_identity`]: Self::primary_identity
    async fn read_cluster_identity(&self) -> Result<ServerIdentity, StoreError> {
        let mut primaries = Vec::new();
        for primary in &self.cluster_primaries().await? {
            primaries.push(self.primary_identity(primary).await?);
        }
        let join = |field: fn(&PrimaryIdentity) -> &str| {
            primaries.iter().map(|p| format!("{}={}", p.node, field(p))).collect::<Vec<_>>().join(",")
        };
        Ok(ServerIdentity { run_id: join(|p| &p.run_id), replication_id: join(|p| &p.replication_id), primaries })
    }

    /// INFO `server` and `replication` and CLUSTER SLOTS of one primary the view lists, asked of
    /// that node itself. One whose own INFO does not say `role:master` (a demoted primary the view
    /// still lists) claims nothing.
    async fn primary_identity(&self, primary: &Primary) -> Result<PrimaryIdentity, StoreError> {
        let node = format!("{}:{}/{}", primary.host, primary.port, primary.node_id);
        let (server, replication) = self.node_server_replication(primary).await?;
        let field = |info: &str, section: &str, name: &str| {
            super::probe::info_field(info, name)
                .ok_or_else(|| StoreError::Protocol(format!("INFO {section} of {node} has no {name}")))
        };
        let run_id = field(&server, "server", "run_id")?;
        let replication_id = field(&replication, "replication", "master_replid")?;
        let role = field(&replication, "replication", "role")?;
        let own_view: Value =
            self.on_node("CLUSTER SLOTS", primary, ::redis::cmd("CLUSTER").arg("SLOTS").clone()).await?;
        let (claimed, handed) = if role == "master" {
            let own = parse_slots_primaries(&own_view)?;
            (own_claim(primary, &own), handed_by(primary, &own))
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(PrimaryIdentity { node, run_id, replication_id, slots: primary.slots.clone(), claimed, handed })
    }

    pub(super) async fn node_info(&self, node: &Primary, section: &str) -> Result<String, StoreError> {
        let reply: Value = self.on_node("INFO", node, ::redis::cmd("INFO").arg(section).clone()).await?;
        info_text(&reply, section)
    }

    /// INFO `server` and `replication` of one node: one INFO naming both (Redis 7.0+), as on one
    /// server, so an identity check costs 1 + 2 × primaries commands; two on Redis 6.2, which
    /// answers a second section with `ERR syntax error` (the store remembers that, as on one
    /// server).
    async fn node_server_replication(&self, node: &Primary) -> Result<(String, String), StoreError> {
        if !self.inner.info_one_section.load(Ordering::Relaxed) {
            let both = ::redis::cmd("INFO").arg("server").arg("replication").clone();
            match self.on_node::<Value>("INFO", node, both).await {
                Ok(reply) => {
                    let both = info_text(&reply, "server replication")?;
                    if super::probe::info_field(&both, "master_replid").is_some() {
                        return Ok((both.clone(), both));
                    }
                }
                Err(StoreError::Protocol(text)) if text.to_ascii_lowercase().contains("syntax error") => {
                    self.inner.info_one_section.store(true, Ordering::Relaxed);
                }
                Err(error) => return Err(error),
            }
        }
        Ok((self.node_info(node, "server").await?, self.node_info(node, "replication").await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![bulk(host), Value::Int(port), bulk(id)])
    }

    #[test]
    fn slots_name_each_serving_primary_once_in_order() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(10),
                node("127.0.0.1", 7002, "b"),
                node("127.0.0.1", 7005, "r"),
            ]),
            Value::Array(vec![Value::Int(11), Value::Int(20), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(21), Value::Int(30), node("127.0.0.1", 7002, "b")]),
        ]);
        let primaries = parse_slots_primaries(&reply).expect("parses");
        let ports: Vec<u16> = primaries.iter().map(|p| p.port).collect();
        assert_eq!(ports, vec![7001, 7002]);
        assert_eq!(primaries[1].node_id, "b");
        assert_eq!(primaries[1].slots, vec![(0, 10), (21, 30)]);
        assert!(parse_slots_primaries(&Value::Int(1)).is_err());
        assert!(parse_slots_primaries(&Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
    }

    #[test]
    fn a_node_claims_the_slots_its_own_view_lists_under_its_id() {
        let view = parse_slots_primaries(&Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(10), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(11), Value::Int(20), node("127.0.0.1", 7002, "b")]),
        ]))
        .expect("parses");
        let a = &view[0];
        // a's own reply: it also claims 11..=20 (it missed b's takeover) and names b for 21..=30.
        let own = parse_slots_primaries(&Value::Array(vec![
            Value::Array(vec![Value::Int(11), Value::Int(20), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(0), Value::Int(10), node("127.0.0.1", 7001, "a")]),
            Value::Array(vec![Value::Int(21), Value::Int(30), node("127.0.0.1", 7002, "b")]),
        ]))
        .expect("parses");
        assert_eq!(own_claim(a, &own), vec![(0, 10), (11, 20)]);
        // Another node at a's address (a replacement, new id) claims nothing for a.
        let replaced = parse_slots_primaries(&Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(10),
            node("127.0.0.1", 7001, "a2"),
        ])]))
        .expect("parses");
        assert_eq!(own_claim(a, &replaced), vec![]);
        // A view without node ids is matched by address.
        let anonymous = Primary { node_id: String::new(), ..a.clone() };
        assert_eq!(own_claim(&anonymous, &own), vec![(0, 10), (11, 20)]);
        assert_eq!(own_claim(a, &[]), vec![]);
        // Whom a's own reply names for the slots it does not claim: b, by id.
        assert_eq!(handed_by(a, &own), vec![(21, 30, "b".to_string())]);
        assert_eq!(handed_by(a, &replaced), vec![(0, 10, "a2".to_string())]);
        // A reply without node ids names the node by address.
        let by_address = parse_slots_primaries(&Value::Array(vec![Value::Array(vec![
            Value::Int(21),
            Value::Int(30),
            node("127.0.0.1", 7002, ""),
        ])]))
        .expect("parses");
        assert_eq!(handed_by(a, &by_address), vec![(21, 30, "127.0.0.1:7002".to_string())]);
    }
}
