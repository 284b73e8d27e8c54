//! Contract cases for fences at the resource (DESIGN §10): `raise_fences`, `read_fences` and the
//! fenced stream operations, each run unchanged against every store implementation.
//!
//! The rule every fenced operation keeps: the exact fence the key holds is accepted; a strictly
//! larger counter is accepted and replaces the key (a lost raise heals); a missing key accepts
//! any fence; everything else is `Fenced { key, current }` and nothing is read, acknowledged or
//! claimed — checked here on the pending lists, not only on the returned error.

use rsc::core::model::{Fence, GroupId};
use rsc::store::{
    keys, EntryId, FenceCheck, FenceRaise, FencedAck, FencedRead, MetadataStore, ReadFrom, StoreError, StreamEntry,
    StreamStore,
};

const GROUP: &str = "billing";

fn group_id() -> GroupId {
    GroupId::new("orders:v1", GROUP)
}

fn stream(shard: u32) -> String {
    group_id().stream_key(shard)
}

fn fence_key(shard: u32) -> String {
    keys::fence_key(&group_id(), shard)
}

fn fields(i: usize) -> Vec<(String, Vec<u8>)> {
    vec![("key".to_string(), format!("k{i}").into_bytes())]
}

async fn add<S: StreamStore>(store: &S, stream: &str, n: usize) -> Vec<EntryId> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(store.xadd(stream, fields(i), None).await.expect("xadd"));
    }
    ids
}

fn ids(entries: &[StreamEntry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}

/// `consumer`'s own pending entries on `stream`, read unfenced (ground truth for "nothing moved").
async fn own_pending<S: StreamStore>(store: &S, stream: &str, consumer: &str) -> Vec<EntryId> {
    let streams = [(stream.to_string(), ReadFrom::OwnPending)];
    let got = store.xreadgroup(GROUP, consumer, &streams, 0, None).await.expect("own pending");
    got.into_iter().flat_map(|(_, entries)| ids(&entries)).collect()
}

async fn raise_one<S: MetadataStore>(store: &S, key: &str, nonce: u64) -> Fence {
    let raised = store.raise_fences(&[FenceRaise { key: key.to_string(), nonce, floor: 0 }]).await.expect("raise");
    assert_eq!(raised.len(), 1);
    raised[0]
}

fn check(shard: u32, fence: Fence) -> FenceCheck {
    FenceCheck { key: fence_key(shard), fence }
}

fn assert_fenced<T: std::fmt::Debug>(result: Result<T, StoreError>, shard: u32, current: Fence) {
    assert_eq!(
        result.map(|_| "accepted"),
        Err(StoreError::Fenced { key: fence_key(shard), current: current.to_string() })
    );
}

fn assert_nogroup<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Protocol(text)) => assert!(text.starts_with("NOGROUP"), "{text}"),
        other => panic!("expected Protocol(NOGROUP ...), got {other:?}"),
    }
}

pub async fn contract_fence_raise_counts_up_and_stores_the_nonce<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let (a, b, never) = (fence_key(0), fence_key(1), fence_key(2));
    let raises = [
        FenceRaise { key: a.clone(), nonce: 0xa1, floor: 0 },
        FenceRaise { key: b.clone(), nonce: u64::MAX, floor: 0 },
    ];
    let first = store.raise_fences(&raises).await.expect("raise");
    assert_eq!(first, vec![Fence { counter: 1, nonce: 0xa1 }, Fence { counter: 1, nonce: u64::MAX }]);
    let again = raise_one(store, &a, 0xa2).await;
    assert_eq!(again, Fence { counter: 2, nonce: 0xa2 }, "each raise adds one and replaces the nonce");
    assert_eq!(store.raise_fences(&[]).await, Ok(vec![]));
    let read = store.read_fences(&[a.clone(), b.clone(), never]).await.expect("read fences");
    assert_eq!(read, vec![Some(again), Some(first[1]), None]);
    assert_eq!(store.read_fences(&[]).await, Ok(vec![]));
}

/// A key without a counter (new, or vanished: evicted, flushed, a restart without persistence)
/// is raised to the floor the coordinator passes (its wall clock), not to 1, so it does not start
/// again below the counters of grants made before it vanished; a key with a counter is raised by
/// one whatever the floor, and a floor of 0 gives 1.
pub async fn contract_fence_raise_floor_sets_only_a_key_without_a_counter<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let (a, b) = (fence_key(0), fence_key(1));
    let floored = |key: &str, nonce, floor| FenceRaise { key: key.to_string(), nonce, floor };
    let first = store.raise_fences(&[floored(&a, 0x01, 1_764_000_000_000)]).await.expect("raise");
    assert_eq!(first, vec![Fence { counter: 1_764_000_000_000, nonce: 0x01 }]);
    let next = store.raise_fences(&[floored(&a, 0x02, 1_764_000_000_500)]).await.expect("raise");
    assert_eq!(next, vec![Fence { counter: 1_764_000_000_001, nonce: 0x02 }], "a held counter counts up");
    let lower = store.raise_fences(&[floored(&a, 0x03, 7)]).await.expect("raise");
    assert_eq!(lower, vec![Fence { counter: 1_764_000_000_002, nonce: 0x03 }]);
    assert_eq!(store.raise_fences(&[floored(&b, 0x04, 0)]).await, Ok(vec![Fence { counter: 1, nonce: 0x04 }]));
    assert_eq!(store.read_fences(&[a]).await, Ok(vec![Some(lower[0])]));
}

pub async fn contract_fenced_operations_accept_the_exact_fence<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let s = stream(0);
    store.ensure_group(&s, GROUP).await.expect("ensure");
    // More than one fenced claim script call (10 pages of 100 per call on Redis).
    let all = add(store, &s, 1_100).await;
    let fence = raise_one(store, &fence_key(0), 7).await;
    let c = check(0, fence);

    let read = store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::New, 1_050).await.expect("fenced read");
    assert_eq!(ids(&read), all[..1_050].to_vec());
    assert_eq!(read[3].fields, fields(3), "fields round-trip");
    let again = store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::OwnPending, 2).await.expect("own pending");
    assert_eq!(ids(&again), all[..2].to_vec());
    assert_eq!(store.fenced_xack(&c, &s, GROUP, &all[..2]).await, Ok(2));
    assert_eq!(store.fenced_xack(&c, &s, GROUP, &all[..2]).await, Ok(0), "acking twice counts nothing");
    assert_eq!(store.fenced_xack(&c, &s, GROUP, &[]).await, Ok(0));

    let claimed = store.fenced_claim_all_pending(&c, &s, GROUP, "c2", 0).await.expect("fenced claim");
    assert_eq!(ids(&claimed), all[2..1_050].to_vec(), "every pending entry, in id order");
    assert_eq!(own_pending(store, &s, "c1").await, Vec::<EntryId>::new());
    assert_eq!(own_pending(store, &s, "c2").await, all[2..1_050].to_vec());
    let tail = store.fenced_xreadgroup(&c, GROUP, "c2", &s, ReadFrom::New, 0).await.expect("rest");
    assert_eq!(ids(&tail), all[1_050..].to_vec());
    assert_eq!(store.fenced_xreadgroup(&c, GROUP, "c2", &s, ReadFrom::New, 10).await, Ok(vec![]));
    assert_eq!(store.read_fences(&[fence_key(0)]).await, Ok(vec![Some(fence)]), "an accepted check writes nothing");
}

/// Acks under the exact fence count what they acknowledged whatever their size: up to 1,000 ids
/// (one XACK after a matching fence, the scripts' fast path on Redis) and more (the full check,
/// 1,000 ids per XACK), single and batched; ids acked already count nothing. A single ack of
/// 8,200 ids failed on Redis before its script acked in chunks (`unpack` of them all overflowed
/// Lua's stack), where the fake acked them.
pub async fn contract_fenced_acks_count_what_they_acknowledged_at_any_size<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let (s0, s1) = (stream(0), stream(1));
    for s in [&s0, &s1] {
        store.ensure_group(s, GROUP).await.expect("ensure");
    }
    let (a0, a1) = (add(store, &s0, 2_502).await, add(store, &s1, 1_001).await);
    let (f0, f1) = (raise_one(store, &fence_key(0), 0x20).await, raise_one(store, &fence_key(1), 0x21).await);
    for (shard, fence, s, all) in [(0, f0, &s0, &a0), (1, f1, &s1, &a1)] {
        let read = store.fenced_xreadgroup(&check(shard, fence), GROUP, "c1", s, ReadFrom::New, 0).await;
        assert_eq!(read.map(|e| ids(&e)), Ok(all.clone()));
    }
    assert_eq!(store.fenced_xack(&check(0, f0), &s0, GROUP, &a0[..1_000]).await, Ok(1_000));
    assert_eq!(store.fenced_xack(&check(0, f0), &s0, GROUP, &a0[..1_001]).await, Ok(1), "1,000 of them acked already");
    let ack = |shard: u32, fence: Fence, stream: &str, ids: &[EntryId]| FencedAck {
        fence: check(shard, fence),
        stream: stream.to_string(),
        ids: ids.to_vec(),
    };
    let acks = [ack(1, f1, &s1, &a1[..1_000]), ack(0, f0, &s0, &a0[1_001..])];
    assert_eq!(store.fenced_xack_many(GROUP, &acks).await, Ok(vec![Ok(1_000), Ok(1_501)]));
    let acks = [ack(1, f1, &s1, &a1[999..]), ack(0, f0, &s0, &a0[..2])];
    assert_eq!(store.fenced_xack_many(GROUP, &acks).await, Ok(vec![Ok(1), Ok(0)]));
    assert_eq!(own_pending(store, &s0, "c1").await, Vec::<EntryId>::new());
    assert_eq!(own_pending(store, &s1, "c1").await, Vec::<EntryId>::new());
    assert_eq!(store.read_fences(&[fence_key(0), fence_key(1)]).await, Ok(vec![Some(f0), Some(f1)]));

    let s2 = stream(2);
    store.ensure_group(&s2, GROUP).await.expect("ensure");
    let a2 = add(store, &s2, 8_200).await;
    let f2 = raise_one(store, &fence_key(2), 0x22).await;
    let read = store.fenced_xreadgroup(&check(2, f2), GROUP, "c1", &s2, ReadFrom::New, 0).await;
    assert_eq!(read.map(|e| e.len()), Ok(8_200));
    assert_eq!(store.fenced_xack(&check(2, f2), &s2, GROUP, &a2).await, Ok(8_200));
    assert_eq!(own_pending(store, &s2, "c1").await, Vec::<EntryId>::new());
}

/// Entries delivered to `c1` under `fence` (the first three of five), the rest not delivered.
async fn c1_holds_three<S: MetadataStore + StreamStore + Clone>(store: &S, fence: Fence) -> Vec<EntryId> {
    let s = stream(0);
    store.ensure_group(&s, GROUP).await.expect("ensure");
    let all = add(store, &s, 5).await;
    let read = store.fenced_xreadgroup(&check(0, fence), GROUP, "c1", &s, ReadFrom::New, 3).await.expect("read");
    assert_eq!(ids(&read), all[..3].to_vec());
    all
}

/// A stale fence reads, acks and claims nothing; the pending lists and the fence key are as they
/// were.
async fn assert_refused_everywhere<S: MetadataStore + StreamStore + Clone>(
    store: &S,
    stale: Fence,
    current: Fence,
    all: &[EntryId],
) {
    let s = stream(0);
    let c = check(0, stale);
    assert_fenced(store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::New, 10).await, 0, current);
    assert_fenced(store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::OwnPending, 10).await, 0, current);
    assert_fenced(store.fenced_xreadgroup(&c, GROUP, "c3", &s, ReadFrom::New, 10).await, 0, current);
    assert_fenced(store.fenced_xack(&c, &s, GROUP, &all[..3]).await, 0, current);
    assert_fenced(store.fenced_xack(&c, &s, GROUP, &[]).await, 0, current);
    assert_fenced(store.fenced_claim_all_pending(&c, &s, GROUP, "c3", 0).await, 0, current);
    assert_eq!(own_pending(store, &s, "c1").await, all[..3].to_vec(), "nothing acked or claimed from c1");
    assert_eq!(own_pending(store, &s, "c3").await, Vec::<EntryId>::new(), "nothing read or claimed by c3");
    assert_eq!(store.read_fences(&[fence_key(0)]).await, Ok(vec![Some(current)]), "a refusal writes nothing");
    // The two entries never delivered are still new: the stale reads took nothing.
    let rest = store.fenced_xreadgroup(&check(0, current), GROUP, "c4", &s, ReadFrom::New, 10).await;
    assert_eq!(rest.map(|e| ids(&e)), Ok(all[3..].to_vec()));
}

pub async fn contract_an_older_fence_is_refused_and_touches_nothing<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let old = raise_one(store, &fence_key(0), 0x01).await;
    let all = c1_holds_three(store, old).await;
    let current = raise_one(store, &fence_key(0), 0x02).await;
    assert_eq!(current.counter, 2);
    assert_refused_everywhere(store, old, current, &all).await;
}

pub async fn contract_the_same_counter_with_another_nonce_is_refused<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let current = raise_one(store, &fence_key(0), 0x0123_4567_89ab_cdef).await;
    let all = c1_holds_three(store, current).await;
    let twin = Fence { counter: current.counter, nonce: 0x0123_4567_89ab_cdee };
    assert_refused_everywhere(store, twin, current, &all).await;
}

pub async fn contract_a_newer_fence_is_accepted_and_replaces_the_key<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let s = stream(0);
    store.ensure_group(&s, GROUP).await.expect("ensure");
    let all = add(store, &s, 4).await;
    let old = raise_one(store, &fence_key(0), 0x0a).await;
    // A grant whose raise the store lost: its counter is ahead of the key's.
    let newer = Fence { counter: 5, nonce: 0x0b };
    let read = store.fenced_xreadgroup(&check(0, newer), GROUP, "c1", &s, ReadFrom::New, 2).await;
    assert_eq!(read.map(|e| ids(&e)), Ok(all[..2].to_vec()));
    assert_eq!(store.read_fences(&[fence_key(0)]).await, Ok(vec![Some(newer)]), "the key healed");
    assert_fenced(store.fenced_xreadgroup(&check(0, old), GROUP, "c2", &s, ReadFrom::New, 2).await, 0, newer);
    assert_fenced(store.fenced_xack(&check(0, old), &s, GROUP, &all[..2]).await, 0, newer);
    assert_eq!(own_pending(store, &s, "c1").await, all[..2].to_vec());

    // Healing through an ack and through a claim works the same way.
    let newest = Fence { counter: 9, nonce: 0x0c };
    assert_eq!(store.fenced_xack(&check(0, newest), &s, GROUP, &all[..1]).await, Ok(1));
    assert_eq!(store.read_fences(&[fence_key(0)]).await, Ok(vec![Some(newest)]));
    let last = Fence { counter: 10, nonce: 0x0d };
    let claimed = store.fenced_claim_all_pending(&check(0, last), &s, GROUP, "c2", 0).await;
    assert_eq!(claimed.map(|e| ids(&e)), Ok(all[1..2].to_vec()));
    assert_fenced(store.fenced_xack(&check(0, newest), &s, GROUP, &all[1..2]).await, 0, last);
    // The next raise counts on from the healed value.
    assert_eq!(raise_one(store, &fence_key(0), 0x0e).await, Fence { counter: 11, nonce: 0x0e });
}

pub async fn contract_a_missing_fence_key_accepts_any_fence<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let s = stream(0);
    store.ensure_group(&s, GROUP).await.expect("ensure");
    let all = add(store, &s, 2).await;
    let first = Fence { counter: 3, nonce: 0x33 };
    let read = store.fenced_xreadgroup(&check(0, first), GROUP, "c1", &s, ReadFrom::New, 1).await;
    assert_eq!(read.map(|e| ids(&e)), Ok(all[..1].to_vec()));
    assert_eq!(store.read_fences(&[fence_key(0)]).await, Ok(vec![Some(first)]), "the first use writes the key");
    assert_fenced(
        store.fenced_xreadgroup(&check(0, Fence { counter: 2, nonce: 0x33 }), GROUP, "c1", &s, ReadFrom::New, 1).await,
        0,
        first,
    );

    // Counter 0 (never raised by the coordinator, but allowed) on another shard's missing key.
    let s1 = stream(1);
    store.ensure_group(&s1, GROUP).await.expect("ensure");
    let zero = Fence { counter: 0, nonce: 0 };
    assert_eq!(store.fenced_xack(&check(1, zero), &s1, GROUP, &[]).await, Ok(0));
    assert_eq!(store.read_fences(&[fence_key(1)]).await, Ok(vec![Some(zero)]));
    assert_eq!(raise_one(store, &fence_key(1), 0x44).await, Fence { counter: 1, nonce: 0x44 });
}

/// A counter above `Fence::COUNTER_MAX` is refused, on a missing key as on a raised one, and never
/// installed: installed near 2^63, it would make every later raise (`HINCRBY`) of the key fail.
pub async fn contract_a_counter_beyond_the_largest_is_refused_and_never_installed<
    S: MetadataStore + StreamStore + Clone,
>(
    store: &S,
) {
    let (s0, s1) = (stream(0), stream(1));
    store.ensure_group(&s0, GROUP).await.expect("ensure");
    store.ensure_group(&s1, GROUP).await.expect("ensure");
    let all = add(store, &s0, 2).await;
    let refused = |result: Result<u64, StoreError>| {
        assert!(matches!(result, Err(StoreError::Fenced { .. })), "{result:?}");
    };
    for counter in [Fence::COUNTER_MAX + 1, i64::MAX as u64, u64::MAX] {
        let forged = Fence { counter, nonce: 0x77 };
        // On a missing key, through every operation.
        let read = store.fenced_xreadgroup(&check(0, forged), GROUP, "c1", &s0, ReadFrom::New, 2).await;
        refused(read.map(|e| e.len() as u64));
        refused(store.fenced_xack(&check(0, forged), &s0, GROUP, &all).await);
        let claimed = store.fenced_claim_all_pending(&check(0, forged), &s0, GROUP, "c1", 0).await;
        refused(claimed.map(|e| e.len() as u64));
        assert_eq!(store.read_fences(&[fence_key(0)]).await, Ok(vec![None]), "never installed");
        assert_eq!(own_pending(store, &s0, "c1").await, Vec::<EntryId>::new(), "nothing read");
    }
    // On a raised key: refused as stale, naming what the key holds.
    let raised = raise_one(store, &fence_key(1), 0x01).await;
    let forged = Fence { counter: i64::MAX as u64, nonce: 0x02 };
    assert_fenced(store.fenced_xack(&check(1, forged), &s1, GROUP, &[]).await, 1, raised);
    assert_eq!(store.read_fences(&[fence_key(1)]).await, Ok(vec![Some(raised)]));
    // The largest is installed, and the shard can still be granted (raised) after it, and its
    // owner read, ack and claim with the raised value, which is above the largest.
    let largest = Fence { counter: Fence::COUNTER_MAX, nonce: 0x03 };
    assert_eq!(store.fenced_xack(&check(1, largest), &s1, GROUP, &[]).await, Ok(0));
    let next = raise_one(store, &fence_key(1), 0x04).await;
    assert_eq!(next, Fence { counter: Fence::COUNTER_MAX + 1, nonce: 0x04 });
    let one = add(store, &s1, 1).await;
    let read = store.fenced_xreadgroup(&check(1, next), GROUP, "c1", &s1, ReadFrom::New, 1).await;
    assert_eq!(read.map(|e| ids(&e)), Ok(one.clone()));
    let claimed = store.fenced_claim_all_pending(&check(1, next), &s1, GROUP, "c2", 0).await;
    assert_eq!(claimed.map(|e| ids(&e)), Ok(one.clone()));
    assert_eq!(store.fenced_xack(&check(1, next), &s1, GROUP, &one).await, Ok(1));
    assert_fenced(store.fenced_xack(&check(1, largest), &s1, GROUP, &[]).await, 1, next);
    assert_eq!(raise_one(store, &fence_key(0), 0x05).await, Fence { counter: 1, nonce: 0x05 });
}

pub async fn contract_fenced_operations_map_missing_groups_as_unfenced_ones<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let s = stream(0);
    let fence = raise_one(store, &fence_key(0), 0x77).await;
    let c = check(0, fence);
    // The stream does not exist.
    assert_nogroup(store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::New, 10).await);
    assert_nogroup(store.fenced_claim_all_pending(&c, &s, GROUP, "c1", 0).await);
    // The stream exists, the group does not.
    let added = add(store, &s, 1).await;
    assert_nogroup(store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::New, 10).await);
    assert_nogroup(store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::OwnPending, 10).await);
    assert_nogroup(store.fenced_claim_all_pending(&c, &s, GROUP, "c1", 0).await);
    // XACK on a missing group acknowledges nothing, without an error, as unfenced.
    assert_eq!(store.fenced_xack(&c, &s, GROUP, &added).await, Ok(0));
    // A shard whose stream was never created (its fence key is in the stream's slot, as a
    // Cluster requires of every fenced call).
    let unborn = check(5, raise_one(store, &fence_key(5), 0x79).await);
    assert_eq!(store.fenced_xack(&unborn, &stream(5), GROUP, &added).await, Ok(0));
    // The fence check comes first: a stale fence is FENCED even where the group is missing.
    let newer = raise_one(store, &fence_key(0), 0x78).await;
    assert_fenced(store.fenced_xreadgroup(&c, GROUP, "c1", &s, ReadFrom::New, 10).await, 0, newer);
    assert_fenced(store.fenced_claim_all_pending(&c, &s, GROUP, "c1", 0).await, 0, newer);
}

/// The batched forms keep every shard's own outcome, in order, whatever the shards around it did:
/// an accepted shard reads (acks), a stale one is `Fenced` and touches nothing, a newer one heals
/// its key, a missing key accepts, a missing group is that shard's NOGROUP, and an own-pending
/// read redelivers — all in one call.
pub async fn contract_batched_fenced_reads_and_acks_keep_each_shards_outcome<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let (s0, s1, s2, s3, s4) = (stream(0), stream(1), stream(2), stream(3), stream(4));
    for s in [&s0, &s1, &s2, &s4] {
        store.ensure_group(s, GROUP).await.expect("ensure");
    }
    let (a0, a1, a2) = (add(store, &s0, 4).await, add(store, &s1, 4).await, add(store, &s2, 4).await);
    add(store, &s3, 1).await;
    let a4 = add(store, &s4, 2).await;
    let f0 = raise_one(store, &fence_key(0), 0x10).await;
    let stale1 = raise_one(store, &fence_key(1), 0x11).await;
    // Shard 1's entries are pending to c1 under its old fence before it is superseded.
    let held = store.fenced_xreadgroup(&check(1, stale1), GROUP, "c1", &s1, ReadFrom::New, 4).await.expect("read");
    assert_eq!(ids(&held), a1);
    let f1 = raise_one(store, &fence_key(1), 0x12).await;
    let old2 = raise_one(store, &fence_key(2), 0x13).await;
    let newer2 = Fence { counter: old2.counter + 5, nonce: 0x14 };
    let f3 = raise_one(store, &fence_key(3), 0x15).await;
    let never4 = Fence { counter: 9, nonce: 0x16 };
    let read = |shard: u32, fence: Fence, stream: &str, from: ReadFrom, count: usize| FencedRead {
        fence: check(shard, fence),
        stream: stream.to_string(),
        from,
        count,
    };
    assert_eq!(store.fenced_xreadgroup_many(GROUP, "c1", &[]).await, Ok(vec![]));
    let reads = [
        read(3, f3, &s3, ReadFrom::New, 3),
        read(0, f0, &s0, ReadFrom::New, 3),
        read(1, stale1, &s1, ReadFrom::OwnPending, 10),
        read(2, newer2, &s2, ReadFrom::New, 10),
        read(4, never4, &s4, ReadFrom::New, 10),
        read(0, f0, &s0, ReadFrom::OwnPending, 10),
    ];
    let got = store.fenced_xreadgroup_many(GROUP, "c1", &reads).await.expect("batched read");
    assert_eq!(got.len(), 6);
    assert_nogroup(got[0].clone());
    assert_eq!(got[1].as_ref().map(|e| ids(e)), Ok(a0[..3].to_vec()));
    assert_eq!(got[1].as_ref().map(|e| e[1].fields.clone()), Ok(fields(1)), "fields round-trip");
    assert_fenced(got[2].clone(), 1, f1);
    assert_eq!(got[3].as_ref().map(|e| ids(e)), Ok(a2.clone()), "a newer fence reads");
    assert_eq!(got[4].as_ref().map(|e| ids(e)), Ok(a4.clone()), "a missing key accepts");
    assert_eq!(got[5].as_ref().map(|e| ids(e)), Ok(a0[..3].to_vec()), "own pending, after the read before it");
    let keys = [fence_key(0), fence_key(1), fence_key(2), fence_key(4)];
    let expected = vec![Some(f0), Some(f1), Some(newer2), Some(never4)];
    assert_eq!(store.read_fences(&keys).await, Ok(expected.clone()), "only the newer and the missing key changed");

    let ack = |shard: u32, fence: Fence, stream: &str, ids: &[EntryId]| FencedAck {
        fence: check(shard, fence),
        stream: stream.to_string(),
        ids: ids.to_vec(),
    };
    assert_eq!(store.fenced_xack_many(GROUP, &[]).await, Ok(vec![]));
    let acks = [
        ack(0, f0, &s0, &[]),
        ack(1, stale1, &s1, &a1),
        ack(0, f0, &s0, &a0[..3]),
        ack(2, old2, &s2, &a2),
        ack(4, never4, &s4, &a4[..1]),
    ];
    let got = store.fenced_xack_many(GROUP, &acks).await.expect("batched ack");
    assert_eq!(got.len(), 5);
    assert_eq!(got[0], Ok(0), "an ack of nothing still checks, and counts nothing");
    assert_fenced(got[1].clone(), 1, f1);
    assert_eq!(got[2], Ok(3));
    assert_fenced(got[3].clone(), 2, newer2);
    assert_eq!(got[4], Ok(1));
    assert_eq!(own_pending(store, &s1, "c1").await, a1, "the refused ack acknowledged nothing");
    assert_eq!(own_pending(store, &s0, "c1").await, Vec::<EntryId>::new());
    assert_eq!(own_pending(store, &s2, "c1").await, a2, "the refused ack acknowledged nothing");
    assert_eq!(own_pending(store, &s4, "c1").await, a4[1..].to_vec());
    assert_eq!(store.read_fences(&keys).await, Ok(expected), "refused acks wrote nothing");
}

/// `HMGET` calls the server has run, scripts' own included (INFO commandstats).
fn hmget_calls(server: &crate::support::RedisServer) -> u64 {
    command_calls(server, "hmget")
}

/// Calls of `command` (lower case) the server has run (INFO commandstats).
fn command_calls(server: &crate::support::RedisServer, command: &str) -> u64 {
    let info: String = redis::from_redis_value(server.cmd(&["INFO", "commandstats"])).expect("INFO");
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) else { return 0 };
    line.split(['=', ',']).nth(1).and_then(|n| n.parse().ok()).expect("calls")
}

/// Real Redis only: batched fenced acks by an optimistic transaction
/// (`RedisStoreOptions::watched_acks`, on by default). The first ack of a fence goes through the
/// script and leaves the fence key watched and read on the store's connection of watched acks;
/// the next acks with that fence are one `MULTI`/`XACK`s/`EXEC`, no script. Any write of a
/// watched key in between — the same value written again, or a raise for another grant — makes
/// Redis abort the transaction, and the script decides those shards: the stale ack is `FENCED`
/// and acknowledged nothing. Without the `WATCH`, the transaction after the raise would have
/// acked with the stale fence.
#[tokio::test]
async fn redis_store_acks_a_watched_fence_by_transaction_and_a_write_of_the_key_in_between_aborts_it() {
    let server = crate::support::RedisServer::start();
    // Neither DISCARD nor UNWATCH, as the README's client user.
    server.cmd(&["ACL", "SETUSER", "acker", "on", ">pw", "~*", "&*", "+@all", "-discard", "-unwatch"]);
    let url = format!("redis://acker:pw@127.0.0.1:{}", server.port());
    let store = rsc::store::redis::RedisStore::connect(&url, Default::default()).await.expect("connect");
    let (s0, s1, s2) = (stream(0), stream(1), stream(2));
    for s in [&s0, &s1, &s2] {
        store.ensure_group(s, GROUP).await.expect("ensure");
    }
    let (a0, a1, a2) = (add(&store, &s0, 5).await, add(&store, &s1, 5).await, add(&store, &s2, 2).await);
    let f2 = raise_one(&store, &fence_key(2), 0x53).await;
    store.fenced_xreadgroup(&check(2, f2), GROUP, "c1", &s2, ReadFrom::New, 0).await.expect("read");
    let (f0, f1) = (raise_one(&store, &fence_key(0), 0x50).await, raise_one(&store, &fence_key(1), 0x51).await);
    for (shard, fence, s) in [(0, f0, &s0), (1, f1, &s1)] {
        store.fenced_xreadgroup(&check(shard, fence), GROUP, "c1", s, ReadFrom::New, 0).await.expect("read");
    }
    let ack = |shard: u32, fence: Fence, stream: &str, id: EntryId| FencedAck {
        fence: check(shard, fence),
        stream: stream.to_string(),
        ids: vec![id],
    };
    let both = |i: usize| [ack(0, f0, &s0, a0[i]), ack(1, f1, &s1, a1[i])];
    // The first ack: nothing is watched yet, so the script acks (its first call also loads it:
    // NOSCRIPT, then EVALSHA again).
    let exec_before = command_calls(&server, "exec");
    assert_eq!(store.fenced_xack_many(GROUP, &both(0)).await, Ok(vec![Ok(1), Ok(1)]));
    assert_eq!(command_calls(&server, "exec"), exec_before, "no transaction without a watched fence");
    let mut before = (command_calls(&server, "evalsha"), command_calls(&server, "exec"));
    let mut ran = |what: &str, scripts: u64, transactions: u64| {
        let now = (command_calls(&server, "evalsha"), command_calls(&server, "exec"));
        assert_eq!((now.0 - before.0, now.1 - before.1), (scripts, transactions), "{what}: (scripts, EXECs)");
        before = now;
    };
    assert_eq!(store.fenced_xack_many(GROUP, &both(1)).await, Ok(vec![Ok(1), Ok(1)]));
    ran("the next ack with the same fences", 0, 1);
    // The same value written again: the key was written, so the transaction is aborted.
    let nonce = format!("{:016x}", f0.nonce);
    server.cmd(&["HSET", &fence_key(0), "counter", &f0.counter.to_string(), "nonce", &nonce]);
    assert_eq!(store.fenced_xack_many(GROUP, &both(2)).await, Ok(vec![Ok(1), Ok(1)]));
    ran("an ack after a write of the same fence", 1, 1);
    let raised = raise_one(&store, &fence_key(0), 0x52).await;
    assert!(raised.counter > f0.counter);
    ran("the raise for another grant (its own script)", 1, 0);
    let got = store.fenced_xack_many(GROUP, &both(3)).await.expect("batched ack");
    assert_fenced(got[0].clone(), 0, raised);
    assert_eq!(got[1], Ok(1));
    ran("an ack with a fence raised since", 1, 1);
    assert_eq!(own_pending(&store, &s0, "c1").await, a0[3..].to_vec(), "the stale ack acknowledged nothing");
    assert_eq!(store.fenced_xack_many(GROUP, &[ack(1, f1, &s1, a1[4])]).await, Ok(vec![Ok(1)]));
    ran("an ack of the other shard, still watched", 0, 1);
    assert_eq!(own_pending(&store, &s1, "c1").await, Vec::<EntryId>::new());
    // A shard not watched yet: the transaction ends with nothing queued (an EXEC, not a DISCARD
    // this user may not run), the script acks, and the shard's next ack is a transaction.
    assert_eq!(store.fenced_xack_many(GROUP, &[ack(2, f2, &s2, a2[0])]).await, Ok(vec![Ok(1)]));
    ran("an ack of a shard not watched yet", 1, 1);
    assert_eq!(store.fenced_xack_many(GROUP, &[ack(2, f2, &s2, a2[1])]).await, Ok(vec![Ok(1)]));
    ran("its next ack", 0, 1);
    assert_eq!(server.cmd(&["ACL", "LOG"]), redis::Value::Array(vec![]), "nothing was refused to the user");
}

/// Real Redis only: which path an ack script took. An ack whose fence key holds exactly the
/// presented value takes the fast path, which reads the fence key once (one `HMGET`); any other
/// reads it once more in the full check, which decides (here: a newer fence accepted and
/// installed, a stale one refused). Both run the same commands otherwise, so the count of
/// `HMGET`s is what tells them apart.
#[tokio::test]
async fn redis_store_acks_with_the_exact_fence_read_the_fence_key_once_and_others_twice() {
    let server = crate::support::RedisServer::start();
    // The scripts' own paths: batched acks through the script every time.
    let options = rsc::store::redis::RedisStoreOptions { watched_acks: false, ..Default::default() };
    let store = rsc::store::redis::RedisStore::connect(&server.url(), options).await.expect("connect");
    let (s0, s1) = (stream(0), stream(1));
    for s in [&s0, &s1] {
        store.ensure_group(s, GROUP).await.expect("ensure");
    }
    let (a0, a1) = (add(&store, &s0, 4).await, add(&store, &s1, 4).await);
    let (f0, f1) = (raise_one(&store, &fence_key(0), 0x30).await, raise_one(&store, &fence_key(1), 0x31).await);
    for (shard, fence, s) in [(0, f0, &s0), (1, f1, &s1)] {
        store.fenced_xreadgroup(&check(shard, fence), GROUP, "c1", s, ReadFrom::New, 0).await.expect("read");
    }
    let ack = |shard: u32, fence: Fence, stream: &str, ids: &[EntryId]| FencedAck {
        fence: check(shard, fence),
        stream: stream.to_string(),
        ids: ids.to_vec(),
    };
    let mut before = hmget_calls(&server);
    let mut hmgets = |what: &str, expected: u64| {
        let now = hmget_calls(&server);
        assert_eq!(now - before, expected, "{what}");
        before = now;
    };
    assert_eq!(store.fenced_xack(&check(0, f0), &s0, GROUP, &a0[..1]).await, Ok(1));
    hmgets("a single ack with the exact fence", 1);
    assert_eq!(
        store.fenced_xack_many(GROUP, &[ack(0, f0, &s0, &a0[1..2]), ack(1, f1, &s1, &a1[..1])]).await,
        Ok(vec![Ok(1), Ok(1)])
    );
    hmgets("a batched ack of two shards with their exact fences", 2);
    let newer = Fence { counter: f0.counter + 1, nonce: 0x32 };
    assert_eq!(store.fenced_xack(&check(0, newer), &s0, GROUP, &a0[2..3]).await, Ok(1));
    hmgets("a single ack with a newer fence", 2);
    let got = store.fenced_xack_many(GROUP, &[ack(0, f0, &s0, &a0[3..]), ack(1, f1, &s1, &a1[1..])]).await;
    let got = got.expect("batched ack");
    assert_fenced(got[0].clone(), 0, newer);
    assert_eq!(got[1], Ok(3));
    hmgets("a batched ack of a stale fence and an exact one", 3);
    assert_eq!(store.fenced_xack(&check(0, newer), &s0, GROUP, &[]).await, Ok(0));
    // No id: nothing for the fast path to ack, so it does not read the key; the full check does.
    hmgets("a single ack of no id", 1);
}

/// Real Redis only: an `XACK` of a watched ack is never sent on a connection not known to be in a
/// transaction. A user refused `MULTI` (here from the start; the same for a server that renamed it
/// away) gets no transaction at all: after a raise for another grant, its stale batched ack is
/// `FENCED` and acknowledged nothing (it was acked outside any transaction when the `XACK`s went in
/// one pipeline after a `MULTI` whose answer was not known yet, a review finding). A user whose
/// `EXEC` is revoked while its connection waits in a transaction has that transaction discarded.
#[tokio::test]
async fn redis_store_never_acks_outside_a_transaction_when_multi_or_exec_is_refused() {
    let server = crate::support::RedisServer::start();
    let admin = rsc::store::redis::RedisStore::connect(&server.url(), Default::default()).await.expect("admin");
    for (user, revoked) in [("nomulti", "-multi"), ("noexec", "-exec")] {
        let from_start = user == "nomulti";
        let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all"];
        if from_start {
            setuser.push(revoked);
        }
        server.cmd(&setuser);
        let url = format!("redis://{user}:pw@127.0.0.1:{}", server.port());
        let store = rsc::store::redis::RedisStore::connect(&url, Default::default()).await.expect("connect");
        let shard = if from_start { 0 } else { 1 };
        let s = stream(shard);
        store.ensure_group(&s, GROUP).await.expect("ensure");
        let added = add(&store, &s, 3).await;
        let fence = raise_one(&admin, &fence_key(shard), 0x60).await;
        store.fenced_xreadgroup(&check(shard, fence), GROUP, "c1", &s, ReadFrom::New, 0).await.expect("read");
        let ack =
            |id: EntryId, fence: Fence| FencedAck { fence: check(shard, fence), stream: s.clone(), ids: vec![id] };
        // Two acks with the exact fence: the first leaves the key watched and read.
        for id in &added[..2] {
            assert_eq!(store.fenced_xack_many(GROUP, &[ack(*id, fence)]).await, Ok(vec![Ok(1)]), "{user}");
        }
        if !from_start {
            server.cmd(&["ACL", "SETUSER", user, revoked]);
        }
        let raised = raise_one(&admin, &fence_key(shard), 0x61).await;
        let got = store.fenced_xack_many(GROUP, &[ack(added[2], fence)]).await.expect("batched ack");
        assert_fenced(got[0].clone(), shard, raised);
        assert_eq!(
            own_pending(&store, &s, "c1").await,
            added[2..].to_vec(),
            "{user}: the stale ack acknowledged nothing"
        );
    }
}

/// Real Redis only: a server that lost its script cache (restart, failover, SCRIPT FLUSH) answers
/// the pipelined raise with NOSCRIPT; the store loads the script and sends only the calls that
/// did not run, so no key is raised twice.
#[tokio::test]
async fn redis_store_raises_fences_once_after_the_script_cache_was_flushed() {
    let server = crate::support::RedisServer::start();
    let options = rsc::store::redis::RedisStoreOptions::default();
    let store = rsc::store::redis::RedisStore::connect(&server.url(), options).await.expect("connect");
    assert_eq!(raise_one(&store, &fence_key(0), 1).await.counter, 1);
    server.cmd(&["SCRIPT", "FLUSH"]);
    let raises: Vec<FenceRaise> =
        (0..3).map(|shard| FenceRaise { key: fence_key(shard), nonce: 2, floor: 0 }).collect();
    let raised = store.raise_fences(&raises).await.expect("raise after a flush");
    assert_eq!(raised.iter().map(|f| f.counter).collect::<Vec<_>>(), vec![2, 1, 1]);
    server.cmd(&["SCRIPT", "FLUSH"]);
    let s = stream(0);
    store.ensure_group(&s, GROUP).await.expect("ensure");
    let added = add(&store, &s, 1).await;
    let read = store.fenced_xreadgroup(&check(0, raised[0]), GROUP, "c1", &s, ReadFrom::New, 1).await;
    assert_eq!(read.map(|e| ids(&e)), Ok(added));
    assert_eq!(store.read_fences(&[fence_key(0)]).await, Ok(vec![Some(raised[0])]));
}

/// Real Redis only: a master with `min-replicas-to-write` and no replica (an old master cut off
/// from its replicas) answers writes `NOREPLICAS`. It is `Unavailable` (the call did nothing; it
/// was `Protocol` before), and a batched fenced call fails as a whole, as on a replica, so that
/// through Sentinel the client replaces the connection and finds the new master.
#[tokio::test]
async fn redis_store_calls_on_a_master_without_its_replicas_are_unavailable_and_batches_fail_whole() {
    let primary = crate::support::RedisServer::start();
    let options = rsc::store::redis::RedisStoreOptions::default();
    let store = rsc::store::redis::RedisStore::connect(&primary.url(), options).await.expect("connect");
    let s = stream(0);
    store.ensure_group(&s, GROUP).await.expect("ensure");
    let added = add(&store, &s, 2).await;
    let fence = raise_one(&store, &fence_key(0), 5).await;
    primary.cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    let unavailable = |what: &str, result: Result<(), StoreError>| match result {
        Err(StoreError::Unavailable(text)) => assert!(text.contains("NOREPLICAS"), "{what}: {text}"),
        other => panic!("{what}: expected Unavailable with NOREPLICAS, got {other:?}"),
    };
    unavailable("XADD", store.xadd(&s, vec![("k".into(), b"v".to_vec())], None).await.map(drop));
    let reads = [FencedRead { fence: check(0, fence), stream: s.clone(), from: ReadFrom::New, count: 10 }];
    unavailable("batched read", store.fenced_xreadgroup_many(GROUP, "c1", &reads).await.map(drop));
    let acks = [FencedAck { fence: check(0, fence), stream: s.clone(), ids: added.clone() }];
    unavailable("batched ack", store.fenced_xack_many(GROUP, &acks).await.map(drop));
    primary.cmd(&["CONFIG", "SET", "min-replicas-to-write", "0"]);
    let got = store.fenced_xreadgroup_many(GROUP, "c1", &reads).await.expect("served again");
    assert_eq!(got[0].as_ref().map(|e| ids(e)), Ok(added));
}

/// Real Redis only: a batched call that lands on a server that is no longer a writable master
/// (a demoted primary: here a replica) fails as a whole with the server's `READONLY`, as the
/// single-shard script does, so the client replaces the connection, instead of answering every
/// shard with its own error on a connection it keeps.
#[tokio::test]
async fn redis_store_batched_calls_on_a_replica_fail_as_a_whole() {
    let primary = crate::support::RedisServer::start();
    let replica = primary.start_replica();
    let options = rsc::store::redis::RedisStoreOptions::default();
    let store = rsc::store::redis::RedisStore::connect(&primary.url(), options.clone()).await.expect("connect");
    let s = stream(0);
    store.ensure_group(&s, GROUP).await.expect("ensure");
    let added = add(&store, &s, 2).await;
    let fence = raise_one(&store, &fence_key(0), 5).await;
    // The replica holds the stream and the fence, so READONLY is the only reason to refuse (WAIT
    // on a fresh admin connection with no writes of its own would return at once).
    primary.wait_replicated(1);
    let on_replica = rsc::store::redis::RedisStore::connect(&replica.url(), options).await.expect("connect replica");
    let reads = [FencedRead { fence: check(0, fence), stream: s.clone(), from: ReadFrom::New, count: 10 }];
    match on_replica.fenced_xreadgroup_many(GROUP, "c1", &reads).await {
        Err(StoreError::Unavailable(text)) => assert!(text.contains("READONLY"), "{text}"),
        other => panic!("expected the whole call to fail with READONLY, got {other:?}"),
    }
    let acks = [FencedAck { fence: check(0, fence), stream: s.clone(), ids: added.clone() }];
    match on_replica.fenced_xack_many(GROUP, &acks).await {
        Err(StoreError::Unavailable(text)) => assert!(text.contains("READONLY"), "{text}"),
        other => panic!("expected the whole call to fail with READONLY, got {other:?}"),
    }
    // The primary still serves the same calls.
    let got = store.fenced_xreadgroup_many(GROUP, "c1", &reads).await.expect("primary");
    assert_eq!(got[0].as_ref().map(|e| ids(e)), Ok(added));
}
