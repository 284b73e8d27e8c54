//! Invariant 3, **producer fail-closed**: no XADD on a routing view older than its cache TTL.
//!
//! From the producer's transport records and the Redis node's add log: an XADD the server executed
//! is judged at the instant the producer issued it (the instant of its cache check). It needs a
//! routing response the producer *received* before that instant whose request was *sent* no more
//! than that response's `routing_cache_ttl_ms` earlier (the view's lease counts from the send
//! time, like the consumer's), and the XADD's shard must exist in the *latest* view it received
//! before that instant: a later answer replaces an earlier view (and one carrying `lostVersion`
//! tells the producer its view was lost), so publishing by a shard only an older view had is
//! publishing outside routing, even while the older view's TTL runs.

use std::collections::BTreeMap;
use std::fmt;

use rsc::core::model::ShardId;

use super::Facts;
use crate::records::{fmt_us, ProcessId, Us};

/// A violation of invariant 3 (producer fail-closed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 3: an XADD with no routing view fetched within its cache TTL (`last_fetch_us`:
    /// send time of the last view received before it, if any).
    PublishOnExpiredRouting { process: ProcessId, stream: String, at_us: Us, last_fetch_us: Option<Us> },
    /// Invariant 3: an XADD to a shard the latest routing view received before it does not have.
    PublishOutsideRouting { process: ProcessId, stream: String, at_us: Us, shard_count: u32 },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::PublishOnExpiredRouting { .. } => "publish-on-expired-routing",
            Violation::PublishOutsideRouting { .. } => "publish-outside-routing",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::PublishOnExpiredRouting { at_us, .. } | Violation::PublishOutsideRouting { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::PublishOnExpiredRouting { process, stream, last_fetch_us, .. } => match last_fetch_us {
                Some(at) => {
                    write!(f, "{process} XADD {stream} on a view fetched at {}s, past its TTL", fmt_us(*at).trim())
                }
                None => write!(f, "{process} XADD {stream} without ever receiving a routing view"),
            },
            Violation::PublishOutsideRouting { process, stream, shard_count, .. } => {
                write!(f, "{process} XADD {stream}: the latest view it received has {shard_count} shards")
            }
        }
    }
}

/// A routing view a producer received: (received, sent, lease end, shard count, metadata
/// version, the version it declared lost or 0), by receive time.
type View = (Us, Us, Us, u32, u64, u64);

/// Checks invariant 3 for every producer process.
pub fn check(facts: &Facts<'_>) -> Vec<Violation> {
    let mut views: BTreeMap<ProcessId, Vec<View>> = BTreeMap::new();
    for call in &facts.records.routings {
        if let Some((resp, received)) = call.seen_ok() {
            // The view's lease ends when the producer's own clock advanced the TTL (a drifting
            // clock moves that instant; see `Facts::clock_deadline_us`).
            let ttl_us = resp.routing_cache_ttl_ms * 1_000;
            let view = (
                received,
                call.sent_at_us,
                facts.clock_deadline_us(call.process.node, call.sent_at_us, ttl_us),
                resp.shard_count,
                resp.metadata_version,
                resp.lost_version.unwrap_or(0),
            );
            views.entry(call.process).or_default().push(view);
        }
    }
    for list in views.values_mut() {
        list.sort_unstable();
    }
    let mut violations = Vec::new();
    let mut reported_expired = std::collections::BTreeSet::new();
    for add in &facts.records.adds {
        let at_us = add.issued_at_us;
        let received: &[View] = views.get(&add.process).map_or(&[], |v| {
            let end = v.partition_point(|(received, ..)| *received <= at_us);
            &v[..end]
        });
        // Judged on the view in force: its lease is the producer's (a replaced view's longer
        // lease no longer counts).
        let latest = latest_view(received);
        let process = add.process;
        let stream = add.stream.clone();
        if latest.is_none_or(|(_, _, ends, ..)| at_us > *ends) {
            let last_fetch_us = received.iter().map(|(_, sent, ..)| *sent).max();
            // One report per producer per expired view, not per publish.
            if reported_expired.insert((process, last_fetch_us)) {
                violations.push(Violation::PublishOnExpiredRouting { process, stream, at_us, last_fetch_us });
            }
            continue;
        }
        let shard: Option<ShardId> = facts.shard_of(&add.stream);
        let shard_count = latest.map_or(0, |(_, _, _, count, ..)| *count);
        if shard.is_none_or(|s| s >= shard_count) {
            violations.push(Violation::PublishOutsideRouting { process, stream, at_us, shard_count });
        }
    }
    violations
}

/// The view in force after `received` (in receive order). An answer replaces the view when its
/// request was sent after every request answered so far (the latest request: also when it names
/// an older version — a rollback the store really went through), or when it names a newer
/// metadata version than the view's that no answer so far declared lost (`lostVersion`): an
/// older request the coordinator served late (a request delayed on its way in) carries a later
/// state of the group, whatever the send order — unless a later answer already said the store
/// lost that state. Any other late answer is stale and replaces nothing.
fn latest_view(received: &[View]) -> Option<&View> {
    let mut held: Option<&View> = None;
    let mut latest_sent = 0;
    let mut declared_lost = 0;
    for view in received {
        let newer_state = |h: &View| view.4 > h.4 && view.4 > declared_lost;
        if held.is_none_or(|h| view.1 >= latest_sent || newer_state(h)) {
            held = Some(view);
        }
        latest_sent = latest_sent.max(view.1);
        declared_lost = declared_lost.max(view.5);
    }
    held
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn publishing_within_the_ttl_of_the_send_time_is_clean_and_after_it_is_not() {
        let mut w = World::new();
        let p = w.producer(1);
        // Sent at 1 s, received at 1.5 s, TTL 10 s: fresh until 11 s.
        w.routing(p, 1_000_000, 1_500_000, 10_000, 4);
        w.add(p, 0, 1_600_000);
        w.add(p, 3, 11_000_000);
        assert_eq!(check(&w.facts()), vec![]);
        w.add(p, 1, 11_000_001);
        w.add(p, 1, 12_000_000);
        let violations = check(&w.facts());
        assert_eq!(violations.len(), 1, "one report per expired view: {violations:?}");
        assert!(matches!(&violations[0], Violation::PublishOnExpiredRouting { last_fetch_us: Some(1_000_000), .. }));
    }

    #[test]
    fn a_view_counts_only_once_received_and_shards_must_exist_in_it() {
        let mut w = World::new();
        let p = w.producer(1);
        w.routing(p, 1_000_000, 1_500_000, 10_000, 4);
        w.add(p, 0, 1_200_000); // before the view arrived
        w.add(p, 4, 2_000_000); // shard 4 of 4 shards
        let violations = check(&w.facts());
        assert!(
            matches!(
                &violations[..],
                [
                    Violation::PublishOnExpiredRouting { last_fetch_us: None, .. },
                    Violation::PublishOutsideRouting { shard_count: 4, .. },
                ]
            ),
            "{violations:?}"
        );
    }

    #[test]
    fn a_late_answer_to_an_older_request_replaces_the_view_only_with_a_newer_version() {
        let mut w = World::new();
        let p = w.producer(1);
        // Sent at 1 s and delayed on its way in: served after an add-shards (version 3, 8 shards).
        w.routing(p, 1_000_000, 2_000_000, 10_000, 8);
        w.set_last_routing_version(3);
        // Sent at 1.5 s, served before the add-shards (version 2, 6 shards), answered first.
        w.routing(p, 1_500_000, 1_600_000, 10_000, 6);
        w.set_last_routing_version(2);
        w.add(p, 7, 1_800_000); // the 6-shard view is the latest: outside routing
        w.add(p, 7, 2_100_000); // the 8-shard view of version 3 replaced it: fine (swarm 5930)
                                // A late answer of an older request with an older version replaces nothing.
        w.routing(p, 1_200_000, 2_500_000, 10_000, 6);
        w.set_last_routing_version(2);
        w.add(p, 7, 2_600_000);
        let violations = check(&w.facts());
        assert!(
            matches!(&violations[..], [Violation::PublishOutsideRouting { shard_count: 6, at_us: 1_800_000, .. }]),
            "{violations:?}"
        );
    }

    #[test]
    fn a_late_answer_of_a_version_an_answer_declared_lost_replaces_nothing() {
        let mut w = World::new();
        let p = w.producer(1);
        // Sent at 1 s, served at version 5 (8 shards) before the store lost it; answered late.
        w.routing(p, 1_000_000, 2_000_000, 10_000, 8);
        w.set_last_routing_version(5);
        // Sent at 1.5 s and answered first: the store is back at version 4 (6 shards), 5 is lost.
        w.routing(p, 1_500_000, 1_600_000, 10_000, 6);
        w.set_last_routing_version(4);
        w.set_last_routing_lost_version(5);
        w.add(p, 7, 2_100_000); // by the lost view: outside routing
        let violations = check(&w.facts());
        assert!(
            matches!(&violations[..], [Violation::PublishOutsideRouting { shard_count: 6, at_us: 2_100_000, .. }]),
            "{violations:?}"
        );
    }

    #[test]
    fn a_view_replaced_by_a_late_newer_version_lends_it_no_lease() {
        let mut w = World::new();
        let p = w.producer(1);
        w.routing(p, 1_000_000, 2_000_000, 10_000, 8); // version 3, lease to 11 s
        w.set_last_routing_version(3);
        w.routing(p, 1_500_000, 1_600_000, 10_000, 6); // version 2, lease to 11.5 s, replaced
        w.set_last_routing_version(2);
        w.add(p, 7, 10_900_000);
        w.add(p, 7, 11_200_000); // the view in force expired at 11 s
        let violations = check(&w.facts());
        assert!(
            matches!(&violations[..], [Violation::PublishOnExpiredRouting { at_us: 11_200_000, .. }]),
            "{violations:?}"
        );
    }

    #[test]
    fn a_shard_only_a_replaced_view_had_is_outside_routing_even_within_that_views_ttl() {
        let mut w = World::new();
        let p = w.producer(1);
        w.routing(p, 1_000_000, 1_100_000, 10_000, 8); // 8 shards (an add-shards the store later lost)
        w.routing(p, 4_000_000, 4_100_000, 10_000, 6); // the store's view after the loss: 6 shards
        w.add(p, 7, 3_000_000); // shard 7 while the 8-shard view was the latest: fine
        w.add(p, 7, 5_000_000); // after the 6-shard view replaced it: outside routing
        let violations = check(&w.facts());
        assert!(
            matches!(&violations[..], [Violation::PublishOutsideRouting { shard_count: 6, at_us: 5_000_000, .. }]),
            "{violations:?}"
        );
    }
}
