//! What each consumer process was told by the coordinators, in the order it learned it: the
//! heartbeat answers its transport actually handed to it (answers hidden by a response-loss fault
//! and answers that never arrived are not "told"). Shared by the consumer fail-closed checker
//! (which recomputes leases from it) and the split-ownership checker (which ends a tenure where
//! the process was told to stop).

use std::collections::{BTreeMap, BTreeSet};

use rsc::client::TransportError;
use rsc::core::model::ShardId;
use rsc::core::protocol::{ErrorCode, HeartbeatStatus};

use crate::records::{ProcessId, Records, Us};

/// One answer a consumer process saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Told {
    pub received_at_us: Us,
    /// Send time of the heartbeat it answered (the lease counts from here).
    pub sent_at_us: Us,
    pub what: Said,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Said {
    /// A successful heartbeat response.
    Granted { status: HeartbeatStatus, assigned: BTreeSet<ShardId>, lease_us: Us },
    /// `FENCED_MEMBER_EPOCH` or `UNKNOWN_MEMBER`: stop every shard at once.
    Fenced(ErrorCode),
}

impl Said {
    /// Whether this answer withdraws `shard` (the process must not read it afterwards without a
    /// new grant).
    pub fn withdraws(&self, shard: ShardId) -> bool {
        match self {
            Said::Granted { assigned, .. } => !assigned.contains(&shard),
            Said::Fenced(_) => true,
        }
    }
}

/// Per consumer process, everything it was told, by receive time.
#[derive(Debug, Default)]
pub struct Grants {
    told: BTreeMap<ProcessId, Vec<Told>>,
}

impl Grants {
    pub fn from_records(records: &Records) -> Self {
        let mut told: BTreeMap<ProcessId, Vec<Told>> = BTreeMap::new();
        for call in &records.heartbeats {
            let what = if let Some((resp, _)) = call.seen_ok() {
                Said::Granted {
                    status: resp.status,
                    assigned: resp.assigned.iter().copied().collect(),
                    lease_us: resp.assignment_lease_ms * 1_000,
                }
            } else if let Some((TransportError::Api(e), _)) = call.seen_error() {
                match e.code {
                    ErrorCode::FencedMemberEpoch | ErrorCode::UnknownMember => Said::Fenced(e.code),
                    _ => continue,
                }
            } else {
                continue;
            };
            let Some(received_at_us) = call.received_at_us else { continue };
            told.entry(call.process).or_default().push(Told { received_at_us, sent_at_us: call.sent_at_us, what });
        }
        for answers in told.values_mut() {
            answers.sort_by_key(|t| t.received_at_us);
        }
        Self { told }
    }

    /// Everything `process` was told, by receive time.
    pub fn of(&self, process: ProcessId) -> &[Told] {
        self.told.get(&process).map_or(&[], Vec::as_slice)
    }

    /// Whether `process` was told to stop `shard` at some instant in `(after, until]`.
    pub fn withdrawn_between(&self, process: ProcessId, shard: ShardId, after: Us, until: Us) -> bool {
        let told = self.of(process);
        let start = told.partition_point(|t| t.received_at_us <= after);
        told[start..].iter().take_while(|t| t.received_at_us <= until).any(|t| t.what.withdraws(shard))
    }
}
