//! The coordinator's counters that are evidence of trouble, declared once: every increment and
//! the registration at 0 use the same name and help.
//!
//! Prometheus sees a series from its first sample. A counter that first appeared at 1 would make
//! `increase(...[5m])` read 0 across its first event, and the first identity change or version
//! regression of a process is the one that matters (an alert on it would never fire). So the
//! label-less ones are registered at 0 when the coordinator starts ([`LABEL_LESS`]), and the
//! per-group ones that one-shot alerts watch ([`PER_GROUP`]) when this instance first exports
//! the group's gauges. Only those: each is one more series per group on every scrape (all twelve
//! made `/metrics` five times larger); the others are read as rates.

use crate::metrics::Counter;

pub(super) const STORE_IDENTITY_CHANGES: Counter = Counter {
    name: "rsc_store_identity_changes_total",
    help: "Store server identity changes (failover or restart): evidence of lost writes.",
};
pub(super) const TICKS_DEFERRED_WITHOUT_READ: Counter = Counter {
    name: "rsc_ticks_deferred_without_read_total",
    help: "Idle-group deferrals this instance renewed from heartbeats it served, without reading the store.",
};
pub(super) const HEARD_RELAY_FAILURES: Counter = Counter {
    name: "rsc_heard_relay_failures_total",
    help: "Heard-relay exchanges the store failed (owners then read the groups whose heartbeats this instance served).",
};
pub(super) const HEARD_RELAY_BLOBS_SENT: Counter = Counter {
    name: "rsc_heard_relay_blobs_sent_total",
    help:
        "Blobs of heard heartbeats this instance left for the tick owners of the groups (one per owner and exchange).",
};
pub(super) const HEARD_RELAY_WINDOWS_RESTARTED: Counter = Counter {
    name: "rsc_heard_relay_windows_restarted_total",
    help:
        "Member liveness windows restarted by heartbeats other instances relayed (news above the counter known here).",
};
pub(super) const TICK_FAILURES: Counter = Counter {
    name: "rsc_group_tick_failures_total",
    help: "Ticks of a group that failed (the store refused or did not answer): its members are not expired meanwhile.",
};
pub(super) const GROUP_INDEX_FAILURES: Counter = Counter {
    name: "rsc_group_index_failures_total",
    help: "Group index additions the store failed (after a create, or healing a group heartbeats showed unlisted): such a group is not ticked until an index write succeeds.",
};

pub(super) const METADATA_VERSION_REGRESSIONS: Counter = Counter {
    name: "rsc_metadata_version_regressions_total",
    help: "Times a read issued after this coordinator observed a revision returned a lower one.",
};
pub(super) const CLIENT_METADATA_VERSION_AHEAD: Counter = Counter {
    name: "rsc_client_metadata_version_ahead_total",
    help: "Client requests (heartbeats, routing refreshes) reporting a metadataVersion above the stored one.",
};
pub(super) const METADATA_REVISION_CONFLICTS: Counter = Counter {
    name: "rsc_metadata_revision_conflicts_total",
    help: "Metadata writes whose loaded (revision, writeId) was no longer stored; retried.",
};
pub(super) const LIVENESS_GUARD_CONFLICTS: Counter = Counter {
    name: "rsc_liveness_guard_conflicts_total",
    help: "Expiry decisions dropped because the member heartbeated meanwhile.",
};
pub(super) const METADATA_CAS_GIVE_UPS: Counter = Counter {
    name: "rsc_metadata_cas_give_ups_total",
    help: "Critical sections abandoned after cas_attempts_max lost CAS races (answered STORE_UNAVAILABLE).",
};
pub(super) const FENCES_RAISED: Counter = Counter {
    name: "rsc_fences_raised_total",
    help: "Shard fences raised at Redis before recording a grant (DESIGN §10).",
};
pub(super) const REDIS_MUTEX_GIVE_UPS: Counter = Counter {
    name: "rsc_redis_mutex_give_ups_total",
    help: "Critical sections abandoned because the group mutex stayed busy (answered STORE_UNAVAILABLE).",
};
pub(super) const METADATA_SCHEMA_ERRORS: Counter = Counter {
    name: "rsc_metadata_schema_errors_total",
    help: "Stored metadata with an unknown schema/layout version, an unparsable aggregate or a malformed hash.",
};
pub(super) const SHARDS_FENCED: Counter = Counter {
    name: "rsc_shards_fenced_total",
    help: "Shards taken from a member that may still hold them (fenced by the rebalance timeout, or it left or rejoined while its lease ran): free again one assignment lease later.",
};
pub(super) const MEMBERS_EXPIRED: Counter =
    Counter { name: "rsc_members_expired_total", help: "Members a tick removed after a member TTL of silence." };
pub(super) const MEMBERS_FENCED: Counter = Counter {
    name: "rsc_members_fenced_total",
    help: "Members fenced for not draining or syncing within rebalanceTimeoutMs (they must rejoin).",
};
pub(super) const LOST_ADD_SHARDS_HEALED: Counter = Counter {
    name: "rsc_lost_add_shards_healed_total",
    help: "Routing refreshes that re-added the shards of an add-shards the store lost (a producer published with more shards than recorded).",
};

pub(super) const GROUP_BUSY_REFUSALS: Counter = Counter {
    name: "rsc_group_busy_refusals_total",
    help: "Requests refused STORE_UNAVAILABLE because as many of their group's requests were already in or waiting for its critical section on this instance as one group may hold (a quarter of concurrency_max).",
};

/// Registered at 0 when the coordinator starts.
pub(super) const LABEL_LESS: [&Counter; 8] = [
    &STORE_IDENTITY_CHANGES,
    &TICKS_DEFERRED_WITHOUT_READ,
    &HEARD_RELAY_FAILURES,
    &HEARD_RELAY_BLOBS_SENT,
    &HEARD_RELAY_WINDOWS_RESTARTED,
    &GROUP_INDEX_FAILURES,
    &TICK_FAILURES,
    &GROUP_BUSY_REFUSALS,
];

/// Registered at 0 (`group` label) when this instance first exports the group's gauges: the
/// counters of the suggested `increase(...) > 0` alerts.
pub(super) const PER_GROUP: [&Counter; 4] =
    [&METADATA_VERSION_REGRESSIONS, &METADATA_SCHEMA_ERRORS, &MEMBERS_EXPIRED, &MEMBERS_FENCED];
