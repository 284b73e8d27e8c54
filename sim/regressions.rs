//! `fault-plans/regressions.toml`: every seed that once found a bug, replayed by
//! `cargo sim regressions` so a fixed bug stays fixed.
//!
//! ```toml
//! [[regression]]
//! plan = "swarm"            # plan name (file stem in fault-plans/)
//! seed = 1234
//! found = "date: what the checker reported"
//! fix = "what changed (commit or summary)"
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::plan::PlanError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Regressions {
    #[serde(default)]
    regression: Vec<Regression>,
}

/// One remembered seed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regression {
    pub plan: String,
    pub seed: u64,
    pub found: String,
    pub fix: String,
}

/// Parses the regressions file.
pub fn parse(text: &str, path: &Path) -> Result<Vec<Regression>, PlanError> {
    let parsed: Regressions =
        toml::from_str(text).map_err(|e| PlanError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(parsed.regression)
}

/// Replays every regression; true when none fails.
#[cfg(madsim)]
pub fn run(dir: &Path) -> Result<bool, PlanError> {
    let path = dir.join("regressions.toml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| PlanError::Io { path: path.clone(), message: e.to_string() })?;
    let mut ok = true;
    for r in parse(&text, &path)? {
        let plan = crate::plan::load_plan(dir, &r.plan)?.draw(r.seed)?;
        let outcome = crate::runner::run_seed(plan, false);
        let verdict = if outcome.findings.is_empty() { "ok" } else { "FAILED" };
        println!("{} seed {}: {verdict} (found: {}; fix: {})", r.plan, r.seed, r.found, r.fix);
        for finding in &outcome.findings {
            println!("  {finding}");
        }
        if !outcome.findings.is_empty() {
            println!("REPRODUCE WITH: cargo sim replay {} {}", r.plan, r.seed);
            ok = false;
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_parses_and_entries_name_existing_plans() {
        let dir = crate::plan::default_plan_dir();
        let path = dir.join("regressions.toml");
        let entries = parse(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        for r in entries {
            crate::plan::load_plan(&dir, &r.plan).unwrap().draw(r.seed).unwrap();
        }
        let one = parse("[[regression]]\nplan = \"swarm\"\nseed = 7\nfound = \"x\"\nfix = \"y\"", &path).unwrap();
        assert_eq!((one[0].plan.as_str(), one[0].seed), ("swarm", 7));
        assert!(parse("[[regression]]\nplan = \"swarm\"\nseed = 7", &path).is_err(), "found and fix are required");
    }
}
