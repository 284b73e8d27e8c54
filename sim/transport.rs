//! [`RecordingTransport`]: wraps a client's coordinator transport and records every call (what was
//! sent and when, what came back and when) into the run's [`Recorder`]. The consumer fail-closed,
//! producer fail-closed and recorded-response checkers compute leases and compare responses from
//! these records, never from the clients' own state.
//!
//! It also carries the `response-loss` fault: with the node's current probability it hides a
//! successful answer the coordinator already produced and makes the client wait out its timeout,
//! exactly what a response lost on the way back looks like. The decision draws from an RNG seeded
//! per process, so it is deterministic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;
use rsc::client::{CoordinatorTransport, TransportError};
use rsc::core::model::GroupId;
use rsc::core::protocol::{HeartbeatRequest, HeartbeatResponse, RoutingResponse};

use crate::records::{CoordinatorCall, ProcessId, Recorder};

/// The response-loss probability of one node, set by the fault injector (f64 bits; 0 = off).
#[derive(Clone, Debug, Default)]
pub struct LossKnob(Arc<AtomicU64>);

impl LossKnob {
    pub fn set(&self, probability: f64) {
        self.0.store(probability.to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A transport that records every call and may hide answers (see the module docs).
pub struct RecordingTransport<T> {
    inner: T,
    process: ProcessId,
    recorder: Recorder,
    loss: LossKnob,
    rng: Mutex<SmallRng>,
    /// How long a client waits for an answer (a hidden answer surfaces as a timeout after this).
    timeout: Duration,
}

impl<T: CoordinatorTransport> RecordingTransport<T> {
    pub fn new(
        inner: T,
        process: ProcessId,
        recorder: Recorder,
        loss: LossKnob,
        rng: SmallRng,
        timeout_ms: u64,
    ) -> Self {
        Self { inner, process, recorder, loss, rng: Mutex::new(rng), timeout: Duration::from_millis(timeout_ms) }
    }

    /// Whether to hide this answer. Draws only while the fault is on, so a run without
    /// response-loss faults draws nothing.
    fn hide(&self) -> bool {
        let p = self.loss.get();
        p > 0.0 && self.rng.lock().unwrap_or_else(PoisonError::into_inner).gen_bool(p.min(1.0))
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
            tokio::time::sleep_until(sent + self.timeout).await;
            return Err(TransportError::Timeout);
        }
        answer
    }
}

fn new_call<Req, Resp>(process: ProcessId, request: Req, sent_at_us: u64) -> CoordinatorCall<Req, Resp> {
    CoordinatorCall { process, request, sent_at_us, received_at_us: None, answer: None, hidden: false }
}

impl<T: CoordinatorTransport> CoordinatorTransport for RecordingTransport<T> {
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        let process = self.process;
        let request = req.clone();
        self.recorded(
            self.inner.heartbeat(req),
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

    async fn routing(&self, group: &GroupId, known_version: u64) -> Result<RoutingResponse, TransportError> {
        let process = self.process;
        self.recorded(
            self.inner.routing(group, known_version),
            |recorder, at| {
                recorder.trace_verbose(process, || "routing ->".to_string());
                let mut records = recorder.lock();
                records.routings.push(new_call(process, (), at));
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
