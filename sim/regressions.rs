//! The regression corpus: capsules in `fault-plans/capsules/`, replayed by
//! `cargo sim regressions` so a fixed bug stays fixed.
//!
//! Every run that once found a bug is kept as a capsule (the whole drawn run, `found` and `fix`
//! inside), so it keeps meaning the same run whatever happens to its plan file. Two directories:
//! - `fault-plans/capsules/*.toml`: each must replay without a finding;
//! - `fault-plans/capsules/planted/*.toml`: shrunk runs of planted bugs; each must replay clean
//!   with its planted bugs off, and should still produce its first recorded kind with them on.
//!   A shrunk run sits on the edge of its bug, so a product change that moves timing can make it
//!   pass with the bug: that is reported as stale (record the capsules again), not as a failure;
//!   `cargo sim planted` is what must catch every bug over its seeds.
//!
//! Each replay also says whether its trace is still the recorded one: a different hash means the
//! product or trace code changed since the capsule was recorded, not that the capsule changed
//! (`cargo sim capsule-check` proves capsules replay exactly at one commit). A capsule that cannot
//! be loaded (stale format, a broken file) fails the run at the end, after every other capsule
//! was replayed, so one bad file hides no other result.

use std::path::{Path, PathBuf};

#[cfg(madsim)]
use crate::plan::PlanError;

/// The corpus directory under the plans directory.
pub fn corpus_dir(plans: &Path) -> PathBuf {
    plans.join("capsules")
}

/// Replays every capsule of the corpus; true when each behaves as its directory requires.
#[cfg(madsim)]
pub fn run(plans: &Path) -> Result<bool, PlanError> {
    use crate::capsule::replay::hash_verdict;
    use crate::capsule::{files_in, kinds_of, Capsule};
    use crate::runner::run_seed;

    let dir = corpus_dir(plans);
    let regressions = files_in(&dir)?;
    let planted = files_in(&dir.join("planted"))?;
    if regressions.is_empty() {
        println!("no capsules in {}: an empty corpus checks nothing", dir.display());
        return Ok(false);
    }
    let mut ok = true;
    let mut stale = 0;
    let mut unloadable: Vec<PathBuf> = Vec::new();
    let mut load = |path: &Path| match Capsule::load(path) {
        Ok(capsule) => Some(capsule),
        Err(e) => {
            println!("{}: FAILED (cannot load it: {e})", path.display());
            unloadable.push(path.to_path_buf());
            None
        }
    };
    for path in &regressions {
        let Some(capsule) = load(path) else { continue };
        let outcome = run_seed(capsule.run.clone(), true);
        let verdict = if outcome.findings.is_empty() { "ok" } else { "FAILED" };
        let found = capsule.found.as_deref().unwrap_or(&capsule.note);
        println!("{}: {verdict} (found: {found}; fix: {})", path.display(), capsule.fix.as_deref().unwrap_or("-"));
        println!("  {}", hash_verdict(&capsule, &outcome));
        for finding in &outcome.findings {
            println!("  {finding}");
        }
        if !outcome.findings.is_empty() {
            println!("REPRODUCE WITH: cargo sim replay --capsule {}", path.display());
            ok = false;
        }
    }
    for path in &planted {
        let Some(capsule) = load(path) else { continue };
        let Some(kind) = capsule.kinds.first() else {
            println!("{}: FAILED (a planted capsule records no kind)", path.display());
            ok = false;
            continue;
        };
        let bugged = kinds_of(&run_seed(capsule.run.clone(), false).findings);
        let control = run_seed(capsule.without_planted(), false);
        let caught = bugged.contains(kind);
        let clean = control.findings.is_empty();
        // A shrunk run sits on the edge of its bug: a product change that moves timing can make
        // it pass with the bug (stale: record it again), which `cargo sim planted` does not
        // depend on. A finding without the bug is a real failure, whatever the timing.
        let verdict = match (caught, clean) {
            (_, false) => "FAILED",
            (false, true) => "STALE (record again: bash sim/rerecord-planted.sh)",
            (true, true) => "ok",
        };
        stale += usize::from(!caught && clean);
        println!(
            "{}: {verdict} ({:?}: {kind} expected, got {bugged:?}; without the bug: {:?})",
            path.display(),
            capsule.run.planted,
            kinds_of(&control.findings)
        );
        if !clean {
            println!("REPRODUCE WITH: cargo sim replay --capsule {} --without-planted", path.display());
            ok = false;
        }
    }
    if !unloadable.is_empty() {
        println!("{} capsules could not be loaded:", unloadable.len());
        unloadable.iter().for_each(|path| println!("  {}", path.display()));
        ok = false;
    }
    if stale > 0 {
        println!(
            "{stale} of {} planted capsules no longer fail with their bug at this commit (not a failure: \
             `cargo sim planted` is what must catch every bug); record them again with sim/rerecord-planted.sh",
            planted.len()
        );
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capsule::{files_in, Capsule};

    #[test]
    fn the_shipped_capsules_parse_and_regressions_say_what_they_found_and_fixed() {
        let dir = corpus_dir(&crate::plan::default_plan_dir());
        let regressions = files_in(&dir).unwrap();
        assert!(!regressions.is_empty(), "the corpus is empty");
        for path in regressions {
            let capsule = Capsule::load(&path).unwrap();
            assert!(capsule.found.is_some() && capsule.fix.is_some(), "{}: found and fix", path.display());
            assert!(capsule.kinds.is_empty(), "{}: a regression capsule records a passing run", path.display());
        }
        for path in files_in(&dir.join("planted")).unwrap() {
            let capsule = Capsule::load(&path).unwrap();
            assert!(!capsule.run.planted.is_empty() && !capsule.kinds.is_empty(), "{}", path.display());
        }
    }

    /// A capsule that cannot be loaded fails the run at the end; it aborted it (rc 2, no other
    /// capsule replayed, only the first bad file named).
    #[cfg(madsim)]
    #[test]
    fn an_unloadable_capsule_fails_the_run_without_stopping_it() {
        let plans = std::env::temp_dir().join(format!("sim-regressions-{}", std::process::id()));
        let dir = corpus_dir(&plans);
        std::fs::create_dir_all(dir.join("planted")).unwrap();
        std::fs::write(dir.join("cut-short.toml"), "format = 1\nnote = \"cut short\"\n").unwrap();
        std::fs::write(dir.join("planted").join("not-toml.toml"), "[run").unwrap();
        let result = run(&plans);
        let _ = std::fs::remove_dir_all(&plans);
        assert!(matches!(result, Ok(false)), "{result:?}");
    }
}
