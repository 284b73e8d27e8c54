//! Contract cases for `touch_and_check`, the steady heartbeat against a cached record: what
//! "unchanged" means (the whole stamp, never the revision alone), and that it leaves no key behind
//! for a group whose metadata is gone.

use std::collections::BTreeMap;

use rsc::store::{MetadataStore, RecordStamp, StreamStore, TouchCheck, TouchResult, WriteOutcome};

use crate::metadata::{cas, create, group, stored};

fn stamp_of(record: &Option<rsc::store::StoredRecord>) -> RecordStamp {
    record.as_ref().and_then(|r| r.stamp()).expect("a written record has a stamp")
}

pub async fn contract_touch_and_check_unchanged_and_changed<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(WriteOutcome::Written { revision: 1 }));
    let v1 = store.load(&g).await.expect("load");
    let known = stamp_of(&v1);

    // Same write: unchanged, and the liveness counter still moves (the heartbeat counted).
    assert_eq!(store.touch_and_check(&g, "m1", &known).await, Ok(TouchCheck::Unchanged { liveness: 1 }));
    assert_eq!(store.touch_and_check(&g, "m1", &known).await, Ok(TouchCheck::Unchanged { liveness: 2 }));

    // A new write: the record comes back in full, read after the increment.
    assert_eq!(store.write(&g, cas(&stored(store, &g).await, "v2")).await, Ok(WriteOutcome::Written { revision: 2 }));
    let v2 = store.load(&g).await.expect("load");
    let expected = TouchCheck::Changed(TouchResult { liveness: 3, record: v2.clone() });
    assert_eq!(store.touch_and_check(&g, "m1", &known).await, Ok(expected));

    // The revision alone is not the write: the same revision with another writeId (a rollback
    // followed by a different write of that revision) is a change.
    let forged = RecordStamp { write_id: format!("{}-other", known.write_id), ..stamp_of(&v2) };
    let check = store.touch_and_check(&g, "m1", &forged).await.expect("touch");
    assert_eq!(check, TouchCheck::Changed(TouchResult { liveness: 4, record: v2.clone() }));
    // So is another schema version under the same id (an out-of-band edit of that field).
    let schema = RecordStamp { schema_version: 99, ..stamp_of(&v2) };
    assert!(matches!(store.touch_and_check(&g, "m1", &schema).await, Ok(TouchCheck::Changed(_))));
    // An empty writeId never matches, even when the stored one is empty too.
    let empty = RecordStamp { write_id: String::new(), ..stamp_of(&v2) };
    assert!(matches!(store.touch_and_check(&g, "m1", &empty).await, Ok(TouchCheck::Changed(_))));
    assert_eq!(store.touch_and_check(&g, "m1", &stamp_of(&v2)).await, Ok(TouchCheck::Unchanged { liveness: 7 }));
}

pub async fn contract_touch_and_check_leaves_no_key_for_a_vanished_group<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(WriteOutcome::Written { revision: 1 }));
    let known = stamp_of(&store.load(&g).await.expect("load"));
    assert_eq!(store.touch_and_check(&g, "m1", &known).await, Ok(TouchCheck::Unchanged { liveness: 1 }));
    assert_eq!(store.delete(&g, &stored(store, &g).await).await, Ok(WriteOutcome::Written { revision: 0 }));

    // A coordinator still holding the deleted group's stamp: the record is reported gone and
    // no liveness hash survives the call (the pipelined HINCRBY recreated it; it is removed).
    let gone = TouchCheck::Changed(TouchResult { liveness: 0, record: None });
    assert_eq!(store.touch_and_check(&g, "m1", &known).await, Ok(gone.clone()));
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::new()));
    assert_eq!(store.touch_and_check(&g, "m2", &known).await, Ok(gone));
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::new()));
    assert_eq!(store.load(&g).await, Ok(None));
}

/// A liveness counter is read exactly past 2^53 (a Lua number is a double: the touch script returns
/// the field as stored, not the number HINCRBY handed the script), and an increment past `i64::MAX`
/// is refused and changes nothing, on both paths, as `HINCRBY` refuses it (the fake does not
/// saturate: it is never stronger than Redis).
pub async fn contract_liveness_counters_are_exact_and_refuse_overflow<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(WriteOutcome::Written { revision: 1 }));
    let known = stamp_of(&store.load(&g).await.expect("load"));
    let past_doubles = (1u64 << 53) + 1;
    let touched = store.touch_and_load_by(&g, "m1", past_doubles).await.expect("touch");
    assert_eq!(touched.liveness, past_doubles, "read exactly, not rounded to a double");
    assert_eq!(
        store.touch_and_check_by(&g, "m1", &known, 2).await,
        Ok(TouchCheck::Unchanged { liveness: past_doubles + 2 })
    );

    let max = i64::MAX.unsigned_abs();
    for refused in [store.touch_and_load_by(&g, "m1", max).await.map(|_| ()), {
        store.touch_and_check_by(&g, "m1", &known, max).await.map(|_| ())
    }] {
        match refused {
            Err(rsc::store::StoreError::Protocol(text)) => assert!(text.contains("overflow"), "{text}"),
            other => panic!("an increment past i64::MAX is refused: {other:?}"),
        }
    }
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::from([("m1".to_string(), past_doubles + 2)])));
    // The largest counter a hash field holds is still reached and read exactly.
    let to_max = max - (past_doubles + 2);
    assert_eq!(store.touch_and_load_by(&g, "m1", to_max).await.map(|t| t.liveness), Ok(max));
}
