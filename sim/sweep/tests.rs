//! A seed line carries everything the summary table adds up, and the chunks cover every seed of
//! every plan exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{chunks, SeedLine};
use crate::checkers::{Finding, Measurements};
use crate::runner::SeedOutcome;

fn outcome() -> SeedOutcome {
    let measurements = Measurements {
        silent_rollback_split_us: Some(1_234),
        stranded_entries: 2,
        stranded_unprovable_entries: 3,
        unprovable_version_reuses: 4,
        correction_rounds_by_cause: BTreeMap::from([("identity-change", 3)]),
        ..Measurements::default()
    };
    SeedOutcome {
        seed: 42,
        coverage: BTreeMap::from([("status:OK".to_string(), 5)]),
        findings: vec![Finding { checker: "split", kind: "split-ownership", at_us: 7, detail: "a \"b\"\nc".into() }],
        measurements,
        trace_hash: 0,
        trace: Vec::new(),
        history: Vec::new(),
        records: None,
        simulated: Duration::from_secs(90),
        wall: Duration::from_millis(1_500),
    }
}

#[test]
fn a_seed_line_round_trips_what_the_summary_reads() {
    let line = SeedLine::from_outcome("standard", &outcome()).to_line();
    assert!(line.starts_with("SIMSEED {") && !line.contains('\n'), "{line}");
    let back = SeedLine::parse(&line).expect("parses").to_outcome();
    let original = outcome();
    assert_eq!(back.seed, 42);
    assert_eq!(back.findings, original.findings);
    assert_eq!(back.measurements, original.measurements);
    assert_eq!((back.simulated, back.wall), (original.simulated, original.wall));
    assert!(SeedLine::parse("FAILED standard seed 3").is_none(), "free text is not a seed line");
}

#[test]
fn chunks_cover_every_seed_of_every_plan_once() {
    let all = chunks(3, (10, 110), 4);
    let mut seen = BTreeMap::new();
    for chunk in &all {
        assert!(chunk.seeds.1 - chunk.seeds.0 <= 25);
        for seed in chunk.seeds.0..chunk.seeds.1 {
            *seen.entry((chunk.plan, seed)).or_insert(0) += 1;
        }
    }
    assert_eq!(seen.len(), 300);
    assert!(seen.values().all(|n| *n == 1));
    // 100 seeds over 4 jobs: chunks of ceil(100 / 16) = 7 seeds, plans interleaved.
    assert_eq!((all[0].plan, all[0].seeds, all[1].plan, all[1].seeds), (0, (10, 17), 1, (10, 17)));
    assert_eq!(chunks(1, (0, 1), 8).len(), 1);
}
