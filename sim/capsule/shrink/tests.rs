//! The shrinker says when its run budget, not a fixpoint, ended it.

use super::Shrinker;
use crate::plan::{default_plan_dir, load_plan};

/// With no budget left, every valid candidate goes unrun: the result is no fixpoint, and
/// `shrink` must not present it as one (it stopped silently and called it done).
#[test]
fn a_shrink_stopped_by_its_run_budget_is_not_a_fixpoint() {
    let plan = load_plan(&default_plan_dir(), "standard").unwrap().draw(0).unwrap();
    assert!(!plan.actions.is_empty(), "a run with something to drop, or this test shows nothing");
    let mut shrinker = Shrinker::new(plan.clone(), "split-ownership".into(), Vec::new(), false, 0);
    assert!(!shrinker.shrink(), "the budget stopped it");
    assert_eq!((shrinker.runs, &shrinker.best), (0, &plan), "nothing ran, nothing changed");
}
