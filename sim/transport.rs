//! [`RecordingTransport`]: wraps a client's coordinator transport and records every call (what was
//! sent and when, what came back and when) into the run's [`Recorder`]. The consumer fail-closed,
//! producer fail-closed and recorded-response checkers compute leases and compare responses from
//! these records, never from the clients' own state.
//!
//! It also carries two client-side faults, drawn from an RNG seeded per process (deterministic):
//! - `response-loss`: with the node's current probability it hides a successful answer the
//!   coordinator already produced and makes the client wait out its timeout, exactly what a
//!   response lost on the way back looks like.
//! - `stale-delivery`: a heartbeat reaches a coordinator *late*, as behind a retrying L7 proxy or
//!   load balancer, or a coordinator that queued it while paused. Half the time it is *duplicated*
//!   (the client gets its answer; the same request is delivered again up to `delay_max_ms` later),
//!   half the time *deferred* (the client gives up at its timeout; the request is delivered only
//!   later). A late delivery's answer goes nowhere. Nothing in the protocol may rely on a request
//!   arriving once, or before the client moved on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;
use rsc::client::{CoordinatorTransport, TransportError};
use rsc::core::model::GroupId;
use rsc::core::protocol::{HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse};

use crate::records::{CoordinatorCall, ProcessId, Recorder};

/// The client-side fault settings of one node, set by the fault injector: the response-loss
/// probability, and the stale-delivery probability and longest delay (f64 bits / ms; 0 = off).
#[derive(Clone, Debug, Default)]
pub struct TransportKnob {
    loss: Arc<AtomicU64>,
    stale: Arc<AtomicU64>,
    stale_delay_max_ms: Arc<AtomicU64>,
    stale_spares_joins: Arc<std::sync::atomic::AtomicBool>,
    store_delay_max_ms: Arc<AtomicU64>,
}

impl TransportKnob {
    /// `store-delay`: each request to Redis leaves up to this long after it was issued (0 = off).
    pub fn set_store_delay(&self, delay_max_ms: u64) {
        self.store_delay_max_ms.store(delay_max_ms, Ordering::Relaxed);
    }

    pub fn store_delay_max_ms(&self) -> u64 {
        self.store_delay_max_ms.load(Ordering::Relaxed)
    }

    pub fn set_loss(&self, probability: f64) {
        self.loss.store(probability.to_bits(), Ordering::Relaxed);
    }

    pub fn loss(&self) -> f64 {
        f64::from_bits(self.loss.load(Ordering::Relaxed))
    }

    pub fn set_stale(&self, probability: f64, delay_max_ms: u64, joins: bool) {
        self.stale.store(probability.to_bits(), Ordering::Relaxed);
        self.stale_delay_max_ms.store(delay_max_ms, Ordering::Relaxed);
        self.stale_spares_joins.store(!joins, Ordering::Relaxed);
    }

    /// The stale-delivery probability for `req` and the longest delay.
    fn stale(&self, req: &HeartbeatRequest) -> (f64, u64) {
        if req.member_epoch == 0 && self.stale_spares_joins.load(Ordering::Relaxed) {
            return (0.0, 0);
        }
        (f64::from_bits(self.stale.load(Ordering::Relaxed)), self.stale_delay_max_ms.load(Ordering::Relaxed))
    }
}

/// How one heartbeat is delivered under the stale-delivery fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    Once,
    /// Delivered now and again after the delay.
    Duplicated {
        delay_ms: u64,
    },
    /// Delivered only after the delay; the client times out.
    Deferred {
        delay_ms: u64,
    },
}

/// A transport that records every call and may hide answers (see the module docs).
pub struct RecordingTransport<T> {
    inner: Arc<T>,
    process: ProcessId,
    recorder: Recorder,
    knob: TransportKnob,
    rng: Mutex<SmallRng>,
    /// How long a client waits for an answer (a hidden answer surfaces as a timeout after this).
    timeout: Duration,
}

impl<T: CoordinatorTransport + Send + Sync + 'static> RecordingTransport<T> {
    pub fn new(
        inner: T,
        process: ProcessId,
        recorder: Recorder,
        knob: TransportKnob,
        rng: SmallRng,
        timeout_ms: u64,
    ) -> Self {
        let rng = Mutex::new(rng);
        Self { inner: Arc::new(inner), process, recorder, knob, rng, timeout: Duration::from_millis(timeout_ms) }
    }

    /// Whether to hide this answer. Draws only while the fault is on, so a run without
    /// response-loss faults draws nothing.
    fn hide(&self) -> bool {
        let p = self.knob.loss();
        p > 0.0 && self.rng.lock().unwrap_or_else(PoisonError::into_inner).gen_bool(p.min(1.0))
    }

    /// How to deliver this heartbeat. Draws only while the stale-delivery fault is on.
    fn delivery(&self, req: &HeartbeatRequest) -> Delivery {
        let (p, delay_max_ms) = self.knob.stale(req);
        if p <= 0.0 {
            return Delivery::Once;
        }
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        if !rng.gen_bool(p.min(1.0)) {
            return Delivery::Once;
        }
        let delay_ms = rng.gen_range(1..=delay_max_ms.max(1));
        if rng.gen_bool(0.5) {
            Delivery::Duplicated { delay_ms }
        } else {
            Delivery::Deferred { delay_ms }
        }
    }

    /// Delivers `req` to the Service after `delay_ms`; its answer goes nowhere.
    fn deliver_late(&self, req: HeartbeatRequest, delay_ms: u64) {
        let (inner, recorder, process) = (Arc::clone(&self.inner), self.recorder.clone(), self.process);
        tokio::spawn(async move {
            rsc::time::sleep(Duration::from_millis(delay_ms)).await;
            recorder.trace(process, format!("stale delivery ({delay_ms} ms late): {}", describe_heartbeat(&req)));
            recorder.lock().stale_deliveries += 1;
            let _ = inner.heartbeat(req).await;
        });
    }

    /// Runs one call: `push` records the request (returning its record's index), `finish` fills
    /// in the answer; a successful answer may then be hidden (see the module docs).
    async fn recorded<Resp: Clone>(
        &self,
        call: impl std::future::Future<Output = Result<Resp, TransportError>>,
        push: impl FnOnce(&Recorder, u64) -> usize,
        finish: impl FnOnce(&Recorder, usize, u64, Result<Resp, TransportError>, bool),
    ) -> Result<Resp, TransportError> {
        let sent = tokio::time::Instant::now();
        let index = push(&self.recorder, self.recorder.now_us());
        let answer = call.await;
        let hidden = answer.is_ok() && self.hide();
        finish(&self.recorder, index, self.recorder.now_us(), answer.clone(), hidden);
        if hidden {
            rsc::time::sleep_until(sent + self.timeout).await;
            return Err(TransportError::Timeout);
        }
        answer
    }
}

fn new_call<Req, Resp>(process: ProcessId, request: Req, sent_at_us: u64) -> CoordinatorCall<Req, Resp> {
    CoordinatorCall { process, request, sent_at_us, received_at_us: None, answer: None, hidden: false }
}

impl<T: CoordinatorTransport + Send + Sync + 'static> CoordinatorTransport for RecordingTransport<T> {
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        let process = self.process;
        let request = req.clone();
        let delivery = self.delivery(&req);
        let call = async {
            match delivery {
                Delivery::Once => self.inner.heartbeat(req).await,
                Delivery::Duplicated { delay_ms } => {
                    self.deliver_late(req.clone(), delay_ms);
                    self.inner.heartbeat(req).await
                }
                Delivery::Deferred { delay_ms } => {
                    self.deliver_late(req, delay_ms);
                    rsc::time::sleep(self.timeout).await;
                    Err(TransportError::Timeout)
                }
            }
        };
        self.recorded(
            call,
            |recorder, at| {
                recorder.trace_verbose(process, || describe_heartbeat(&request));
                let mut records = recorder.lock();
                records.heartbeats.push(new_call(process, request, at));
                records.heartbeats.len() - 1
            },
            |recorder, index, at, answer, hidden| {
                recorder.trace_verbose(process, || describe_answer(&answer, hidden));
                let mut records = recorder.lock();
                let call = &mut records.heartbeats[index];
                call.received_at_us = Some(at);
                call.answer = Some(answer);
                call.hidden = hidden;
            },
        )
        .await
    }

    async fn routing(&self, group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, TransportError> {
        let process = self.process;
        self.recorded(
            self.inner.routing(group, report),
            |recorder, at| {
                recorder.trace_verbose(process, || {
                    format!("routing -> known v{} shards={}", report.known_version, report.known_shard_count)
                });
                let mut records = recorder.lock();
                records.routings.push(new_call(process, report, at));
                records.routings.len() - 1
            },
            |recorder, index, at, answer, hidden| {
                recorder.trace_verbose(process, || match &answer {
                    Ok(r) => format!(
                        "routing <- v{} shards={} rev={}{}",
                        r.metadata_version,
                        r.shard_count,
                        r.store_revision,
                        if hidden { " (hidden)" } else { "" }
                    ),
                    Err(e) => format!("routing <- {e}"),
                });
                let mut records = recorder.lock();
                let call = &mut records.routings[index];
                call.received_at_us = Some(at);
                call.answer = Some(answer);
                call.hidden = hidden;
            },
        )
        .await
    }
}

fn describe_heartbeat(req: &HeartbeatRequest) -> String {
    let revoking: Vec<String> =
        req.revoking.iter().map(|r| format!("{}{}", r.shard, if r.revoked { "R" } else { "" })).collect();
    format!(
        "heartbeat -> epoch={} v{} owned={:?} revoking=[{}]{}",
        req.member_epoch,
        req.metadata_version,
        req.owned,
        revoking.join(","),
        if req.leave { " LEAVE" } else { "" }
    )
}

fn describe_answer(answer: &Result<HeartbeatResponse, TransportError>, hidden: bool) -> String {
    match answer {
        Ok(r) => format!(
            "heartbeat <- {:?} epoch={} v{} a{} assigned={:?} pending={:?} revoke={:?} rev={}{}",
            r.status,
            r.member_epoch,
            r.metadata_version,
            r.assignment_epoch,
            r.assigned,
            r.pending,
            r.revoke,
            r.store_revision,
            if hidden { " (hidden by response-loss)" } else { "" }
        ),
        Err(e) => format!("heartbeat <- {e}"),
    }
}
