//! Contract cases for `StreamStore`: each runs unchanged against every store implementation.

use rsc::store::{EntryId, MetadataStore, ReadFrom, StoreError, StreamEntry, StreamStore};

const STREAM: &str = "orders:v1:0";
const GROUP: &str = "billing";

fn fields(i: usize) -> Vec<(String, Vec<u8>)> {
    vec![("key".to_string(), format!("k{i}").into_bytes()), ("payload".to_string(), vec![0, 159, 146, i as u8])]
}

async fn add<S: StreamStore>(store: &S, stream: &str, n: usize) -> Vec<EntryId> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(store.xadd(stream, fields(i), None).await.expect("xadd"));
    }
    ids
}

async fn read<S: StreamStore>(store: &S, consumer: &str, from: ReadFrom, count: usize) -> Vec<StreamEntry> {
    let streams = [(STREAM.to_string(), from)];
    let mut got = store.xreadgroup(GROUP, consumer, &streams, count, None).await.expect("xreadgroup");
    match got.len() {
        0 => Vec::new(),
        1 => {
            let (stream, entries) = got.remove(0);
            assert_eq!(stream, STREAM);
            assert!(!entries.is_empty(), "streams without entries are omitted");
            entries
        }
        n => panic!("one stream asked, {n} returned"),
    }
}

fn ids(entries: &[StreamEntry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}

fn assert_nogroup<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Protocol(text)) => assert!(text.starts_with("NOGROUP"), "{text}"),
        other => panic!("expected Protocol(NOGROUP ...), got {other:?}"),
    }
}

pub async fn contract_stream_ids_increase<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let added = add(store, STREAM, 50).await;
    assert!(added.windows(2).all(|w| w[0] < w[1]), "{added:?}");
    let other = store.xadd("other:0", fields(0), None).await.expect("xadd");
    assert!(other.ms > 0 || other.seq > 0, "auto ids are never 0-0");
    store.ensure_group(STREAM, GROUP).await.expect("ensure");
    let entries = read(store, "c1", ReadFrom::New, 0).await;
    assert_eq!(ids(&entries), added);
    assert_eq!(entries[7].fields, fields(7), "fields round-trip byte-exact and in order");
}

pub async fn contract_ensure_group_idempotent_and_delivers_preexisting<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let before = add(store, STREAM, 3).await;
    store.ensure_group(STREAM, GROUP).await.expect("ensure");
    store.ensure_group(STREAM, GROUP).await.expect("ensure twice");
    let entries = read(store, "c1", ReadFrom::New, 10).await;
    assert_eq!(ids(&entries), before, "entries published before the group existed are delivered");
    assert_eq!(read(store, "c1", ReadFrom::New, 10).await, vec![]);
    // Ensuring again does not rewind the group.
    store.ensure_group(STREAM, GROUP).await.expect("ensure again");
    assert_eq!(read(store, "c2", ReadFrom::New, 10).await, vec![]);
    // A group on a stream that does not exist yet creates the stream (MKSTREAM).
    store.ensure_group("fresh:0", GROUP).await.expect("ensure on a new stream");
    let streams = [("fresh:0".to_string(), ReadFrom::New)];
    assert_eq!(store.xreadgroup(GROUP, "c1", &streams, 10, None).await, Ok(vec![]));
}

pub async fn contract_new_vs_own_pending<S: MetadataStore + StreamStore + Clone>(store: &S) {
    store.ensure_group(STREAM, GROUP).await.expect("ensure");
    let all = add(store, STREAM, 3).await;
    let first_two = read(store, "c1", ReadFrom::New, 2).await;
    assert_eq!(ids(&first_two), all[..2].to_vec());
    // A restarted c1 sees its own pending entries again, with their fields.
    assert_eq!(read(store, "c1", ReadFrom::OwnPending, 10).await, first_two);
    assert_eq!(read(store, "c2", ReadFrom::OwnPending, 10).await, vec![]);
    assert_eq!(store.xack(STREAM, GROUP, &[all[0]]).await, Ok(1));
    assert_eq!(ids(&read(store, "c1", ReadFrom::OwnPending, 10).await), vec![all[1]]);
    assert_eq!(ids(&read(store, "c2", ReadFrom::New, 10).await), vec![all[2]]);

    // Several streams in one call: each reports its own entries, empty ones are omitted.
    store.ensure_group("orders:v1:1", GROUP).await.expect("ensure");
    let on_one = add(store, "orders:v1:1", 1).await;
    let streams = [(STREAM.to_string(), ReadFrom::New), ("orders:v1:1".to_string(), ReadFrom::New)];
    let got = store.xreadgroup(GROUP, "c3", &streams, 10, None).await.expect("xreadgroup");
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.as_str(), ids(&got[0].1)), ("orders:v1:1", on_one));
}

pub async fn contract_xack<S: MetadataStore + StreamStore + Clone>(store: &S) {
    store.ensure_group(STREAM, GROUP).await.expect("ensure");
    let all = add(store, STREAM, 3).await;
    let delivered = read(store, "c1", ReadFrom::New, 2).await;
    assert_eq!(ids(&delivered), all[..2].to_vec());
    // all[2] was never delivered, so it is not pending and does not count.
    assert_eq!(store.xack(STREAM, GROUP, &all).await, Ok(2));
    assert_eq!(store.xack(STREAM, GROUP, &all).await, Ok(0), "acking twice counts nothing");
    assert_eq!(store.xack(STREAM, GROUP, &[]).await, Ok(0));
    assert_eq!(read(store, "c1", ReadFrom::OwnPending, 10).await, vec![]);
    // A missing group or stream acknowledges nothing, without an error (Redis replies 0).
    assert_eq!(store.xack(STREAM, "no-such-group", &all).await, Ok(0));
    assert_eq!(store.xack("no:such:stream", GROUP, &all).await, Ok(0));
}

pub async fn contract_claim_all_pending<S: MetadataStore + StreamStore + Clone>(store: &S) {
    store.ensure_group(STREAM, GROUP).await.expect("ensure");
    // More than one XAUTOCLAIM page (100) so the cursor loop runs.
    let all = add(store, STREAM, 250).await;
    assert_eq!(ids(&read(store, "c1", ReadFrom::New, 200).await), all[..200].to_vec());
    assert_eq!(ids(&read(store, "c2", ReadFrom::New, 100).await), all[200..].to_vec());

    // Entries not idle long enough stay where they are.
    assert_eq!(store.claim_all_pending(STREAM, GROUP, "c3", 60_000).await, Ok(vec![]));

    let claimed = store.claim_all_pending(STREAM, GROUP, "c3", 0).await.expect("claim");
    assert_eq!(ids(&claimed), all, "every pending entry, in id order, with its fields");
    assert_eq!(claimed[123].fields, fields(123));
    assert_eq!(read(store, "c1", ReadFrom::OwnPending, 0).await, vec![]);
    assert_eq!(ids(&read(store, "c3", ReadFrom::OwnPending, 0).await), all, "COUNT 0 means no limit");
    assert_eq!(store.xack(STREAM, GROUP, &all[..10]).await, Ok(10));
    let again = store.claim_all_pending(STREAM, GROUP, "c4", 0).await.expect("claim");
    assert_eq!(ids(&again), all[10..].to_vec());
}

pub async fn contract_maxlen<S: MetadataStore + StreamStore + Clone>(store: &S) {
    store.ensure_group(STREAM, GROUP).await.expect("ensure");
    let first = store.xadd(STREAM, fields(0), Some(10)).await.expect("xadd");
    assert_eq!(ids(&read(store, "c1", ReadFrom::New, 1).await), vec![first]);
    let mut later = Vec::new();
    for i in 1..500 {
        later.push(store.xadd(STREAM, fields(i), Some(10)).await.expect("xadd"));
    }
    // MAXLEN ~ keeps at least the newest 10 and may keep more (Redis trims whole nodes).
    store.ensure_group(STREAM, "late").await.expect("ensure");
    let streams = [(STREAM.to_string(), ReadFrom::New)];
    let kept = store.xreadgroup("late", "c", &streams, 0, None).await.expect("read");
    let kept = ids(&kept.first().expect("entries").1);
    assert!(kept.len() >= 10 && kept.len() < 400, "kept {} entries", kept.len());
    assert_eq!(kept[kept.len() - 10..], later[later.len() - 10..]);
    assert!(!kept.contains(&first));

    // c1's pending entry was trimmed: it comes back without fields (so it can still be acked)
    // and is not claimable work.
    let pending = read(store, "c1", ReadFrom::OwnPending, 10).await;
    assert_eq!(pending, vec![StreamEntry { id: first, fields: vec![] }]);
    assert_eq!(store.claim_all_pending(STREAM, GROUP, "c2", 0).await, Ok(vec![]));
}

/// Not on a Cluster, where streams in different slots are read by separate calls (see
/// `RedisStore::open_cluster`): there the slot with the group may deliver.
pub async fn contract_one_missing_group_fails_a_whole_read<S: MetadataStore + StreamStore + Clone>(store: &S) {
    store.xadd(STREAM, fields(0), None).await.expect("xadd");
    // One stream without the group fails the whole call: nothing is delivered from the other.
    store.ensure_group("orders:v1:1", GROUP).await.expect("ensure");
    store.xadd("orders:v1:1", fields(1), None).await.expect("xadd");
    let mixed = [("orders:v1:1".to_string(), ReadFrom::New), (STREAM.to_string(), ReadFrom::New)];
    assert_nogroup(store.xreadgroup(GROUP, "c1", &mixed, 10, None).await);
    let good = [("orders:v1:1".to_string(), ReadFrom::OwnPending)];
    assert_eq!(store.xreadgroup(GROUP, "c1", &good, 10, None).await, Ok(vec![]));
}

pub async fn contract_missing_group_errors<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let missing = [("no:such:stream".to_string(), ReadFrom::New)];
    assert_nogroup(store.xreadgroup(GROUP, "c1", &missing, 10, None).await);
    store.xadd(STREAM, fields(0), None).await.expect("xadd");
    let no_group = [(STREAM.to_string(), ReadFrom::New)];
    assert_nogroup(store.xreadgroup(GROUP, "c1", &no_group, 10, None).await);
    assert_nogroup(store.claim_all_pending(STREAM, GROUP, "c1", 0).await);
    assert_nogroup(store.claim_all_pending("no:such:stream", GROUP, "c1", 0).await);

    match store.xadd(STREAM, vec![], None).await {
        Err(StoreError::Protocol(text)) => assert!(text.starts_with("ERR wrong number of arguments"), "{text}"),
        other => panic!("XADD without fields must be a Protocol error, got {other:?}"),
    }
}
