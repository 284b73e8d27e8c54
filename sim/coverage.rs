//! Coverage ("sometimes assertions"): what a run actually reached — heartbeat statuses, error codes
//! answered, decision rules recorded, faults injected, and the rare situations the checkers exist
//! for — counted from ground truth, like the checkers: the client transports' records, the plan's
//! fault schedule, the store's metadata history and the store's own logs. Never from a protocol
//! participant's view.
//!
//! Decision rules are read from the history, not from the core: each recorded state is compared
//! with the one before it and the differences are named (a shard granted, revoked, released, a
//! member joined, a correction round started…). So a rule the core applies but never manages to
//! record is, rightly, not covered.
//!
//! `fault-plans/must-reach.toml` lists items a sweep must reach at least once (over all plans of
//! the sweep); `cargo sim coverage` fails when one is never reached.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rsc::client::TransportError;
use rsc::core::model::{GroupMetadata, MemberState, ShardOwner};
use rsc::store::memory::HistoryKind;
use serde::Deserialize;

use crate::checkers::Facts;

/// Item name -> times reached.
pub type Coverage = BTreeMap<String, u64>;

/// Everything one run reached.
pub fn of_run(facts: &Facts<'_>) -> Coverage {
    let mut c = Coverage::new();
    let mut hit = |item: String| *c.entry(item).or_insert(0) += 1;
    for call in &facts.records.heartbeats {
        match &call.answer {
            Some(Ok(resp)) => hit(format!("status:{}", screaming(&format!("{:?}", resp.status)))),
            Some(Err(TransportError::Api(e))) => hit(format!("error:{}", screaming(&format!("{:?}", e.code)))),
            Some(Err(_)) => hit("error:transport".into()),
            None => {}
        }
        if call.request.member_epoch == 0 {
            hit("request:join".into());
        }
        if call.request.leave {
            hit("request:leave".into());
        }
        if !call.request.fenced.is_empty() {
            hit("request:fenced-report".into());
        }
    }
    for call in &facts.records.routings {
        if let Some(Err(TransportError::Api(e))) = &call.answer {
            hit(format!("error:{}", screaming(&format!("{:?}", e.code))));
        }
        if matches!(&call.answer, Some(Ok(r)) if r.lost_version.is_some()) {
            hit("routing:lost-version".into());
        }
    }
    for fault in &facts.plan.faults {
        hit(format!("fault:{}", fault.item.kind()));
    }
    if facts.records.stale_deliveries > 0 {
        hit("situation:stale-delivery".into());
    }
    if facts.fence_refusals > 0 {
        hit("situation:fence-refused".into());
    }
    rules(facts, &mut hit);
    c
}

/// `RevokePending` -> `REVOKE_PENDING`.
fn screaming(camel: &str) -> String {
    let mut out = String::new();
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

/// Names the differences between consecutive recorded states of the group.
fn rules(facts: &Facts<'_>, hit: &mut impl FnMut(String)) {
    let mut before: Option<GroupMetadata> = None;
    for event in facts.history {
        match &event.kind {
            HistoryKind::RolledBack { .. } => hit("store:rolled-back".into()),
            HistoryKind::WriteDropped { .. } => hit("store:write-dropped".into()),
            HistoryKind::IdentityChanged { .. } => hit("store:identity-changed".into()),
            HistoryKind::KeyDeleted { .. } => hit("store:key-deleted".into()),
            _ => {}
        }
        let Some((_, record)) = event.metadata_after.iter().rev().find(|(g, _)| g == facts.group) else { continue };
        let after: Option<GroupMetadata> = record.as_ref().and_then(|r| serde_json::from_str(&r.aggregate).ok());
        match (&before, &after) {
            (None, Some(_)) => hit("rule:group-created".into()),
            (Some(_), None) => hit("rule:group-gone".into()),
            (Some(b), Some(a)) => diff(b, a, hit),
            (None, None) => {}
        }
        before = after;
    }
}

fn diff(b: &GroupMetadata, a: &GroupMetadata, hit: &mut impl FnMut(String)) {
    for (id, m) in &a.members {
        match b.members.get(id) {
            None => hit("rule:join".into()),
            Some(old) if old.incarnation_epoch != m.incarnation_epoch => hit("rule:rejoin".into()),
            Some(old) if old.state != MemberState::Fenced && m.state == MemberState::Fenced => {
                hit("rule:member-fenced".into())
            }
            _ => {}
        }
    }
    for id in b.members.keys().filter(|id| !a.members.contains_key(*id)) {
        let _ = id;
        hit("rule:member-removed".into());
    }
    let shards: BTreeSet<_> = b.current.keys().chain(a.current.keys()).copied().collect();
    for shard in shards {
        match (b.current.get(&shard), a.current.get(&shard)) {
            (None, Some(ShardOwner::Owned { .. })) => hit("rule:grant".into()),
            (Some(ShardOwner::Fenced { .. }), Some(ShardOwner::Owned { .. })) => {
                hit("rule:release-after-fence-wait".into());
                hit("rule:grant".into());
            }
            (Some(ShardOwner::Owned { member: x, .. }), Some(ShardOwner::Owned { member: y, .. })) if x != y => {
                hit("rule:grant".into())
            }
            (Some(ShardOwner::Owned { .. }), Some(ShardOwner::Revoking { .. })) => hit("rule:revoke".into()),
            (Some(ShardOwner::Revoking { member: x, .. }), Some(ShardOwner::Owned { member: y, .. })) => {
                hit(if x == y { "rule:cancel-revoke" } else { "rule:release-on-revoked" }.into())
            }
            (Some(ShardOwner::Revoking { .. }), None) => hit("rule:release-on-revoked".into()),
            (Some(ShardOwner::Owned { .. }), None) => hit("rule:release-on-leave".into()),
            (Some(ShardOwner::Fenced { .. }), None) => hit("rule:release-after-fence-wait".into()),
            (Some(ShardOwner::Owned { .. } | ShardOwner::Revoking { .. }), Some(ShardOwner::Fenced { .. })) => {
                hit("rule:shard-fenced".into())
            }
            _ => {}
        }
        let fence = |o: Option<&ShardOwner>| match o {
            Some(ShardOwner::Owned { member, fence, .. }) => Some((member.clone(), *fence)),
            _ => None,
        };
        if let (Some((x, Some(f))), Some((y, Some(g)))) = (fence(b.current.get(&shard)), fence(a.current.get(&shard))) {
            if x == y && f != g {
                hit("rule:refence".into());
            }
        }
    }
    match (&b.correction, &a.correction) {
        (None, Some(round)) => hit(format!("rule:correction-start:{}", evidence_name(&format!("{:?}", round.reason)))),
        (Some(_), None) => hit("rule:correction-end".into()),
        (Some(x), Some(y)) if y.synced_members.len() > x.synced_members.len() => hit("rule:correction-sync".into()),
        _ => {}
    }
    match (&b.lease_transition, &a.lease_transition) {
        (None, Some(_)) => hit("rule:lease-transition-start".into()),
        (Some(_), None) => hit("rule:lease-transition-end".into()),
        _ => {}
    }
    if a.shard_count > b.shard_count {
        hit("rule:add-shards".into());
    }
    if a.config != b.config {
        hit("rule:config-changed".into());
    }
}

/// The variant name of a loss evidence's `Debug` text (`StoreIdentityChanged { .. }` -> that).
fn evidence_name(debug: &str) -> String {
    let name: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
    screaming(&name).to_ascii_lowercase().replace('_', "-")
}

/// The must-reach list (`fault-plans/must-reach.toml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MustReach {
    /// Items every sweep of `all` must reach at least once.
    pub items: Vec<String>,
}

pub fn load_must_reach(dir: &Path) -> Result<MustReach, String> {
    let path = dir.join("must-reach.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_screaming_snake_case_or_kebab() {
        assert_eq!(screaming("RevokePending"), "REVOKE_PENDING");
        assert_eq!(screaming("Ok"), "OK");
        assert_eq!(evidence_name("StoreIdentityChanged { from: 1 }"), "store-identity-changed");
    }
}
