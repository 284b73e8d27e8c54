//! What each simulated process runs: a coordinator instance, a consumer application, a producer
//! application, and the operator. Every program is the production library code (the coordinator
//! service, the consumer and producer drivers) wired to the simulated Redis node and the
//! coordinator Service over the simulated network; only the "application" around the clients (how
//! long processing takes, what is published) is the simulation's.
//!
//! Never: reads a std clock, draws from an unseeded RNG (each process's RNG is seeded from the run
//! seed and its process id), or spawns threads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rsc::client::clock::ClockFaults;
use rsc::client::consumer::{AckError, Phase};
use rsc::client::{
    ClientEnv, Clock, Consumer, ConsumerConfig, Delivery, NoopSink, Producer, ProducerConfig, RebalanceListener,
};
use rsc::client::{CoordinatorTransport, TransportError};
use rsc::core::model::{GroupId, ShardId};
use rsc::core::protocol::{
    AdminRequest, AdminResponse, ErrorCode, HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse,
};
use rsc::core::PlantedBugs;
use rsc::http::auth::ClientTokens;
use rsc::http::client::{HttpClientConfig, HttpTransport};
use rsc::http::router::HttpOptions;
use rsc::service::{Coordinator, CoordinatorOptions};
use tokio::sync::{mpsc, Notify};

use crate::coord_rpc::{self, RpcTransport, COORDINATOR_PORT};
use crate::plan::{Plan, Protocol};
use crate::records::{AdminCall, ProcessId, Processing, Recorder};
use crate::redis_node::{RemoteStore, StoreRoutes};
use crate::transport::{RecordingTransport, TransportKnob};

/// The client token of every simulated client: the simulation runs with credentials on.
pub const SIM_CLIENT_TOKEN: &str = "simulated-client-token";

/// What the coordinators accept: [`SIM_CLIENT_TOKEN`] only.
fn sim_client_tokens() -> ClientTokens {
    // safe: a constant that parses (every run would fail at once otherwise).
    ClientTokens::parse(&[SIM_CLIENT_TOKEN]).expect("the simulation's client token is well-formed")
}

/// What every program of a run needs.
#[derive(Clone)]
pub struct Env {
    pub plan: Arc<Plan>,
    pub group: GroupId,
    pub recorder: Recorder,
    /// Where each process's Redis commands go (the primary, or an old primary in a split brain).
    pub redis: StoreRoutes,
    pub service: SocketAddr,
    pub planted: PlantedBugs,
}

impl Env {
    /// A seeded RNG private to one process.
    pub fn rng(&self, process: ProcessId, salt: u64) -> SmallRng {
        let id =
            (process.node.role as u64) << 48 | u64::from(process.node.index) << 16 | u64::from(process.incarnation);
        SmallRng::seed_from_u64(self.plan.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt)
    }

    async fn store(&self, process: ProcessId) -> RemoteStore {
        RemoteStore::connect(self.redis.clone(), process, self.plan.tuning.store_timeout_ms, self.recorder.clone())
            .await
    }

    async fn transport(&self, process: ProcessId, loss: TransportKnob) -> RecordingTransport<ClientTransport> {
        let timeout_ms = self.plan.tuning.http_timeout_ms;
        let inner = self.raw_transport(Some(SIM_CLIENT_TOKEN)).await;
        RecordingTransport::new(inner, process, self.recorder.clone(), loss, self.rng(process, 1), timeout_ms)
    }

    /// A client of the Service by the run's protocol, sending `token` (call on the process's
    /// node). Unrecorded: only the forger uses it bare.
    pub async fn raw_transport(&self, token: Option<&str>) -> ClientTransport {
        let timeout_ms = self.plan.tuning.http_timeout_ms;
        match self.plan.tuning.protocol {
            Protocol::Http => {
                let mut config = HttpClientConfig::new(vec![self.service]);
                config.request_timeout = Duration::from_millis(timeout_ms);
                config.client_token = token.map(str::to_owned);
                ClientTransport::Http(HttpTransport::new(config))
            }
            Protocol::Rpc => {
                let rpc = RpcTransport::connect(self.service, timeout_ms, self.recorder.clone()).await;
                ClientTransport::Rpc(match token {
                    Some(token) => rpc.with_client_token(token),
                    None => rpc,
                })
            }
        }
    }
}

/// The coordinator client of a process, by the run's protocol.
pub enum ClientTransport {
    Http(HttpTransport),
    Rpc(RpcTransport),
}

impl CoordinatorTransport for ClientTransport {
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        match self {
            ClientTransport::Http(t) => t.heartbeat(req).await,
            ClientTransport::Rpc(t) => t.heartbeat(req).await,
        }
    }

    async fn routing(&self, group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, TransportError> {
        match self {
            ClientTransport::Http(t) => t.routing(group, report).await,
            ClientTransport::Rpc(t) => t.routing(group, report).await,
        }
    }
}

/// Coordinator handles of the live instances, for the fault injector (terminating mode).
pub type CoordinatorRegistry = Arc<Mutex<BTreeMap<ProcessId, Coordinator<RemoteStore>>>>;

/// Runs one coordinator instance: probe until compatible (each probe fails fast), register as
/// ready, tick, and serve.
pub async fn coordinator(env: Env, process: ProcessId, registry: CoordinatorRegistry, ready: impl FnOnce()) {
    let t = &env.plan.tuning;
    let options = CoordinatorOptions {
        instance_id: process.to_string(),
        mutex_ttl_ms: t.mutex_ttl_ms,
        tick_interval_ms: t.tick_interval_ms,
        rng_seed: env.rng(process, 2).gen(),
        // The operator's setting: the longest lease the deployment uses (plans never change it).
        max_assignment_lease_ms: env.plan.group.assignment_lease_ms,
        planted: env.planted,
        ..CoordinatorOptions::default()
    };
    let coordinator = Coordinator::new(env.store(process).await, options);
    loop {
        match coordinator.start().await {
            Ok(report) => {
                env.recorder
                    .trace(process, format!("started: redis {} {}", report.server_version, report.identity.run_id));
                break;
            }
            Err(e) => {
                env.recorder.trace(process, format!("start failed: {e}"));
                rsc::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    registry.lock().unwrap_or_else(PoisonError::into_inner).insert(process, coordinator.clone());
    let ticker = coordinator.clone();
    tokio::spawn(async move { ticker.run_ticker().await });
    // The HTTP edge for clients, and the datagram protocol (the operator's admin channel, and the
    // clients' in `protocol = "rpc"` runs). Both live until the process dies.
    let listener = match tokio::net::TcpListener::bind(("0.0.0.0", COORDINATOR_PORT)).await {
        Ok(listener) => listener,
        Err(e) => panic!("{process}: cannot listen on port {COORDINATOR_PORT}: {e}"),
    };
    let options = HttpOptions { client_tokens: sim_client_tokens(), ..HttpOptions::default() };
    let router = rsc::http::router::app(coordinator.clone(), options);
    tokio::spawn(rsc::http::serve::serve(listener, router, std::future::pending()));
    let server = tokio::spawn(coord_rpc::serve(coordinator, env.recorder.clone(), sim_client_tokens()));
    ready();
    let _ = server.await;
}

/// Tells processing tasks which shards were lost (lease ended, fenced): their in-flight entries
/// were abandoned by the consumer, so the application stops working on them.
#[derive(Default)]
struct LostShards {
    generation: Mutex<BTreeMap<ShardId, u64>>,
    changed: Notify,
}

impl LostShards {
    fn generation(&self, shard: ShardId) -> u64 {
        self.generation.lock().unwrap_or_else(PoisonError::into_inner).get(&shard).copied().unwrap_or(0)
    }
}

impl RebalanceListener for LostShards {
    fn on_assigned(&self, _shards: &[ShardId]) {}
    fn on_revoked(&self, _shards: &[ShardId]) {}
    fn on_lost(&self, shards: &[ShardId]) {
        let mut generation = self.generation.lock().unwrap_or_else(PoisonError::into_inner);
        for shard in shards {
            *generation.entry(*shard).or_insert(0) += 1;
        }
        drop(generation);
        self.changed.notify_waiters();
    }
}

/// Runs one consumer application: poll, process each delivery for its drawn time (concurrently),
/// ack, repeat; on `leave`, close cleanly and end the process.
pub async fn consumer(env: Env, process: ProcessId, loss: TransportKnob, leave: Arc<Notify>, clock: ClockFaults) {
    let w = env.plan.workload;
    let store = env.store(process).await.with_delay(loss.clone(), env.rng(process, 7));
    let transport = env.transport(process, loss).await;
    let mut config = ConsumerConfig::new(env.group.clone(), process.node.to_string());
    config.heartbeat_interval_ms = env.plan.group.heartbeat_interval_ms;
    config.heartbeat_timeout_ms = env.plan.tuning.http_timeout_ms;
    config.poll_idle_ms = w.poll_interval_ms;
    config.planted = env.planted;
    let listener = Arc::new(LostShards::default());
    // The production client clock over this machine's simulated clock (suspensions, drift).
    let client_env = ClientEnv::new(Clock::with_faults(clock), Arc::new(NoopSink));
    let consumer = Arc::new(Consumer::join_with(config, transport, store, client_env, listener.clone()));
    let mut rng = env.rng(process, 3);
    let read_count = usize::try_from(w.read_count).unwrap_or(1);
    loop {
        let polled = tokio::select! {
            biased;
            _ = leave.notified() => break,
            polled = consumer.poll_wait(read_count, Duration::from_millis(w.poll_interval_ms)) => polled,
        };
        let deliveries = match polled {
            // The library gave up on the group (it never does unless a bug makes it): the
            // application ends, as a real one would rather than poll a consumer that left.
            Ok(deliveries) if deliveries.is_empty() && consumer.status().phase == Phase::Left => break,
            Ok(deliveries) => deliveries,
            Err(_) => {
                rsc::time::sleep(Duration::from_millis(w.poll_interval_ms)).await;
                continue;
            }
        };
        let mut tasks = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            let processing_ms = rng.gen_range(w.processing_min_ms..=w.processing_max_ms);
            // The shard's loss count as the delivery is handed out, not when its task first runs:
            // a loss in between (a suspension that hit after the spawn, before the task's first
            // poll) would otherwise go unseen and the entry be processed beside its next owner.
            let generation = listener.generation(delivery.shard);
            let task = process_one(
                env.recorder.clone(),
                process,
                Arc::clone(&consumer),
                Arc::clone(&listener),
                (delivery, generation),
                processing_ms,
            );
            tasks.push(tokio::spawn(task));
        }
        for task in tasks {
            let _ = task.await;
        }
    }
    env.recorder.trace(process, "leaving");
    let closed = consumer.close().await;
    env.recorder.trace(process, format!("left: {closed:?}"));
    let now = env.recorder.now_us();
    let mut records = env.recorder.lock();
    if let Some(life) = records.lifecycles.iter_mut().rev().find(|l| l.process == process) {
        life.stopped_at_us = Some(now);
    }
}

/// Processes one delivery: works `processing_ms` unless its shard is lost after `generation`
/// (its loss count when the delivery was handed out), then acks.
async fn process_one<T, S>(
    recorder: Recorder,
    process: ProcessId,
    consumer: Arc<Consumer<T, S>>,
    lost: Arc<LostShards>,
    (delivery, generation): (Delivery, u64),
    processing_ms: u64,
) where
    T: rsc::client::CoordinatorTransport,
    S: rsc::store::StreamStore,
{
    let index = {
        let mut records = recorder.lock();
        let start_us = recorder.now_us();
        let (stream, id) = (delivery.stream.clone(), delivery.entry.id);
        records.processing.push(Processing { process, stream, id, start_us, end_us: None, completed: false });
        records.processing.len() - 1
    };
    let work = rsc::time::sleep(Duration::from_millis(processing_ms));
    tokio::pin!(work);
    let finished = loop {
        let changed = lost.changed.notified();
        if lost.generation(delivery.shard) != generation {
            break false;
        }
        // Biased: tokio's select! draws its branch order from a thread-local RNG that madsim does
        // not seed, so an unbiased select whose branches are ready at one simulated instant (the
        // work ends as the shard is lost) made runs differ (clock-faults seed 8).
        tokio::select! {
            biased;
            _ = &mut work => break true,
            _ = changed => {}
        }
    };
    let end_us = recorder.now_us();
    {
        let mut records = recorder.lock();
        records.processing[index].end_us = Some(end_us);
        records.processing[index].completed = finished;
    }
    let (stream, id) = (&delivery.stream, delivery.entry.id);
    if !finished {
        recorder.trace_verbose(process, || format!("processing {stream} {id}: cancelled (shard lost)"));
        return;
    }
    // A failed XACK leaves the entry in flight (the shard cannot be reported REVOKED): retry it
    // a few times, then give the entry up so the next owner redelivers it.
    for attempt in 1..=ACK_ATTEMPTS_MAX {
        match consumer.ack(&delivery).await {
            Ok(()) => {
                recorder.trace_verbose(process, || format!("processed {stream} {id}: acked"));
                return;
            }
            Err(AckError::Store(e)) if attempt < ACK_ATTEMPTS_MAX => {
                recorder.trace_verbose(process, || format!("processed {stream} {id}: ack failed ({e}), retrying"));
                rsc::time::sleep(Duration::from_millis(ACK_RETRY_MS)).await;
            }
            Err(AckError::Store(e)) => {
                let abandoned = consumer.abandon(&delivery);
                recorder.trace_verbose(process, || {
                    format!("processed {stream} {id}: ack failed ({e}), abandoned: {abandoned:?}")
                });
                return;
            }
            Err(e) => {
                recorder.trace_verbose(process, || format!("processed {stream} {id}: not acked ({e})"));
                return;
            }
        }
    }
}

/// XACK attempts per entry before the application gives the entry up.
const ACK_ATTEMPTS_MAX: u32 = 3;
const ACK_RETRY_MS: u64 = 100;

/// Runs one producer application: publish a random key every `publish_interval_ms` until the
/// plan's publishing window ends.
pub async fn producer(env: Env, process: ProcessId, loss: TransportKnob, clock: ClockFaults) {
    let w = env.plan.workload;
    let store = env.store(process).await;
    let transport = env.transport(process, loss).await;
    let mut config = ProducerConfig::new(env.group.clone(), process.node.to_string());
    config.refresh_timeout_ms = env.plan.tuning.http_timeout_ms;
    config.planted = env.planted;
    let client_env = ClientEnv::new(Clock::with_faults(clock), Arc::new(NoopSink));
    let producer = Producer::new_with(config, transport, store, client_env);
    let mut rng = env.rng(process, 4);
    let until_us = env.plan.durations.publish_until_ms() * 1_000;
    let mut sequence = 0u64;
    while env.recorder.now_us() < until_us {
        let key = rng.gen_range(0..w.keys).to_string();
        sequence += 1;
        let payload = format!("{process}/{sequence}").into_bytes();
        let result = producer.publish(key.as_bytes(), payload).await;
        env.recorder.trace_verbose(process, || format!("publish key={key} -> {result:?}"));
        rsc::time::sleep(Duration::from_millis(w.publish_interval_ms)).await;
    }
    env.recorder.trace(process, format!("stopped publishing after {sequence} messages"));
}

/// What the fault injector asks the operator to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperatorCommand {
    /// Create the group (at start, and after the key was deleted or repaired by deletion).
    CreateGroup,
    /// Read the group and add shards with that revision.
    AddShards(u32),
    /// The forger's `n`-th forged request ([`crate::forger`]); it shares the operator's node.
    Forge(u64),
    /// Delete the group (read its revision, DeleteGroup, again while it is not empty), then create
    /// it again.
    Recreate,
}

/// Attempts to read the group for an `AddShards` before the operator gives up on it.
const ADD_SHARDS_ATTEMPTS_MAX: u32 = 20;
/// Attempts to delete the group for a `Recreate` (500 ms apart: a minute, time for its consumers
/// to leave and the waits their shards need to end) before the operator gives up on it.
const DELETE_ATTEMPTS_MAX: u32 = 120;

/// Runs the operator: carries out each command through the coordinator Service, retrying until
/// it is done (an operator follows the runbook until the step succeeded). Adding shards to a group
/// that stays unreadable is given up after `ADD_SHARDS_ATTEMPTS_MAX` attempts, so a later
/// recreate is not stuck behind it.
pub async fn operator(env: Env, process: ProcessId, mut commands: mpsc::UnboundedReceiver<OperatorCommand>) {
    let admin = RpcTransport::connect(env.service, env.plan.tuning.http_timeout_ms, env.recorder.clone()).await;
    while let Some(command) = commands.recv().await {
        env.recorder.trace(process, format!("{command:?}"));
        if let OperatorCommand::Forge(n) = command {
            tokio::spawn(crate::forger::forge(env.clone(), process, n));
            continue;
        }
        if command == OperatorCommand::Recreate && !delete_group(&env, process, &admin).await {
            continue;
        }
        for attempt in 0u32.. {
            let request = match command {
                OperatorCommand::CreateGroup | OperatorCommand::Recreate => AdminRequest::CreateGroup {
                    group: env.group.clone(),
                    shard_count: env.plan.topology.shards,
                    config: env.plan.group.clone(),
                },
                OperatorCommand::Forge(_) => break,
                OperatorCommand::AddShards(add) => match admin.describe(&env.group).await {
                    Ok(d) => AdminRequest::AddShards {
                        group: env.group.clone(),
                        expected_revision: d.store_revision,
                        new_shard_count: d.metadata.shard_count + add,
                    },
                    Err(e) => {
                        env.recorder.trace(process, format!("describe failed (attempt {attempt}): {e}"));
                        if attempt + 1 >= ADD_SHARDS_ATTEMPTS_MAX {
                            // The group is gone or unreadable: the runbook says repair it first.
                            env.recorder.trace(process, "gave up adding shards");
                            break;
                        }
                        rsc::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                },
            };
            let done = match send_admin(&env, process, &admin, request).await {
                Ok(_) => true,
                Err(TransportError::Api(e)) => e.code == ErrorCode::GroupExists,
                Err(_) => false,
            };
            if done {
                break;
            }
            rsc::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Sends one admin request, recorded in [`Records::admins`](crate::records) with its answer.
async fn send_admin(
    env: &Env,
    process: ProcessId,
    admin: &RpcTransport,
    request: AdminRequest,
) -> Result<AdminResponse, TransportError> {
    let sent_at_us = env.recorder.now_us();
    let index = {
        let mut records = env.recorder.lock();
        let call =
            AdminCall { request: request.clone(), sent_at_us, received_at_us: None, answer: None, handled: Vec::new() };
        records.admins.push(call);
        records.admins.len() - 1
    };
    let answer = admin.admin(request, index).await;
    let received_at_us = env.recorder.now_us();
    env.recorder.trace(process, format!("admin -> {answer:?}"));
    let mut records = env.recorder.lock();
    let call = &mut records.admins[index];
    call.received_at_us = Some(received_at_us);
    call.answer = Some(answer.clone());
    answer
}

/// The first half of a `Recreate`: reads the group's revision and deletes it, again every 500 ms
/// while it is not empty or the read or the delete fails, at most [`DELETE_ATTEMPTS_MAX`] times.
/// Whether the group is gone (deleted now, or already missing).
async fn delete_group(env: &Env, process: ProcessId, admin: &RpcTransport) -> bool {
    for attempt in 0..DELETE_ATTEMPTS_MAX {
        if attempt > 0 {
            rsc::time::sleep(Duration::from_millis(500)).await;
        }
        let revision = match admin.describe(&env.group).await {
            Ok(d) => d.store_revision,
            Err(TransportError::Api(e)) if e.code == ErrorCode::GroupNotFound => return true,
            Err(e) => {
                env.recorder.trace(process, format!("describe failed (attempt {attempt}): {e}"));
                continue;
            }
        };
        let request = AdminRequest::DeleteGroup { group: env.group.clone(), expected_revision: revision };
        match send_admin(env, process, admin, request).await {
            Ok(_) => return true,
            Err(TransportError::Api(e)) if e.code == ErrorCode::GroupNotFound => return true,
            Err(_) => {}
        }
    }
    env.recorder.trace(process, "gave up deleting the group");
    false
}
