//! The commands the tool prints run the reported run again: parsed back, each names the same
//! plan file and the flags that change what the run is.

use std::path::PathBuf;

use clap::Parser;

use super::reproduce::{reproduce_command, run_stem, timeline_command};
use super::{parse_seeds, write_failure_files, Cli, Command, Failure, RunFlags, NONDETERMINISM};
use crate::plan::{default_plan_dir, load_plan, PlanSource};

/// Parses a printed `cargo sim ...` command as `sim` would (its words hold no spaces here).
fn parse(command: &str) -> Cli {
    let args = command.strip_prefix("cargo sim ").unwrap_or_else(|| panic!("not a cargo sim command: {command}"));
    let argv = std::iter::once("sim").chain(args.split_whitespace());
    Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{command}: {e}"))
}

fn shipped(name: &str) -> PlanSource {
    PlanSource::Named { dir: default_plan_dir(), name: name.to_string() }
}

#[test]
fn a_control_runs_reproduce_command_runs_without_the_planted_bugs() {
    let flags = RunFlags { without_planted: true, ..RunFlags::default() };
    let command = reproduce_command(&shipped("planted-x"), 3, flags);
    let cli = parse(&command);
    let Command::Run { plan, seeds, without_planted, capsule: None, .. } = cli.command else {
        panic!("{command}: not a plan run")
    };
    assert_eq!((plan.as_deref(), seeds, without_planted), (Some("planted-x"), (3, 4), true), "{command}");
    assert_eq!(cli.plans, default_plan_dir());
}

#[test]
fn an_ordinary_failures_reproduce_command_replays_the_seed() {
    let command = reproduce_command(&shipped("standard"), 7, RunFlags::default());
    assert_eq!(command, "cargo sim replay standard 7");
    let Command::Replay { plan, seed, .. } = parse(&command).command else { panic!("{command}: not a replay") };
    assert_eq!((plan.as_deref(), seed), (Some("standard"), Some(7)));
}

#[test]
fn a_plan_from_another_directory_or_a_path_is_named_so_that_the_same_file_loads() {
    let dir = PathBuf::from("/tmp/my-plans");
    let named = PlanSource::Named { dir: dir.clone(), name: "foo".into() };
    let command = reproduce_command(&named, 7, RunFlags::default());
    let cli = parse(&command);
    assert_eq!(cli.plans, dir, "{command}");
    let Command::Replay { plan, seed, .. } = cli.command else { panic!("{command}: not a replay") };
    assert_eq!((plan.as_deref(), seed), (Some("foo"), Some(7)));

    let file = PlanSource::File(PathBuf::from("/tmp/edited/standard.toml"));
    let command = reproduce_command(&file, 2, RunFlags::default());
    let Command::Replay { plan, .. } = parse(&command).command else { panic!("{command}: not a replay") };
    assert_eq!(plan.as_deref(), Some("/tmp/edited/standard.toml"));
    assert_eq!(timeline_command(&named, 4, true), "cargo sim --plans /tmp/my-plans timeline foo 4 --without-planted");
}

#[test]
fn a_control_run_writes_its_files_under_another_name() {
    assert_ne!(run_stem("planted-x", 3, true), run_stem("planted-x", 3, false));
    assert_eq!(run_stem("planted-x", 3, false), "planted-x-3");
}

/// A plan given as a path, or named in another directory, whose `name` is another plan's: a
/// sweep's child and a bench run load the very file their parent loaded.
#[test]
fn a_child_process_loads_exactly_the_plan_file_its_parent_loaded() {
    let dir = std::env::temp_dir().join(format!("sim-child-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shipped = std::fs::read_to_string(default_plan_dir().join("standard.toml")).unwrap();
    // Still `name = "standard"`, another topology: it draws another run than the shipped plan.
    let edited = shipped.replace("shards = 8", "shards = 5");
    assert_ne!(edited, shipped);
    std::fs::write(dir.join("mine.toml"), &edited).unwrap();
    let path = dir.join("mine.toml").to_string_lossy().into_owned();
    for parent in [load_plan(&default_plan_dir(), &path).unwrap(), load_plan(&dir, "mine").unwrap()] {
        let expected = parent.draw(1).unwrap();
        let chunk = crate::sweep::chunk_args(&parent.source(), (1, 2), RunFlags::default());
        let bench = crate::bench::run_args(&parent.source(), 1, true);
        for args in [chunk, bench] {
            let cli = Cli::try_parse_from(std::iter::once("sim".to_string()).chain(args.clone()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let plan = match cli.command {
                Command::Chunk { plan, .. } | Command::Run { plan: Some(plan), .. } => plan,
                _ => panic!("{args:?}: not a chunk or a run"),
            };
            let child = load_plan(&cli.plans, &plan).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(child.draw(1).unwrap(), expected, "{args:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_determinism_failures_reproduce_command_runs_the_seed_twice_and_compares() {
    let flags = RunFlags { check_determinism: true, ..RunFlags::default() };
    let command = reproduce_command(&shipped("standard"), 5, flags);
    let Command::Run { plan, seeds, check_determinism, .. } = parse(&command).command else {
        panic!("{command}: not a plan run")
    };
    assert_eq!((plan.as_deref(), seeds, check_determinism), (Some("standard"), (5, 6), true), "{command}");
}

/// `--check-determinism` found only that two runs differed: the traced re-run passes, and its
/// capsule would record a passing run (`shrink`: nothing to shrink; `replay --capsule`: exit 0).
#[test]
fn a_seed_that_failed_only_by_nondeterminism_writes_no_passing_capsule() {
    use crate::checkers::Finding;
    use crate::runner::SeedOutcome;
    let plan = load_plan(&default_plan_dir(), "standard").unwrap().draw(0).unwrap();
    // A name of its own: the files it writes are no real run's.
    let name = "test-nondeterminism-only";
    let failure =
        Failure { source: shipped(name), name, flags: RunFlags { check_determinism: true, ..RunFlags::default() } };
    let outcome = |findings: Vec<Finding>| SeedOutcome {
        seed: 0,
        coverage: Default::default(),
        findings,
        measurements: Default::default(),
        trace_hash: 1,
        trace: Vec::new(),
        history: Vec::new(),
        records: None,
        simulated: Default::default(),
        wall: Default::default(),
    };
    let differed = Finding { checker: "runner", kind: NONDETERMINISM, at_us: 0, detail: "hash a then b".into() };
    let path = crate::capsule::default_dir().join(format!("{name}-0.toml"));
    let _ = std::fs::remove_file(&path);
    assert_eq!(write_failure_files(&failure, &plan, &outcome(vec![differed]), &outcome(Vec::new())), None);
    assert!(!path.exists(), "{} records a passing run", path.display());
}

#[test]
fn the_largest_seed_is_refused_rather_than_wrapping_to_an_empty_range() {
    assert!(parse_seeds("18446744073709551615").is_err(), "u64::MAX..0 ran nothing and passed");
    assert_eq!(parse_seeds("18446744073709551614"), Ok((u64::MAX - 1, u64::MAX)));
    assert_eq!(parse_seeds("7"), Ok((7, 8)));
    for bad in ["5..3", "5..5", "", "..5", "x"] {
        assert!(parse_seeds(bad).is_err(), "{bad:?}");
    }
}

/// `run --capsule` runs the capsule once: a flag it would ignore (`--check-determinism` in a CI
/// step, say) is refused, not silently dropped.
#[test]
fn a_capsule_run_refuses_the_flags_it_would_ignore() {
    let base = ["sim", "run", "--capsule", "x.toml"];
    assert!(Cli::try_parse_from(base).is_ok());
    assert!(Cli::try_parse_from([&base[..], &["--without-planted"]].concat()).is_ok());
    let ignored: [&[&str]; 5] =
        [&["--check-determinism"], &["--seeds", "0..5"], &["--jobs", "2"], &["--verbose"], &["--json"]];
    for extra in ignored {
        assert!(Cli::try_parse_from([&base[..], extra].concat()).is_err(), "{extra:?}");
    }
}

/// `coverage` runs seeds like `run` does: a seed that found a violation fails it, even when every
/// must-reach item was reached (it passed with rc 0).
#[test]
fn coverage_fails_when_a_seed_found_a_violation() {
    let dir = std::env::temp_dir().join(format!("sim-coverage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A planted plan under another file name (coverage skips planted-* files): seed 0 is caught.
    let planted = default_plan_dir().join("planted-route-over-one-shard-too-many.toml");
    std::fs::copy(planted, dir.join("routes-over-one-shard.toml")).unwrap();
    std::fs::write(dir.join("must-reach.toml"), "items = []\n").unwrap();
    let passed = super::coverage(&dir, (0, 1));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!passed.unwrap(), "a failing seed must fail coverage");
}

/// `replay` and `timeline` name their files after the plan's name; a name that is a path (or
/// holds one) still writes inside the output directory (`timeline fault-plans/x.toml 3` failed
/// after the run; `replay /abs/x.toml 3` wrote next to the plan).
#[test]
fn a_runs_files_stay_in_their_directory_whatever_the_plan_is_called() {
    let out = std::path::Path::new("/out");
    for name in ["a/b.toml", "/x/b.toml", "../up", "fault-plans/standard.toml"] {
        let path = out.join(format!("{}.log", run_stem(name, 3, false)));
        assert_eq!(path.parent(), Some(out), "{name}: {}", path.display());
    }
    assert_eq!(run_stem("standard", 3, false), "standard-3");
    assert_eq!(run_stem("planted-x", 3, true), "planted-x-3-without-planted");
}

/// `run all` over a directory with no plans (or only planted ones) is an error, not a sweep that
/// ran nothing and passed.
#[test]
fn run_all_refuses_a_directory_without_plans() {
    let dir = std::env::temp_dir().join(format!("sim-no-plans-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(default_plan_dir().join("planted-reuse-lost-version.toml"), dir.join("planted-x.toml")).unwrap();
    let result = super::run_plans(&dir, "all", (0, 1), RunFlags::default(), 1, false);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(result.is_err(), "{:?}", result.ok());
}
