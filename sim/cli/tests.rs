//! The commands the tool prints run the reported run again: parsed back, each names the same
//! plan file and the flags that change what the run is.

use std::path::PathBuf;

use clap::Parser;

use super::reproduce::{reproduce_command, run_stem, timeline_command};
use super::{Cli, Command, RunFlags};
use crate::plan::{default_plan_dir, PlanSource};

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
