//! Unit tests of the in-memory Redis: metadata semantics, each fault knob, the history, and the
//! streams. They run on real tokio (and on madsim under `cargo simtest`); time-dependent
//! assertions only use lower bounds on elapsed time, so a slow machine cannot make them fail.

mod faults;
mod metadata;
mod streams;

use crate::core::model::GroupId;
use crate::store::{MetadataStore, WriteOutcome, WriteRequest};

use super::MemoryStore;

fn group() -> GroupId {
    GroupId::new("orders", "billing")
}

fn other_group() -> GroupId {
    GroupId::new("audit:v2", "ledger")
}

/// A write of `aggregate` expecting `expected_revision`, no liveness conditions.
fn request(expected_revision: Option<u64>, aggregate: &str) -> WriteRequest {
    WriteRequest {
        expected_revision,
        aggregate: aggregate.to_string(),
        schema_version: 1,
        layout_version: 1,
        updated_at_ms: 1_700_000_000_000,
        write_id: format!("w-{aggregate}"),
        liveness_guards: Vec::new(),
        liveness_remove: Vec::new(),
    }
}

/// Writes `aggregate` on top of whatever is stored; returns the new revision.
async fn put(store: &MemoryStore, group: &GroupId, aggregate: &str) -> u64 {
    let current = store.load(group).await.expect("load").map(|r| r.revision);
    match store.write(group, request(current, aggregate)).await.expect("write") {
        WriteOutcome::Written { revision } => revision,
        other => panic!("write of {aggregate} failed: {other:?}"),
    }
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}
