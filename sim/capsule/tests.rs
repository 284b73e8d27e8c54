use std::path::Path;

use super::*;
use crate::plan::{default_plan_dir, load_plan, plan_names};

fn round_trip(plan: &Plan) -> Plan {
    let capsule = Capsule::new(plan, &[], 0x0123_4567_89ab_cdef, "test".into());
    let text = capsule.to_toml().unwrap();
    let back = Capsule::parse(&text, Path::new("test.toml")).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back.trace_hash, "0123456789abcdef");
    back.run
}

#[test]
fn every_shipped_plan_survives_a_capsule_unchanged() {
    let dir = default_plan_dir();
    for name in plan_names(&dir).unwrap() {
        let spec = load_plan(&dir, &name).unwrap();
        for seed in 0..4 {
            let plan = spec.draw(seed).unwrap();
            assert_eq!(round_trip(&plan), plan, "{name} seed {seed}");
        }
    }
}

#[test]
fn a_capsule_keeps_its_run_when_the_plan_file_changes_its_draw_order() {
    let dir = default_plan_dir();
    let spec = load_plan(&dir, "swarm").unwrap();
    let text = Capsule::new(&spec.draw(5).unwrap(), &[], 0, "swarm 5".into()).to_toml().unwrap();
    let redrawn = reordered(&spec).draw(5).unwrap();
    assert_ne!(redrawn, spec.draw(5).unwrap(), "the reordered plan must draw another run, or this test shows nothing");
    let capsule = Capsule::parse(&text, Path::new("swarm-5.toml")).unwrap();
    assert_eq!(capsule.run, spec.draw(5).unwrap());
}

#[test]
fn a_capsule_breaking_a_draw_rule_or_naming_an_unknown_field_is_refused() {
    let plan = load_plan(&default_plan_dir(), "standard").unwrap().draw(1).unwrap();
    let text = Capsule::new(&plan, &[], 0, String::new()).to_toml().unwrap();
    let path = Path::new("bad.toml");
    assert!(Capsule::parse(&text, path).is_ok());
    let late = text
        .replace(&format!("heal_ms = {}", plan.durations.heal_ms), &format!("heal_ms = {}", plan.durations.run_ms + 1));
    assert!(Capsule::parse(&late, path).unwrap_err().to_string().contains("heal_ms"), "heal after the end");
    let typo = text.replace("trace_hash =", "trace_hsah =");
    assert!(Capsule::parse(&typo, path).is_err(), "unknown field");
    let future = text.replace("format = 1", "format = 2");
    assert!(Capsule::parse(&future, path).is_err(), "other format");
}

/// `capsule-check` on a plan with one fault, no action and no random kinds: reversing its draw
/// order draws the very same run, which is not a failure of the capsule (it was: "SAME RUN").
#[cfg(madsim)]
#[test]
fn capsule_check_of_a_plan_with_nothing_to_reorder_is_not_a_failure() {
    use super::replay::{reorder_verdict, ReorderVerdict};
    let spec = load_plan(&default_plan_dir(), "m05-metadata-key-deleted").unwrap();
    let plan = spec.draw(0).unwrap();
    let redrawn = reordered(&spec).draw(0).unwrap();
    assert_eq!(reorder_verdict(&plan, &redrawn, 7, 7), ReorderVerdict::NothingToReorder);
    let swarm = load_plan(&default_plan_dir(), "swarm").unwrap();
    let (plan, redrawn) = (swarm.draw(5).unwrap(), reordered(&swarm).draw(5).unwrap());
    assert_eq!(reorder_verdict(&plan, &redrawn, 7, 8), ReorderVerdict::Differs);
    assert_eq!(reorder_verdict(&plan, &redrawn, 7, 7), ReorderVerdict::SameRun, "a reordering that showed nothing");
}

/// `[run.group]` is the product's `GroupConfig`, which defaults missing settings and ignores
/// unknown keys: a capsule edited with a misspelt or missing setting ran fencing (say) at its
/// default without a word.
#[test]
fn a_capsule_group_with_an_unknown_or_missing_setting_is_refused() {
    let plan = load_plan(&default_plan_dir(), "standard").unwrap().draw(1).unwrap();
    let text = Capsule::new(&plan, &[], 0, String::new()).to_toml().unwrap();
    let path = Path::new("group.toml");
    assert!(text.contains("\nfencing = true\n"), "{text}");
    let misspelt = text.replace("\nfencing = true\n", "\nfencng = false\n");
    assert!(Capsule::parse(&misspelt, path).is_err(), "unknown key, fencing left at its default");
    let missing = text.replace("\nfencing = true\n", "\n");
    assert!(Capsule::parse(&missing, path).is_err(), "missing key, defaulted");
    let extra = text.replace("[run.group]\n", "[run.group]\nbogusField = 1\n");
    assert_ne!(extra, text);
    assert!(Capsule::parse(&extra, path).is_err(), "unknown key");
}
