//! The forger: an authenticated but malicious client on the operator's node (issue #9). It holds
//! a valid client token and knows everything a live consumer's answers carry — member id, epochs,
//! versions, assigned shards and revoke ids (it reads them from the run's records, which is more
//! than a real attacker sees) — but never the consumer's session secret, which stays in its
//! process. Its requests are not recorded as any consumer's: the checkers judge only what the
//! honest processes did, so an accepted forgery shows up as what it causes (two readers of a
//! shard, a correction round without a cause), never as the forger's own claim.
//!
//! The `n`-th forgery, by `n % 5`: a leave reporting every shard REVOKED without a session; the
//! same with a wrong session; a steady heartbeat with a wrong session; a join of the victim's id
//! with another session; loss evidence (a version and a shard count above the recorded ones)
//! without any token; the same loss evidence with the token, carrying the victim's proof of its
//! real version (a proof of another number); and a heartbeat of a member id nobody joined, with
//! an epoch and a version ahead (DESIGN §8: a report above the recorded state is evidence only
//! with its proof).

use rsc::client::CoordinatorTransport;
use rsc::core::protocol::{HeartbeatRequest, HeartbeatResponse, MemberSession, RevokeReport, RoutingReport};

use crate::plan::Role;
use crate::programs::{Env, SIM_CLIENT_TOKEN};
use crate::records::ProcessId;

/// Sends forgery number `n` against a live consumer (none alive: nothing).
pub async fn forge(env: Env, process: ProcessId, n: u64) {
    let Some(victim) = victim(&env, n) else { return };
    let wrong = MemberSession(format!("{:032x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1));
    let what = match n % KINDS {
        0 => "leave without a session",
        1 => "leave with a wrong session",
        2 => "steady heartbeat with a wrong session",
        3 => "join of a live member's id",
        4 => "loss evidence without a token",
        5 => "unproven loss evidence with a token",
        _ => "heartbeat of an unknown member naming a version ahead",
    };
    let answer = if matches!(n % KINDS, 4 | 5) {
        let report = RoutingReport {
            known_version: victim.metadata_version.saturating_add(1_000),
            known_shard_count: victim.shard_count.saturating_add(8),
            known_version_proof: victim.metadata_version_proof,
            known_shard_count_proof: None,
        };
        let token = (n % KINDS == 5).then_some(SIM_CLIENT_TOKEN);
        let transport = env.raw_transport(token).await;
        transport.routing(&env.group, report).await.map(|r| format!("answered: {} shards", r.shard_count))
    } else {
        let request = forged_heartbeat(&env, &victim, n, wrong);
        let transport = env.raw_transport(Some(SIM_CLIENT_TOKEN)).await;
        transport.heartbeat(request).await.map(|r| format!("accepted: {:?}", r.status))
    };
    env.recorder.trace(process, format!("forged {what} for {}: {answer:?}", victim.member_id));
}

/// How many kinds of forgery the forger cycles through.
const KINDS: u64 = 7;

/// The heartbeat of forgery `n` for `victim`'s incarnation, as its latest answer describes it.
fn forged_heartbeat(env: &Env, victim: &HeartbeatResponse, n: u64, wrong: MemberSession) -> HeartbeatRequest {
    let released: Vec<RevokeReport> = victim
        .assigned
        .iter()
        .map(|&shard| RevokeReport { shard, in_flight: 0, revoked: true, revoke_id: None })
        .chain(victim.drains.iter().map(|d| RevokeReport {
            shard: d.shard,
            in_flight: 0,
            revoked: true,
            revoke_id: Some(d.revoke_id),
        }))
        .collect();
    let steady = HeartbeatRequest {
        group: env.group.clone(),
        member_id: victim.member_id.clone(),
        member_epoch: victim.member_epoch,
        metadata_version: victim.metadata_version,
        assignment_epoch: victim.assignment_epoch,
        owned: victim.assigned.clone(),
        revoking: Vec::new(),
        leave: false,
        member_session: Some(wrong),
        fenced: Vec::new(),
        metadata_version_proof: victim.metadata_version_proof,
    };
    match n % KINDS {
        0 => HeartbeatRequest { owned: Vec::new(), revoking: released, leave: true, member_session: None, ..steady },
        1 => HeartbeatRequest { owned: Vec::new(), revoking: released, leave: true, ..steady },
        2 => steady,
        6 => HeartbeatRequest {
            member_id: format!("forged-{n}"),
            metadata_version: victim.metadata_version.saturating_add(1_000),
            owned: Vec::new(),
            ..steady
        },
        _ => {
            HeartbeatRequest { member_epoch: 0, metadata_version: 0, assignment_epoch: 0, owned: Vec::new(), ..steady }
        }
    }
}

/// The latest answer of a live consumer, chosen by `n` among them (in process order).
fn victim(env: &Env, n: u64) -> Option<HeartbeatResponse> {
    let records = env.recorder.lock();
    let live = |p: &ProcessId| {
        p.node.role == Role::Consumer && records.lifecycles.iter().any(|l| l.process == *p && l.stopped_at_us.is_none())
    };
    let mut latest: std::collections::BTreeMap<ProcessId, (u64, &HeartbeatResponse)> = Default::default();
    for call in records.heartbeats.iter().filter(|c| live(&c.process)) {
        if let Some((resp, at)) = call.seen_ok() {
            let entry = latest.entry(call.process).or_insert((at, resp));
            if at >= entry.0 {
                *entry = (at, resp);
            }
        }
    }
    let candidates: Vec<&HeartbeatResponse> = latest.values().map(|(_, r)| *r).collect();
    let count = u64::try_from(candidates.len()).ok().filter(|c| *c > 0)?;
    let index = usize::try_from(n / KINDS % count).ok()?;
    candidates.get(index).map(|r| (*r).clone())
}
