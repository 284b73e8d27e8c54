//! The rebalances the bench times: a join storm (N joiners onto members that own everything) and
//! a rolling bounce (each member leaves cleanly, then a new one joins). Each run builds its own
//! [`Rig`] (fresh coordinator process, fresh group) and tears it down, whatever happened.
//!
//! Before every timed change the run waits a random part of a heartbeat interval (drawn from a
//! generator seeded by the run number, so `before` and `after` see the same pauses): otherwise the
//! change would always start right after the settled members' last heartbeat, in the same phase
//! of their heartbeat cycle, and the numbers would measure that one phase.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::rig::{Outcome, Rig, RigSettings, Unfinished, Variant};
use crate::support::RedisServer;
use rsc::core::model::{GroupConfig, GroupId, LAYOUT_VERSION, SCHEMA_VERSION};
use rsc::service::codec::{decode, encode};
use rsc::store::StoredRecord;

/// Which rebalance, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `joiners` members join at once onto `initial` members that own every shard.
    Storm { initial: usize, joiners: usize },
    /// `members` settled members are replaced one at a time: a clean leave, then a join.
    Bounce { members: usize },
}

#[derive(Clone, Debug)]
pub struct Scenario {
    /// Short name for `REB_SCENARIOS` and progress lines.
    pub key: &'static str,
    pub kind: Kind,
    pub shard_count: u32,
    pub reps: usize,
    /// The goal for the slowest sample, in heartbeat intervals.
    pub goal_intervals: f64,
    /// Longest wait for one rebalance; a slower one is recorded as unfinished, at this value.
    pub deadline: Duration,
}

impl Scenario {
    pub fn title(&self) -> String {
        match self.kind {
            Kind::Storm { initial, joiners } => {
                format!("join storm {joiners} onto {initial}, {} shards", self.shard_count)
            }
            Kind::Bounce { members } => {
                format!("rolling bounce of {members}, {} shards (per bounce)", self.shard_count)
            }
        }
    }
}

/// What one run of a scenario produced: one outcome per timed rebalance, and the error that ended
/// the run early, if any.
pub struct RunResult {
    pub outcomes: Vec<Outcome>,
    pub error: Option<String>,
}

pub async fn run(
    redis: &Arc<RedisServer>,
    settings: RigSettings,
    scenario: &Scenario,
    variant: Variant,
    rep: usize,
) -> RunResult {
    let group = GroupId::new("reb", format!("{}-{}-{rep}", scenario.key, variant.name()));
    let seed = rep as u64;
    let mut phase = Phase(SmallRng::seed_from_u64(seed));
    let settings = RigSettings { deadline: scenario.deadline, ..settings };
    let mut rig = match Rig::start(redis, settings, variant, group, scenario.shard_count, seed).await {
        Ok(rig) => rig,
        Err(e) => return RunResult { outcomes: Vec::new(), error: Some(e) },
    };
    let mut outcomes = Vec::new();
    let result = match scenario.kind {
        Kind::Storm { initial, joiners } => storm(&mut rig, &mut phase, initial, joiners, &mut outcomes).await,
        Kind::Bounce { members } => bounce(&mut rig, &mut phase, members, &mut outcomes).await,
    };
    rig.teardown().await;
    RunResult { outcomes, error: result.err() }
}

/// Random pauses of less than one heartbeat interval (see the module docs).
struct Phase(SmallRng);

impl Phase {
    async fn pause(&mut self) {
        let interval_ms = GroupConfig::default().heartbeat_interval_ms;
        tokio::time::sleep(Duration::from_millis(self.0.gen_range(0..interval_ms))).await;
    }
}

async fn storm(
    rig: &mut Rig,
    phase: &mut Phase,
    initial: usize,
    joiners: usize,
    out: &mut Vec<Outcome>,
) -> Result<(), String> {
    for i in 0..initial {
        rig.join(&format!("m{i:04}"));
    }
    let setup = rig.window();
    rig.wait_all_ok(setup).await.map_err(|u| format!("setup: {}", u.why))?;
    phase.pause().await;
    let window = rig.window();
    for i in initial..initial + joiners {
        rig.join(&format!("m{i:04}"));
    }
    let mut outcome = timed(rig.wait_all_ok(window).await, out)?;
    if rig.shard_count >= 1024 {
        codec_cost(rig, &mut outcome).await;
    }
    out.push(outcome);
    Ok(())
}

async fn bounce(rig: &mut Rig, phase: &mut Phase, members: usize, out: &mut Vec<Outcome>) -> Result<(), String> {
    for i in 0..members {
        rig.join(&format!("m{i:04}"));
    }
    let setup = rig.window();
    rig.wait_all_ok(setup).await.map_err(|u| format!("setup: {}", u.why))?;
    for i in 0..members {
        phase.pause().await;
        let window = rig.window();
        rig.close(&format!("m{i:04}")).await?;
        rig.join(&format!("n{i:04}"));
        let outcome = timed(rig.wait_all_ok(window).await, out)?;
        out.push(outcome);
    }
    Ok(())
}

/// A finished rebalance, or the unfinished one recorded in `out` (timed at the deadline) and its
/// error, which ends the run: the group is in no state to time another change.
fn timed(result: Result<Outcome, Unfinished>, out: &mut Vec<Outcome>) -> Result<Outcome, String> {
    result.map_err(|unfinished| {
        out.push(unfinished.outcome);
        unfinished.why
    })
}

/// Encode and decode time of the settled aggregate (mean of a few rounds): what a write pays to
/// serialize the whole aggregate, and what a request pays to read it after any change.
async fn codec_cost(rig: &Rig, outcome: &mut Outcome) {
    const ROUNDS: u32 = 10;
    let Ok(description) = rig.coordinator().describe(&rig.group).await else { return };
    let g = description.metadata;
    let started = Instant::now();
    let mut aggregate = String::new();
    for _ in 0..ROUNDS {
        aggregate = std::hint::black_box(encode(&g).unwrap_or_default());
    }
    let encode_ms = started.elapsed().as_secs_f64() * 1e3 / f64::from(ROUNDS);
    let record = StoredRecord {
        aggregate,
        revision: description.store_revision,
        schema_version: SCHEMA_VERSION,
        layout_version: LAYOUT_VERSION,
        updated_at_ms: 0,
        write_id: String::new(),
    };
    let started = Instant::now();
    for _ in 0..ROUNDS {
        let _ = std::hint::black_box(decode(&rig.group, &record));
    }
    let decode_ms = started.elapsed().as_secs_f64() * 1e3 / f64::from(ROUNDS);
    outcome.codec_ms = Some((encode_ms, decode_ms));
}
