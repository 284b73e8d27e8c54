//! Contract case for the consumer's doorbell (`StreamStore::wait_for_entries`): runs unchanged
//! against every store implementation.

use std::time::Duration;

use rsc::store::{EntryId, MetadataStore, ReadFrom, StreamStore};

const GROUP: &str = "billing";
const ZERO: EntryId = EntryId { ms: 0, seq: 0 };

fn one_field() -> Vec<(String, Vec<u8>)> {
    vec![("payload".to_string(), b"x".to_vec())]
}

/// Unknown ids resolve to the group's last-delivered id (`0-0` without a group or a stream); the
/// doorbell rings at once for an entry after the id, waits the full time when there is none, and
/// rings during the wait for an entry added meanwhile. It reads nothing for the group.
pub async fn contract_wait_for_entries<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let (a, b) = ("doorbell:a".to_string(), "doorbell:b".to_string());
    // Nothing exists: unknown ids are 0-0 and the full wait passes.
    let bell = store.wait_for_entries(GROUP, &[(a.clone(), None), (b.clone(), None)], 50).await.expect("wait");
    assert_eq!((bell.rang, bell.after), (false, vec![ZERO, ZERO]));
    let first = store.xadd(&a, one_field(), None).await.expect("xadd");
    store.ensure_group(&a, GROUP).await.expect("group");
    // Undelivered: the group's last-delivered id is 0-0 and the entry rings at once.
    let bell = store.wait_for_entries(GROUP, &[(a.clone(), None)], 5_000).await.expect("wait");
    assert_eq!((bell.rang, bell.after.clone()), (true, vec![ZERO]));
    let read = store.xreadgroup(GROUP, "c1", &[(a.clone(), ReadFrom::New)], 10, None).await.expect("read");
    assert_eq!(read.len(), 1);
    // Delivered: now the unknown id resolves to it, and nothing rings.
    let start = tokio::time::Instant::now();
    let bell = store.wait_for_entries(GROUP, &[(a.clone(), None), (b.clone(), Some(ZERO))], 100).await.expect("wait");
    assert_eq!((bell.rang, bell.after.clone()), (false, vec![first, ZERO]));
    assert!(start.elapsed() >= Duration::from_millis(90), "waited {:?}", start.elapsed());
    // An entry added during the wait rings it early.
    let adder = {
        let (store, b) = (store.clone(), b.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store.xadd(&b, one_field(), None).await.expect("xadd")
        })
    };
    let start = tokio::time::Instant::now();
    let bell = store.wait_for_entries(GROUP, &[(a.clone(), Some(first)), (b.clone(), Some(ZERO))], 5_000).await;
    assert!(bell.expect("wait").rang);
    // Rung by the entry, not at once: the adder writes 100 ms after its spawn, before `start`.
    let rang_after = start.elapsed();
    assert!(rang_after >= Duration::from_millis(90), "rang before the entry was added: {rang_after:?}");
    assert!(rang_after < Duration::from_millis(3_000), "rang late: {rang_after:?}");
    adder.await.expect("adder");
    // The doorbell delivered nothing: the entry of `a` is pending once, and `b` has no group.
    let again = store.xreadgroup(GROUP, "c1", &[(a.clone(), ReadFrom::New)], 10, None).await.expect("read");
    assert!(again.is_empty());
}
