//! Unit tests of the in-memory Redis: metadata semantics, each fault knob, the history, and the
//! streams. They run on real tokio (and on madsim under `cargo simtest`); time-dependent
//! assertions only use lower bounds on elapsed time, so a slow machine cannot make them fail.

mod faults;
mod metadata;
mod serving;
mod streams;

use crate::core::model::GroupId;
use crate::store::{CasStamp, MetadataStore, WriteOutcome, WriteRequest};

use super::MemoryStore;

fn group() -> GroupId {
    GroupId::new("orders", "billing")
}

fn other_group() -> GroupId {
    GroupId::new("audit:v2", "ledger")
}

/// A write of `aggregate` (writeId `w-<aggregate>`) expecting `expected`, no liveness conditions.
fn request(expected: Option<CasStamp>, aggregate: &str) -> WriteRequest {
    WriteRequest {
        expected,
        aggregate: aggregate.to_string(),
        schema_version: 1,
        layout_version: 1,
        updated_at_ms: 1_700_000_000_000,
        write_id: format!("w-{aggregate}"),
        liveness_guards: Vec::new(),
        liveness_remove: Vec::new(),
    }
}

/// The stamp of the write of `aggregate` (see [`request`]) at `revision`.
fn stamp(revision: u64, aggregate: &str) -> CasStamp {
    CasStamp { revision, write_id: format!("w-{aggregate}") }
}

/// Writes `aggregate` on top of whatever is stored; returns the new revision.
async fn put(store: &MemoryStore, group: &GroupId, aggregate: &str) -> u64 {
    let current = store.load(group).await.expect("load").map(|r| r.cas_stamp());
    match store.write(group, request(current, aggregate)).await.expect("write") {
        WriteOutcome::Written { revision } => revision,
        other => panic!("write of {aggregate} failed: {other:?}"),
    }
}

async fn sleep_ms(ms: u64) {
    crate::time::sleep(std::time::Duration::from_millis(ms)).await;
}
