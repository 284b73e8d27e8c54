//! The simulated deployment of one run: the madsim nodes (Redis and a split brain's old primaries,
//! coordinators, consumers, producers, operator), their addresses, the coordinator Service, and the
//! supervisor's handles on them (kill, restart, pause, clog, the Redis fault knobs, the operator's
//! command queue).
//!
//! Owns: creating nodes and tracking each node's incarnations (every start is a new process with
//! its own lifecycle record). Never decides *when* anything happens: the fault injector
//! ([`crate::faults`]) and the runner do.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, PoisonError};

use madsim::net::ipvs::{Scheduler, ServiceAddr};
use madsim::net::NetSim;
use madsim::runtime::Handle;
use madsim::task::NodeId;
use rsc::client::clock::ClockFaults;
use rsc::store::memory::MemoryStore;
use tokio::sync::{mpsc, Notify};

use crate::coord_rpc::COORDINATOR_PORT;
use crate::plan::{NodeRef, Role};
use crate::programs::{self, CoordinatorRegistry, Env, OperatorCommand};
use crate::records::{Lifecycle, ProcessId, Us};
use crate::redis_node;
use crate::transport::TransportKnob;

/// The coordinator Service (virtual) address.
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 100, 1);

/// One node and its current incarnation.
pub struct Slot {
    pub id: NodeId,
    incarnation: Arc<AtomicU32>,
    pub alive: bool,
    pub paused: bool,
}

impl Slot {
    pub fn process(&self, node: NodeRef) -> ProcessId {
        ProcessId { node, incarnation: self.incarnation.load(Ordering::SeqCst) }
    }
}

/// One split brain of the run: the old primary's node and store, and what the checkers need.
pub struct SplitBrainRun {
    pub server: NodeRef,
    pub store: MemoryStore,
    /// When the failover happened (the old primary was forked from the primary then).
    pub fork_us: Us,
    /// When the old primary went and its clients were switched to the primary.
    pub switch_us: Option<Us>,
    /// The processes (by node) the old primary served.
    pub clients: BTreeSet<NodeRef>,
    /// Events in the primary's metadata history at the fork (both histories share these).
    pub fork_len: usize,
}

/// The deployment (see the module docs).
pub struct World {
    pub env: Env,
    pub store: MemoryStore,
    pub handle: Handle,
    pub net: Arc<NetSim>,
    pub slots: BTreeMap<NodeRef, Slot>,
    pub registry: CoordinatorRegistry,
    pub loss: BTreeMap<NodeRef, TransportKnob>,
    /// The clock of each consumer and producer node (shared by its incarnations: it is the
    /// machine's), where `clock-stop` and `clock-drift` are injected.
    pub clocks: BTreeMap<NodeRef, ClockFaults>,
    /// Every split brain so far, in order (the n-th one's old primary is `redis-old-n`).
    pub split_brains: Vec<SplitBrainRun>,
    leave: BTreeMap<NodeRef, Arc<Notify>>,
    operator: mpsc::UnboundedSender<OperatorCommand>,
    next_index: BTreeMap<Role, u32>,
}

fn ip_of(node: NodeRef) -> IpAddr {
    let index = u8::try_from(node.index).unwrap_or(u8::MAX);
    IpAddr::V4(match node.role {
        Role::Redis if node.index > 0 => Ipv4Addr::new(10, 0, 4, index),
        Role::Redis => Ipv4Addr::new(10, 0, 0, 1),
        Role::Operator => Ipv4Addr::new(10, 0, 0, 2),
        Role::Coordinator => Ipv4Addr::new(10, 0, 1, index),
        Role::Consumer => Ipv4Addr::new(10, 0, 2, index),
        Role::Producer => Ipv4Addr::new(10, 0, 3, index),
    })
}

/// The Service for both protocols: HTTP over TCP and the datagram protocol over UDP.
fn service_addrs() -> [ServiceAddr; 2] {
    let addr = SocketAddr::new(IpAddr::V4(SERVICE_IP), COORDINATOR_PORT).to_string();
    [ServiceAddr::Tcp(addr.clone()), ServiceAddr::Udp(addr)]
}

fn backend(node: NodeRef) -> String {
    SocketAddr::new(ip_of(node), COORDINATOR_PORT).to_string()
}

impl World {
    /// Creates Redis, the operator and every initial node. Call inside the runtime.
    pub fn start(env: Env, store: MemoryStore) -> Self {
        let handle = Handle::current();
        let net = NetSim::current();
        for service in service_addrs() {
            net.global_ipvs().add_service(service, Scheduler::RoundRobin);
        }
        let (operator, commands) = mpsc::unbounded_channel();
        let mut world = World {
            env,
            store,
            handle,
            net,
            slots: BTreeMap::new(),
            registry: Arc::default(),
            loss: BTreeMap::new(),
            clocks: BTreeMap::new(),
            split_brains: Vec::new(),
            leave: BTreeMap::new(),
            operator,
            next_index: BTreeMap::new(),
        };
        let (store, recorder) = (world.store.clone(), world.env.recorder.clone());
        world.create(NodeRef::REDIS, move |_| redis_node::serve(store.clone(), recorder.clone(), NodeRef::REDIS));
        let env = world.env.clone();
        let commands = Arc::new(std::sync::Mutex::new(Some(commands)));
        world.create(NodeRef::OPERATOR, move |process| {
            let (env, commands) = (env.clone(), commands.lock().unwrap_or_else(PoisonError::into_inner).take());
            async move {
                if let Some(commands) = commands {
                    programs::operator(env, process, commands).await;
                }
            }
        });
        world.command(OperatorCommand::CreateGroup);
        let t = world.env.plan.topology;
        for _ in 0..t.coordinators {
            world.spawn(Role::Coordinator);
        }
        for _ in 0..t.consumers {
            world.spawn(Role::Consumer);
        }
        for _ in 0..t.producers {
            world.spawn(Role::Producer);
        }
        world
    }

    /// Creates a node whose every (re)start runs `program(process)` as a new incarnation.
    fn create<F, Fut>(&mut self, node: NodeRef, program: F)
    where
        F: Fn(ProcessId) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let ip = ip_of(node);
        let incarnation = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&incarnation);
        let recorder = self.env.recorder.clone();
        let built = self
            .handle
            .create_node()
            .name(node.to_string())
            .ip(ip)
            .init(move || {
                let process = ProcessId { node, incarnation: counter.fetch_add(1, Ordering::SeqCst) + 1 };
                let life = Lifecycle { process, started_at_us: recorder.now_us(), stopped_at_us: None, paused: vec![] };
                recorder.lock().lifecycles.push(life);
                recorder.trace(process, "started");
                program(process)
            })
            .build();
        self.slots.insert(node, Slot { id: built.id(), incarnation, alive: true, paused: false });
    }

    /// Starts a new node of `role` with the next free index.
    pub fn spawn(&mut self, role: Role) -> NodeRef {
        let index = self.next_index.entry(role).or_insert(0);
        *index += 1;
        let node = NodeRef::new(role, *index);
        let env = self.env.clone();
        match role {
            Role::Coordinator => {
                let registry = Arc::clone(&self.registry);
                let net = Arc::clone(&self.net);
                self.create(node, move |process| {
                    let net = Arc::clone(&net);
                    // Ready = probe passed: only then does the instance join the Service.
                    let ready = move || {
                        for service in service_addrs() {
                            net.global_ipvs().add_server(service, &backend(node));
                        }
                    };
                    programs::coordinator(env.clone(), process, Arc::clone(&registry), ready)
                });
            }
            Role::Consumer => {
                let (loss, leave, clock) = (TransportKnob::default(), Arc::new(Notify::new()), ClockFaults::new());
                self.loss.insert(node, loss.clone());
                self.leave.insert(node, Arc::clone(&leave));
                self.clocks.insert(node, clock.clone());
                self.create(node, move |process| {
                    programs::consumer(env.clone(), process, loss.clone(), Arc::clone(&leave), clock.clone())
                });
            }
            Role::Producer => {
                let (loss, clock) = (TransportKnob::default(), ClockFaults::new());
                self.loss.insert(node, loss.clone());
                self.clocks.insert(node, clock.clone());
                self.create(node, move |process| programs::producer(env.clone(), process, loss.clone(), clock.clone()));
            }
            Role::Redis | Role::Operator => unreachable!("created once by World::start"),
        }
        node
    }

    /// Starts the old primary of a split brain: a Redis node serving `store` (a fork of the
    /// primary's state) at its own address, to which the injector then routes some clients.
    pub fn start_old_primary(&mut self, server: NodeRef, store: MemoryStore) -> SocketAddr {
        let recorder = self.env.recorder.clone();
        self.create(server, move |_| redis_node::serve(store.clone(), recorder.clone(), server));
        SocketAddr::new(ip_of(server), redis_node::REDIS_PORT)
    }

    /// Queues an operator command.
    pub fn command(&self, command: OperatorCommand) {
        let _ = self.operator.send(command);
    }

    /// Asks a consumer to leave cleanly.
    pub fn leave(&self, node: NodeRef) {
        if let Some(leave) = self.leave.get(&node) {
            leave.notify_one();
        }
    }

    /// Nodes of `role` currently alive, in name order.
    pub fn alive(&self, role: Role) -> Vec<NodeRef> {
        self.slots.iter().filter(|(n, s)| n.role == role && s.alive).map(|(n, _)| *n).collect()
    }

    fn mark_stopped(&self, node: NodeRef) {
        let Some(slot) = self.slots.get(&node) else { return };
        let process = slot.process(node);
        let now = self.env.recorder.now_us();
        let mut records = self.env.recorder.lock();
        if let Some(life) = records.lifecycles.iter_mut().rev().find(|l| l.process == process) {
            life.stopped_at_us.get_or_insert(now);
            if let Some((_, end @ None)) = life.paused.last_mut() {
                *end = Some(now);
            }
        }
    }

    /// Kills every node still running, recording nothing: the end of a run, after its records
    /// were taken (killed tasks are dropped by the scheduler's next pass).
    pub fn stop_all(&mut self) {
        for slot in self.slots.values_mut().filter(|slot| slot.alive) {
            self.handle.kill(slot.id);
            slot.alive = false;
        }
    }

    /// Kills a node (its process stops; a coordinator leaves the Service at once).
    pub fn kill(&mut self, node: NodeRef) {
        let Some(slot) = self.slots.get(&node) else { return };
        if !slot.alive {
            return;
        }
        let (id, process) = (slot.id, slot.process(node));
        self.mark_stopped(node);
        self.handle.kill(id);
        if node.role == Role::Coordinator {
            self.remove_from_service(node);
            self.registry.lock().unwrap_or_else(PoisonError::into_inner).retain(|p, _| p.node != node);
        }
        if let Some(slot) = self.slots.get_mut(&node) {
            slot.alive = false;
            slot.paused = false;
        }
        self.env.recorder.trace(process, "killed");
    }

    /// Starts a killed node again (a new incarnation).
    pub fn restart(&mut self, node: NodeRef) {
        let Some(slot) = self.slots.get_mut(&node) else { return };
        if slot.alive {
            return;
        }
        slot.alive = true;
        let id = slot.id;
        self.handle.restart(id);
    }

    pub fn pause(&mut self, node: NodeRef) {
        let Some(slot) = self.slots.get_mut(&node) else { return };
        if !slot.alive || slot.paused {
            return;
        }
        slot.paused = true;
        let (id, process) = (slot.id, slot.process(node));
        self.handle.pause(id);
        let now = self.env.recorder.now_us();
        let mut records = self.env.recorder.lock();
        if let Some(life) = records.lifecycles.iter_mut().rev().find(|l| l.process == process) {
            life.paused.push((now, None));
        }
        drop(records);
        self.env.recorder.trace(process, "paused");
    }

    pub fn resume(&mut self, node: NodeRef) {
        let Some(slot) = self.slots.get_mut(&node) else { return };
        if !slot.alive || !slot.paused {
            return;
        }
        slot.paused = false;
        let (id, process) = (slot.id, slot.process(node));
        self.handle.resume(id);
        let now = self.env.recorder.now_us();
        let mut records = self.env.recorder.lock();
        if let Some((_, end @ None)) =
            records.lifecycles.iter_mut().rev().find(|l| l.process == process).and_then(|l| l.paused.last_mut())
        {
            *end = Some(now);
        }
        drop(records);
        self.env.recorder.trace(process, "resumed");
    }

    /// Suspends a consumer's or producer's machine: the process is paused and its monotonic clock
    /// stops; its suspend-aware clock runs on. A node that is dead or already paused is left as
    /// it is (returns false: there is nothing to wake).
    pub fn suspend(&mut self, node: NodeRef) -> bool {
        if self.slots.get(&node).is_none_or(|s| !s.alive || s.paused) {
            return false;
        }
        if let Some(clock) = self.clocks.get(&node) {
            clock.suspend();
        }
        self.pause(node);
        self.env.recorder.trace("faults", format!("{node}: clock stopped (suspend)"));
        true
    }

    /// Ends a suspension: the monotonic clock runs again and the process is resumed.
    pub fn wake(&mut self, node: NodeRef) {
        if let Some(clock) = self.clocks.get(&node) {
            clock.resume();
        }
        self.resume(node);
    }

    /// Takes a coordinator out of the Service (endpoint removal).
    pub fn remove_from_service(&self, node: NodeRef) {
        for service in service_addrs() {
            self.net.global_ipvs().del_server(service, &backend(node));
        }
    }

    /// Puts a coordinator into terminating mode (SIGTERM).
    pub fn begin_shutdown(&self, node: NodeRef) {
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        for (process, coordinator) in registry.iter().filter(|(p, _)| p.node == node) {
            coordinator.begin_shutdown();
            self.env.recorder.trace(process, "terminating");
        }
    }

    pub fn node_id(&self, node: NodeRef) -> Option<NodeId> {
        self.slots.get(&node).map(|s| s.id)
    }
}
