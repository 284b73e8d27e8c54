//! What a Redis Cluster needs beyond routing by key: commands that must reach every primary.
//!
//! Owns: the list of primaries serving slots (CLUSTER SLOTS), one command sent to one named node,
//! the cluster's identity (every serving primary's `run_id` and `master_replid`), and the SCAN of
//! every primary. Never: treats a slot moving between primaries as a new identity (the identity
//! names the primaries, not which slots they serve), or SCANs a replica (it may lag).
//!
//! The identity is conservative: a failover, restart or replacement of any serving primary
//! changes it, so every group runs a correction round, also the groups whose slots live on other
//! primaries; so does a primary that gains its first slot or gives away its last (adding or
//! removing a node). A slot migration between serving primaries leaves it unchanged: MIGRATE
//! moves keys synchronously and loses nothing.

use std::collections::BTreeMap;

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

    /// The cluster's identity: per serving primary (sorted by address), `<host>:<port>/<node id>`
    /// with its `run_id`, and its `master_replid`, each joined with `,`.
    pub(super) async fn cluster_identity(&self) -> Result<ServerIdentity, StoreError> {
        let primaries = self.cluster_primaries().await?;
        let mut run_ids = Vec::with_capacity(primaries.len());
        let mut replication_ids = Vec::with_capacity(primaries.len());
        let mut identities = Vec::with_capacity(primaries.len());
        for primary in &primaries {
            let node = format!("{}:{}/{}", primary.host, primary.port, primary.node_id);
            let server = self.node_info(primary, "server").await?;
            let replication = self.node_info(primary, "replication").await?;
            let run_id = super::probe::info_field(&server, "run_id")
                .ok_or_else(|| StoreError::Protocol(format!("INFO server of {node} has no run_id")))?;
            let replid = super::probe::info_field(&replication, "master_replid")
                .ok_or_else(|| StoreError::Protocol(format!("INFO replication of {node} has no master_replid")))?;
            run_ids.push(format!("{node}={run_id}"));
            replication_ids.push(format!("{node}={replid}"));
            identities.push(PrimaryIdentity { node, run_id, replication_id: replid, slots: primary.slots.clone() });
        }
        Ok(ServerIdentity {
            run_id: run_ids.join(","),
            replication_id: replication_ids.join(","),
            primaries: identities,
        })
    }

    pub(super) async fn node_info(&self, node: &Primary, section: &str) -> Result<String, StoreError> {
        let reply: Value = self.on_node("INFO", node, ::redis::cmd("INFO").arg(section).clone()).await?;
        match &reply {
            Value::VerbatimString { text, .. } => Ok(text.clone()),
            other => text(other).ok_or_else(|| StoreError::Protocol(format!("INFO {section}: unexpected reply"))),
        }
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
}
