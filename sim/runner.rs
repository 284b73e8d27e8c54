//! Runs one seed of one plan in its own madsim runtime and checks it.
//!
//! A seed's run: draw the plan, build a runtime seeded with the seed (`Runtime::with_seed_and_config`,
//! the base network latency from the plan), start the world, apply the fault schedule until
//! `run_ms`, then run every checker over the recorded ground truth. A panic anywhere in the
//! simulation (a task panic aborts the whole simulation under madsim, and so does exceeding the
//! runtime's time limit) is caught and reported as a finding.
//!
//! Determinism: the event trace is hashed; `check_determinism` runs a seed twice and compares the
//! hashes (and madsim's own check — `MADSIM_TEST_CHECK_DETERMINISM=1` — compares every random draw
//! of two runs via `Runtime::check_determinism`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use madsim::runtime::Runtime;
use rsc::core::model::GroupId;
use rsc::core::PlantedBugs;
use rsc::store::memory::{AckRecord, HistoryEvent, MemoryStore, ReadRecord};

use crate::checkers::{self, Facts, Finding, Measurements, SplitBrain};
use crate::coord_rpc::COORDINATOR_PORT;
use crate::faults::Injector;
use crate::plan::Plan;
use crate::programs::Env;
use crate::records::{trace_hash, Recorder, Records, TraceLine, Us};
use crate::redis_node::{StoreRoutes, REDIS_PORT};
use crate::world::{World, SERVICE_IP};

/// Simulated time a run may overrun `run_ms` before the runtime's time limit aborts it.
const OVERRUN_MS: u64 = 120_000;

/// The outcome of one seed.
pub struct SeedOutcome {
    pub seed: u64,
    /// What the run reached (`coverage`).
    pub coverage: crate::coverage::Coverage,
    pub findings: Vec<Finding>,
    pub measurements: Measurements,
    pub trace_hash: u64,
    pub trace: Vec<TraceLine>,
    /// The store's metadata history (kept for traced runs only).
    pub history: Vec<HistoryEvent>,
    /// The run's ground truth, its trace moved to `trace` (kept for traced runs only: the
    /// timeline draws it).
    pub records: Option<Records>,
    pub simulated: Duration,
    pub wall: Duration,
}

/// What a finished simulation hands back to the checkers.
struct Run {
    records: Records,
    history: Vec<HistoryEvent>,
    end_us: Us,
    store_reads: Vec<ReadRecord>,
    store_acks: Vec<AckRecord>,
    fence_refusals: u64,
    split_brains: Vec<SplitBrain>,
}

/// The group every run uses.
pub fn sim_group() -> GroupId {
    GroupId::new("sim", "g")
}

/// Every planted bug the plan lists.
fn planted(plan: &Plan) -> PlantedBugs {
    plan.planted.iter().fold(PlantedBugs::NONE, |bugs, bug| bugs.with(*bug))
}

/// The simulation itself (the supervisor task of the runtime).
async fn simulate(plan: Arc<Plan>, verbose: bool) -> Run {
    // The recorder's origin and the store clock start at the same simulated instant.
    let recorder = Recorder::new(verbose);
    let store = MemoryStore::new(plan.seed ^ 0x5354_4f52_4500_0000);
    store.set_planted(planted(&plan));
    let env = Env {
        plan: Arc::clone(&plan),
        group: sim_group(),
        recorder: recorder.clone(),
        redis: StoreRoutes::new(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), REDIS_PORT)),
        service: SocketAddr::new(IpAddr::V4(SERVICE_IP), COORDINATOR_PORT),
        planted: planted(&plan),
    };
    let origin = tokio::time::Instant::now();
    let mut world = World::start(env, store);
    let t = &plan.tuning;
    let mut injector = Injector::new(&plan.faults, &plan.actions, (t.latency_min_ms, t.latency_max_ms));
    let end_us = plan.durations.run_ms * 1_000;
    loop {
        let next_us = injector.next_due_us().unwrap_or(end_us).min(end_us);
        rsc::time::sleep_until(origin + Duration::from_micros(next_us)).await;
        if next_us >= end_us {
            break;
        }
        injector.apply_due(&mut world, recorder.now_us());
    }
    recorder.trace("runner", "end of run");
    // The run is over: nothing reads the stores again, so their records are moved, not copied.
    let split_brains = world
        .split_brains
        .iter()
        .map(|split| {
            let (history, store_reads, store_acks) = split.store.take_history_and_logs();
            SplitBrain {
                server: split.server,
                fork_us: split.fork_us,
                switch_us: split.switch_us.unwrap_or(end_us),
                fork_len: split.fork_len,
                history,
                store_reads,
                store_acks,
                fence_refusals: split.store.fence_refusals().values().sum(),
            }
        })
        .collect();
    let (history, store_reads, store_acks) = world.store.take_history_and_logs();
    let run = Run {
        split_brains,
        records: recorder.take(),
        history,
        end_us,
        store_reads,
        store_acks,
        fence_refusals: world.store.fence_refusals().values().sum(),
    };
    // Drop every node's tasks before the runtime goes: a task parked on a timer holds the timer
    // wheel that holds its waker, a cycle that would keep each seed's whole world (about 3 MB)
    // alive in a process that runs seeds one after another.
    world.stop_all();
    tokio::task::yield_now().await;
    run
}

fn madsim_config(plan: &Plan) -> madsim::Config {
    let mut config = madsim::Config::default();
    let t = &plan.tuning;
    config.net.send_latency =
        Duration::from_millis(t.latency_min_ms)..Duration::from_millis(t.latency_max_ms.max(t.latency_min_ms + 1));
    config
}

/// The job `MADSIM_TEST_CHECK_DETERMINISM` runs: `Runtime::check_determinism` takes a plain `fn`.
static JOB: Mutex<Option<(Arc<Plan>, bool)>> = Mutex::new(None);

fn job_future() -> impl std::future::Future<Output = Run> {
    let job = JOB.lock().unwrap_or_else(PoisonError::into_inner).clone();
    async move {
        let Some((plan, verbose)) = job else { panic!("no simulation job set") };
        simulate(plan, verbose).await
    }
}

/// Runs one seed and checks it. `verbose` records every store call and heartbeat in the trace.
pub fn run_seed(plan: Plan, verbose: bool) -> SeedOutcome {
    let plan = Arc::new(plan);
    let seed = plan.seed;
    let config = madsim_config(&plan);
    let madsim_check = std::env::var_os("MADSIM_TEST_CHECK_DETERMINISM").is_some();
    // Wall time is measured outside the runtime (inside it, clocks are simulated).
    let wall_start = std::time::Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        if madsim_check {
            *JOB.lock().unwrap_or_else(PoisonError::into_inner) = Some((Arc::clone(&plan), verbose));
            Runtime::check_determinism(seed, config, job_future)
        } else {
            let mut runtime = Runtime::with_seed_and_config(seed, config);
            runtime.set_time_limit(Duration::from_millis(plan.durations.run_ms + OVERRUN_MS));
            runtime.block_on(simulate(Arc::clone(&plan), verbose))
        }
    }));
    let wall = wall_start.elapsed();
    let run = match result {
        Ok(run) => run,
        Err(payload) => return panicked(seed, payload, wall),
    };
    // Every task of the run went with its runtime (`World::stop_all`), so nothing of this seed
    // stays behind in a process that runs seeds one after another: each program holds the plan.
    assert!(
        madsim_check || Arc::strong_count(&plan) == 1,
        "seed {seed}: {} references to the plan outlived the run's runtime (a node not stopped at its end?)",
        Arc::strong_count(&plan) - 1
    );
    let group = sim_group();
    let facts = Facts {
        plan: &plan,
        group: &group,
        records: &run.records,
        history: &run.history,
        end_us: run.end_us,
        store_reads: &run.store_reads,
        store_acks: &run.store_acks,
        fence_refusals: run.fence_refusals,
        split_brains: &run.split_brains,
    };
    let verdict = checkers::check_all(&facts);
    let coverage = crate::coverage::of_run(&facts);
    let mut records = run.records;
    let trace = std::mem::take(&mut records.trace);
    SeedOutcome {
        seed,
        coverage,
        findings: verdict.findings,
        measurements: verdict.measurements,
        trace_hash: trace_hash(&trace),
        trace,
        history: if verbose { run.history } else { Vec::new() },
        records: verbose.then_some(records),
        simulated: Duration::from_micros(run.end_us),
        wall,
    }
}

fn panicked(seed: u64, payload: Box<dyn std::any::Any + Send>, wall: Duration) -> SeedOutcome {
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic payload".into());
    let finding = Finding { checker: "runner", kind: "panic", at_us: 0, detail: message };
    SeedOutcome {
        seed,
        coverage: Default::default(),
        findings: vec![finding],
        measurements: Measurements::default(),
        trace_hash: 0,
        trace: Vec::new(),
        history: Vec::new(),
        records: None,
        simulated: Duration::ZERO,
        wall,
    }
}
