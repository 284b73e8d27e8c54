//! Invariant 6, **liveness**: after the plan's faults heal (`heal_ms`), within the plan's bound
//! (`liveness_bound_ms`) every shard is read by a live member and nobody stays in
//! `REVOKE_PENDING` / `SYNC_METADATA`.
//!
//! Judged over the window from `heal_ms + liveness_bound_ms` to the end of the run (the plan
//! guarantees it holds at least two heartbeat intervals): a *live member* is a consumer process
//! still running at the end. Every shard of the final recorded state must be read (an executed
//! XREADGROUP or XAUTOCLAIM issued in the window) by a live member, and each live member must have
//! received a successful heartbeat answer in the window, the last of which is `OK`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rsc::core::model::ShardId;
use rsc::core::protocol::HeartbeatStatus;
use rsc::store::EntryId;

use super::Facts;
use crate::plan::{NodeRef, Role};
use crate::records::{ProcessId, Us};

/// A violation of invariant 6 (liveness).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 6: at the end the group has no readable recorded state (deleted, corrupt).
    GroupUnavailable { at_us: Us },
    /// Invariant 6: no consumer process is alive at the end.
    NoLiveConsumer { at_us: Us },
    /// Invariant 6: a shard was not read by any live member after the liveness deadline.
    ShardNotRead { shard: ShardId, at_us: Us },
    /// Invariant 6: a live member got no successful heartbeat answer after the deadline.
    NoHeartbeat { process: ProcessId, at_us: Us },
    /// Invariant 6: a live member's last answer is still `REVOKE_PENDING` / `SYNC_METADATA`.
    Stuck { process: ProcessId, status: HeartbeatStatus, at_us: Us },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::GroupUnavailable { .. } => "group-unavailable-after-heal",
            Violation::NoLiveConsumer { .. } => "no-live-consumer",
            Violation::ShardNotRead { .. } => "shard-not-read-after-heal",
            Violation::NoHeartbeat { .. } => "no-heartbeat-after-heal",
            Violation::Stuck { .. } => "stuck-after-heal",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::GroupUnavailable { at_us }
            | Violation::NoLiveConsumer { at_us }
            | Violation::ShardNotRead { at_us, .. }
            | Violation::NoHeartbeat { at_us, .. }
            | Violation::Stuck { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::GroupUnavailable { .. } => f.write_str("the group has no readable recorded state at the end"),
            Violation::NoLiveConsumer { .. } => f.write_str("no consumer process is alive at the end"),
            Violation::ShardNotRead { shard, .. } => {
                write!(f, "shard {shard} was not read by a live member between the liveness deadline and the end")
            }
            Violation::NoHeartbeat { process, .. } => {
                write!(f, "{process} got no successful heartbeat answer between the liveness deadline and the end")
            }
            Violation::Stuck { process, status, .. } => write!(f, "{process} is still answered {status:?} at the end"),
        }
    }
}

/// Checks invariant 6.
pub fn check(facts: &Facts<'_>) -> Vec<Violation> {
    let deadline_us = facts.plan.durations.live_by_ms() * 1_000;
    let at_us = deadline_us;
    let Some(state) = facts.final_state() else { return vec![Violation::GroupUnavailable { at_us }] };
    let live: BTreeSet<ProcessId> = facts
        .records
        .lifecycles
        .iter()
        .filter(|l| l.process.node.role == Role::Consumer && l.stopped_at_us.is_none())
        .map(|l| l.process)
        .collect();
    if live.is_empty() {
        return vec![Violation::NoLiveConsumer { at_us }];
    }
    let mut violations = Vec::new();
    // A shard is attended by a read, or by a doorbell wait on it (an idle shard is watched, not
    // re-read: the wait returns as soon as an entry arrives) — but only a wait that was right to
    // wait: no entry the server had added by then lies after the id it waited after. A consumer
    // watching from a wrong id while entries pile up attends nothing.
    let newest = NewestAdded::of(facts);
    let justified = |w: &crate::records::WatchEvent| {
        // Entries a split brain's old primary added are not at the primary (they went with it).
        w.after.is_some_and(|after| newest.by(w.server, &w.stream, w.served_at_us).is_none_or(|id| id <= after))
    };
    let in_window = |at_us: Us, process: &ProcessId| at_us >= deadline_us && live.contains(process);
    let reads = facts.records.reads.iter().map(|r| (r.issued_at_us, r.process, r.stream.as_str()));
    let watches = facts
        .records
        .watches
        .iter()
        // By when the wait ended: a wait that spans the deadline watched the shard into the
        // window (a consumer idle on a one-second doorbell, with a window of a second, may issue
        // no wait inside it that ends before the run does).
        .filter(|w| in_window(w.served_at_us, &w.process) && justified(w))
        .map(|w| (w.served_at_us, w.process, w.stream.as_str()));
    // And a shard a live member is busy with at the end is attended: its processing of an entry
    // of the shard, not cancelled, was still running within a poll interval and a second of the
    // end (its next read follows the batch, maybe after the end). A window shorter than the
    // longest batch (a shrunk capsule's: 2 s after the deadline) must not read as neglect; a
    // processing that ended earlier, or was cancelled because the shard was lost, attends nothing
    // (a review of the first version, which counted any processing that reached the deadline).
    let busy_since_us = facts.end_us.saturating_sub(facts.plan.workload.poll_interval_ms * 1_000 + 1_000_000);
    let processing = facts
        .records
        .processing
        .iter()
        .filter(|p| p.completed || p.end_us.is_none())
        .filter(|p| p.end_us.is_none_or(|end| end >= busy_since_us.max(deadline_us)))
        .map(|p| (p.start_us.max(deadline_us), p.process, p.stream.as_str()));
    let read: BTreeSet<ShardId> = reads
        .chain(watches)
        .chain(processing)
        .filter(|(at_us, process, _)| in_window(*at_us, process))
        .filter_map(|(_, _, stream)| facts.shard_of(stream))
        .collect();
    for shard in (0..state.shard_count).filter(|s| !read.contains(s)) {
        violations.push(Violation::ShardNotRead { shard, at_us });
    }
    let mut last: BTreeMap<ProcessId, HeartbeatStatus> = BTreeMap::new();
    let mut answers: Vec<(Us, ProcessId, HeartbeatStatus)> = facts
        .records
        .heartbeats
        .iter()
        .filter_map(|c| c.seen_ok().map(|(resp, at)| (at, c.process, resp.status)))
        .filter(|(at, process, _)| *at >= deadline_us && live.contains(process))
        .collect();
    answers.sort_unstable();
    for (_, process, status) in answers {
        last.insert(process, status);
    }
    for process in &live {
        match last.get(process) {
            None => violations.push(Violation::NoHeartbeat { process: *process, at_us }),
            Some(HeartbeatStatus::Ok) => {}
            Some(status) => violations.push(Violation::Stuck { process: *process, status: *status, at_us }),
        }
    }
    violations
}

/// Per (server, stream), the XADDs the server executed in the order it served them, each with
/// the largest id added up to then: "the newest entry the server had by instant t" is one binary
/// search, where scanning every XADD per doorbell wait made this checker quadratic.
struct NewestAdded<'a> {
    by_stream: BTreeMap<(NodeRef, &'a str), Vec<(Us, EntryId)>>,
}

impl<'a> NewestAdded<'a> {
    fn of(facts: &Facts<'a>) -> Self {
        let mut by_stream: BTreeMap<(NodeRef, &'a str), Vec<(Us, EntryId)>> = BTreeMap::new();
        for add in &facts.records.adds {
            by_stream.entry((add.server, add.stream.as_str())).or_default().push((add.served_at_us, add.id));
        }
        for adds in by_stream.values_mut() {
            adds.sort_unstable();
            let mut newest: Option<EntryId> = None;
            for (_, id) in adds.iter_mut() {
                let max = newest.map_or(*id, |n| n.max(*id));
                newest = Some(max);
                *id = max;
            }
        }
        Self { by_stream }
    }

    /// The largest id `server` had added to `stream` by `at_us` (served at or before it).
    fn by(&self, server: NodeRef, stream: &str, at_us: Us) -> Option<EntryId> {
        let adds = self.by_stream.get(&(server, stream))?;
        let served = adds.partition_point(|(served_at_us, _)| *served_at_us <= at_us);
        served.checked_sub(1).map(|last| adds[last].1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn every_shard_read_and_every_member_ok_after_the_deadline_is_live() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        let mut g = w.group_with_member("consumer-1", &[0, 1]);
        g.shard_count = 2;
        w.store(1_000, &g, 1);
        let late = w.deadline_us() + 100_000;
        w.answer(a, late, HeartbeatStatus::Ok, &[0], 8_000);
        w.answer(b, late, HeartbeatStatus::Ok, &[1], 8_000);
        w.reads(a, 0, late + 1..=late + 1, 1);
        w.reads(b, 1, late + 1..=late + 1, 1);
        assert_eq!(check(&w.facts()), vec![]);
    }

    /// A one-shard group whose one member was answered OK right after the deadline: the member
    /// and the deadline.
    fn one_shard_member() -> (World, ProcessId, Us) {
        let mut w = World::new();
        let a = w.consumer(1);
        let mut g = w.group_with_member("consumer-1", &[0]);
        g.shard_count = 1;
        w.store(1_000, &g, 1);
        let deadline = w.deadline_us();
        w.answer(a, deadline + 1, HeartbeatStatus::Ok, &[0], 8_000);
        (w, a, deadline)
    }

    /// A shard whose entries a live member is still processing at the end (or finished within a
    /// poll interval and a second of it) is attended; one whose processing ended well before the
    /// end, or was cancelled, is not.
    #[test]
    fn a_shard_a_live_member_is_busy_with_at_the_end_is_attended() {
        let end = World::new().facts().end_us;
        let busy_for = World::new().facts().plan.workload.poll_interval_ms * 1_000 + 1_000_000;
        for (processing_end, cancelled, attended) in [
            (None, false, true),
            (Some(end - busy_for + 1), false, true),
            (Some(end - busy_for - 1), false, false),
            (Some(end - 1), true, false),
        ] {
            let (mut w, a, deadline) = one_shard_member();
            let p = w.producer(1);
            let e = w.add(p, 0, deadline - 3_000_000);
            w.read_ids(a, 0, deadline - 2_000_000, &[e]);
            match (processing_end, cancelled) {
                (Some(until), true) => w.cancel_entry(a, 0, e, deadline - 1_900_000, until),
                (until, _) => w.process_entry(a, 0, e, deadline - 1_900_000, until),
            }
            let kinds: Vec<&str> = check(&w.facts()).iter().map(super::super::Violation::kind).collect();
            assert_eq!(kinds.is_empty(), attended, "processing until {processing_end:?}: {kinds:?}");
        }
    }

    /// A doorbell wait issued before the deadline that ended after it watched the shard into the
    /// window; one that ended before it did not.
    #[test]
    fn a_wait_that_spans_the_deadline_attends_its_shard() {
        for (served_offset, attended) in [(1_000_i64, true), (-1_000, false)] {
            let (mut w, a, deadline) = one_shard_member();
            let stream = w.stream(0);
            w.records.watches.push(crate::records::WatchEvent {
                process: a,
                server: crate::plan::NodeRef::REDIS,
                stream,
                issued_at_us: deadline - 500_000,
                served_at_us: deadline.saturating_add_signed(served_offset),
                after: Some(rsc::store::EntryId { ms: 0, seq: 0 }),
            });
            let kinds: Vec<&str> = check(&w.facts()).iter().map(super::super::Violation::kind).collect();
            assert_eq!(kinds.is_empty(), attended, "served at {served_offset:+} us: {kinds:?}");
        }
    }

    #[test]
    fn an_unread_shard_a_stuck_member_and_a_dead_reader_are_reported() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        let mut g = w.group_with_member("consumer-1", &[0, 1]);
        g.shard_count = 2;
        w.store(1_000, &g, 1);
        let late = w.deadline_us() + 100_000;
        w.answer(a, late, HeartbeatStatus::Ok, &[0], 8_000);
        w.answer(b, late, HeartbeatStatus::RevokePending, &[1], 8_000);
        w.reads(a, 0, late + 1..=late + 1, 1);
        w.reads(b, 1, late + 1..=late + 1, 1);
        w.kill(b, late + 2);
        let kinds: Vec<&str> = check(&w.facts()).iter().map(super::super::Violation::kind).collect();
        // b is dead: its read does not count and its status no longer matters.
        assert_eq!(kinds, vec!["shard-not-read-after-heal"]);
        w.revive_and_keep(b);
        let kinds: Vec<&str> = check(&w.facts()).iter().map(super::super::Violation::kind).collect();
        assert_eq!(kinds, vec!["stuck-after-heal"]);
    }
}
