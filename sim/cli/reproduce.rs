//! The commands the tool prints to run a seed again: the REPRODUCE line of a failing seed (in
//! process and in a sweep's list), a timeline page's header and a capsule's note; and the
//! arguments a child process (a sweep's chunk, a bench run) loads its plan with.
//!
//! Owns: naming a plan file so that it is loaded again exactly (`--plans DIR` when the plan was
//! named in a directory other than the shipped one, the path when it was given as a path), and the
//! flags that change what a run is (`--without-planted`, `--check-determinism`). Never runs
//! anything.

use std::path::Path;

use super::RunFlags;
use crate::plan::{default_plan_dir, PlanSource};

/// The global arguments and the plan argument that load `source` again: `[--plans DIR] NAME` or
/// `PATH`. A printed command leaves `--plans` out for the shipped directory (the default).
fn plan_args(source: &PlanSource) -> (Vec<String>, String) {
    match source {
        PlanSource::Named { dir, name } if same_dir(dir, &default_plan_dir()) => (Vec::new(), name.clone()),
        PlanSource::Named { dir, name } => {
            (vec!["--plans".to_string(), dir.to_string_lossy().into_owned()], name.clone())
        }
        PlanSource::File(path) => (Vec::new(), path.to_string_lossy().into_owned()),
    }
}

/// The arguments of a child process (a sweep's chunk, a bench run) that loads exactly the file
/// `source` names: `--plans DIR <command> NAME` or `<command> PATH`, then `rest`. The directory
/// is always given: another build (bench's baseline) has another default.
pub fn child_args(source: &PlanSource, command: &str, rest: &[String]) -> Vec<String> {
    let (mut args, plan) = match source {
        PlanSource::Named { dir, name } => {
            (vec!["--plans".to_string(), dir.to_string_lossy().into_owned()], name.clone())
        }
        PlanSource::File(path) => (Vec::new(), path.to_string_lossy().into_owned()),
    };
    args.push(command.to_string());
    args.push(plan);
    args.extend(rest.iter().cloned());
    args
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b || matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(a), Ok(b)) if a == b)
}

/// `cargo sim [--plans DIR] <words>`, each word quoted for a POSIX shell where it needs it.
fn cargo_sim(source: &PlanSource, command: &str, rest: &[String]) -> String {
    let (global, plan) = plan_args(source);
    let words =
        global.iter().map(String::as_str).chain([command, plan.as_str()]).chain(rest.iter().map(String::as_str));
    let words: Vec<String> = words.map(shell_word).collect();
    format!("cargo sim {}", words.join(" "))
}

/// The command that runs `seed` of the plan again as the reported run was: `replay` (one run with
/// the full trace) unless the run switched the planted bugs off or compared two runs, which
/// `replay <plan>` cannot do: then `run --seeds S` with the same flags.
pub fn reproduce_command(source: &PlanSource, seed: u64, flags: RunFlags) -> String {
    if !flags.without_planted && !flags.check_determinism {
        return cargo_sim(source, "replay", &[seed.to_string()]);
    }
    let mut rest = vec!["--seeds".to_string(), seed.to_string()];
    if flags.without_planted {
        rest.push("--without-planted".to_string());
    }
    if flags.check_determinism {
        rest.push("--check-determinism".to_string());
    }
    cargo_sim(source, "run", &rest)
}

/// The command that draws the timeline page of `seed` again.
pub fn timeline_command(source: &PlanSource, seed: u64, without_planted: bool) -> String {
    let mut rest = vec![seed.to_string()];
    if without_planted {
        rest.push("--without-planted".to_string());
    }
    cargo_sim(source, "timeline", &rest)
}

/// The file stem of what one run writes (trace, capsule, timeline page): `<plan>-<seed>`, and
/// `-without-planted` for a control run, so that it never overwrites the planted run's files.
/// `plan` is the plan's `name`, never the argument that named it (a path): characters outside
/// `[A-Za-z0-9._-]` become `_`, so the file stays in its directory.
pub fn run_stem(plan: &str, seed: u64, without_planted: bool) -> String {
    let plan: String =
        plan.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    let control = if without_planted { "-without-planted" } else { "" };
    format!("{plan}-{seed}{control}")
}

/// `word` as one POSIX shell word: unchanged when it is plain, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "_-./:=@+,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
