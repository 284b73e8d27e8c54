//! The timeline of one run as a self-contained HTML page (inline SVG, a little inline script for
//! zooming; nothing fetched from anywhere): `cargo sim timeline <plan> <seed>`.
//!
//! Owns: turning a run's records into lanes — one per shard, coloured by the consumer process the
//! Redis node's read log shows reading it (ground truth: overlapping readers get stacked bars, so
//! a split is visible as two colours at once); one per consumer process with the leases and drain
//! instructions its transport actually handed it and a tick per coordinator answer; every fault
//! and scheduled action as a shaded band or marker; every finding as a red mark with its text.
//!
//! Never decides anything: it draws what was recorded and what the checkers found, and derives
//! lease and drain periods only to show them (the consumer fail-closed checker is the judge).
//! A pure function of its input, so two renders of one run are byte-identical.

mod page;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rsc::core::model::{GroupId, ShardId};
use rsc::core::protocol::{ErrorCode, HeartbeatStatus};

use crate::checkers::Finding;
use crate::plan::{Plan, Role};
use crate::records::{ProcessId, Records, Us};
use page::{esc, secs, Canvas, Packer, LANE_PX, ROW_PX};

/// Reads of one consumer on one shard closer than this (plus the plan's longest processing time)
/// are drawn as one continuous bar.
const READ_GAP_SLACK_US: Us = 500_000;
/// At most this many header rows of fault labels and of violation labels.
const FAULT_ROWS_MAX: usize = 5;
const VIOLATION_ROWS_MAX: usize = 3;
/// Findings of one kind closer than this (at full zoom) share one label.
const VIOLATION_CLUSTER_PX: f64 = 40.0;
/// Consumer colours (no red: red marks violations).
const PALETTE: [&str; 10] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79"];

/// What the timeline of one run is drawn from.
pub struct TimelineInput<'a> {
    pub plan: &'a Plan,
    pub group: &'a GroupId,
    pub records: &'a Records,
    pub findings: &'a [Finding],
    pub end_us: Us,
    /// Whether the plan's planted bugs were on (`--without-planted` switches them off).
    pub planted_on: bool,
    /// The command that runs this run again (the REPRODUCE line of a failing seed).
    pub reproduce: String,
    /// The command that draws this page again.
    pub this_page: String,
}

/// The colour of a consumer node (every incarnation of a node shares it).
fn colour(process: ProcessId) -> &'static str {
    PALETTE[(process.node.index.saturating_sub(1) as usize) % PALETTE.len()]
}

/// One bar of a shard lane: a consumer reading the shard over `[from, to]`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ReadSpan {
    process: ProcessId,
    from_us: Us,
    to_us: Us,
    reads: usize,
    entries: usize,
}

/// Per shard, the spans in which each consumer process read it (by start).
fn read_spans(input: &TimelineInput<'_>) -> BTreeMap<ShardId, Vec<ReadSpan>> {
    let prefix = format!("{}:", input.group.stream_prefix);
    let gap_us = input.plan.workload.processing_max_ms * 1_000 + READ_GAP_SLACK_US;
    let mut open: BTreeMap<(ShardId, ProcessId), Vec<ReadSpan>> = BTreeMap::new();
    let mut reads: Vec<_> = input.records.reads.iter().collect();
    reads.sort_by_key(|r| r.served_at_us);
    for read in reads {
        let Some(shard) = read.stream.strip_prefix(&prefix).and_then(|s| s.parse::<ShardId>().ok()) else { continue };
        let spans = open.entry((shard, read.process)).or_default();
        match spans.last_mut() {
            Some(span) if read.served_at_us <= span.to_us + gap_us => {
                span.to_us = read.served_at_us;
                span.reads += 1;
                span.entries += read.ids.len();
            }
            _ => spans.push(ReadSpan {
                process: read.process,
                from_us: read.served_at_us,
                to_us: read.served_at_us,
                reads: 1,
                entries: read.ids.len(),
            }),
        }
    }
    let mut by_shard: BTreeMap<ShardId, Vec<ReadSpan>> = BTreeMap::new();
    for shard in 0..input.plan.topology.shards {
        by_shard.insert(shard, Vec::new());
    }
    for ((shard, _), spans) in open {
        by_shard.entry(shard).or_default().extend(spans);
    }
    for spans in by_shard.values_mut() {
        spans.sort_by_key(|s| (s.from_us, s.process));
    }
    by_shard
}

/// Assigns each span a sub-row so overlapping spans (two readers at once) sit one above the other.
fn stack(spans: &[ReadSpan]) -> (Vec<usize>, usize) {
    let mut row_ends: Vec<Us> = Vec::new();
    let rows = spans
        .iter()
        .map(|span| match row_ends.iter().position(|&end| end < span.from_us) {
            Some(row) => {
                row_ends[row] = span.to_us;
                row
            }
            None => {
                row_ends.push(span.to_us);
                row_ends.len() - 1
            }
        })
        .collect();
    (rows, row_ends.len().max(1))
}

/// What one consumer process was told, drawn on its lane.
#[derive(Debug, Default)]
struct ConsumerLane {
    started_us: Us,
    stopped_us: Option<Us>,
    paused: Vec<(Us, Option<Us>)>,
    /// Periods in which it held a lease on at least one shard (answers it saw).
    leases: Vec<(Us, Us)>,
    /// Periods from a drain instruction it saw until an answer with nothing to drain.
    drains: Vec<(Us, Us, Vec<ShardId>)>,
    /// Every answer: received at, CSS class, tooltip.
    answers: Vec<(Us, &'static str, String)>,
}

fn consumer_lanes(input: &TimelineInput<'_>) -> BTreeMap<ProcessId, ConsumerLane> {
    let mut lanes: BTreeMap<ProcessId, ConsumerLane> = BTreeMap::new();
    for life in input.records.lifecycles.iter().filter(|l| l.process.node.role == Role::Consumer) {
        let lane = lanes.entry(life.process).or_default();
        lane.started_us = life.started_at_us;
        lane.stopped_us = life.stopped_at_us;
        lane.paused = life.paused.clone();
    }
    let mut calls: Vec<_> = input.records.heartbeats.iter().filter(|c| c.received_at_us.is_some()).collect();
    calls.sort_by_key(|c| (c.process, c.received_at_us));
    let mut lease: BTreeMap<ProcessId, Option<(Us, Us)>> = BTreeMap::new();
    let mut drain: BTreeMap<ProcessId, Option<(Us, Vec<ShardId>)>> = BTreeMap::new();
    for call in calls {
        let Some(at) = call.received_at_us else { continue };
        let lane = lanes.entry(call.process).or_default();
        let held = lease.entry(call.process).or_default();
        let draining = drain.entry(call.process).or_default();
        let (stop_lease, stop_drain) = if let Some((resp, _)) = call.seen_ok() {
            let class = match resp.status {
                HeartbeatStatus::Ok => "ans-ok",
                HeartbeatStatus::RevokePending | HeartbeatStatus::SyncMetadata => "ans-pending",
            };
            let tip = format!(
                "{} at {}s: {:?} assigned {:?} revoke {:?} lease {} ms (sent {}s)",
                call.process,
                secs(at),
                resp.status,
                resp.assigned,
                resp.revoke,
                resp.assignment_lease_ms,
                secs(call.sent_at_us)
            );
            lane.answers.push((at, class, tip));
            if !resp.revoke.is_empty() && draining.is_none() {
                *draining = Some((at, resp.revoke.clone()));
            }
            if resp.assigned.is_empty() {
                (true, resp.revoke.is_empty())
            } else {
                let end = call.sent_at_us + resp.assignment_lease_ms * 1_000;
                match held {
                    Some((_, held_end)) if *held_end >= at => *held_end = (*held_end).max(end),
                    _ => {
                        if let Some(span) = held.take() {
                            lane.leases.push(span);
                        }
                        *held = Some((at, end));
                    }
                }
                (false, resp.revoke.is_empty())
            }
        } else if let Some((e, _)) = call.seen_error() {
            let fenced = matches!(e.code(), Some(ErrorCode::FencedMemberEpoch | ErrorCode::UnknownMember));
            lane.answers.push((
                at,
                if fenced { "ans-fenced" } else { "ans-error" },
                format!("{} at {}s: {e}", call.process, secs(at)),
            ));
            (fenced, fenced)
        } else {
            lane.answers.push((
                at,
                "ans-hidden",
                format!("{} at {}s: answer hidden by response loss", call.process, secs(at)),
            ));
            (false, false)
        };
        if stop_lease {
            if let Some((from, end)) = held.take() {
                lane.leases.push((from, end.min(at)));
            }
        }
        if stop_drain {
            if let Some((from, shards)) = draining.take() {
                lane.drains.push((from, at, shards));
            }
        }
    }
    for (process, lane) in &mut lanes {
        let stop = lane.stopped_us.unwrap_or(input.end_us);
        if let Some(Some((from, end))) = lease.remove(process) {
            lane.leases.push((from, end.min(stop)));
        }
        if let Some(Some((from, shards))) = drain.remove(process) {
            lane.drains.push((from, stop, shards));
        }
    }
    lanes
}

/// The shard a finding's text names (`shard 3`, or its stream `sim:3`), to put its dot on that
/// lane.
fn named_shard(detail: &str, stream_prefix: &str) -> Option<ShardId> {
    let stream = format!("{stream_prefix}:");
    ["shard ", stream.as_str()].iter().find_map(|marker| {
        let rest = &detail[detail.find(marker)? + marker.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// A one-line description of a fault or action (`kind target params`).
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where everything sits vertically (computed once, at full zoom).
struct Layout {
    faults_top: f64,
    violations_top: f64,
    axis_y: f64,
    shards_top: f64,
    consumers_top: f64,
    bottom: f64,
    shard_tops: BTreeMap<ShardId, f64>,
    consumer_tops: BTreeMap<ProcessId, f64>,
}

impl Layout {
    fn new(
        header_rows: (usize, usize),
        shards: impl Iterator<Item = ShardId>,
        consumers: impl Iterator<Item = ProcessId>,
    ) -> Self {
        let faults_top = 14.0;
        let violations_top = faults_top + header_rows.0 as f64 * ROW_PX + 4.0;
        let axis_y = violations_top + header_rows.1 as f64 * ROW_PX + 14.0;
        let shards_top = axis_y + 10.0;
        let mut y = shards_top + 14.0;
        let shard_tops = shards
            .map(|shard| {
                y += LANE_PX + 4.0;
                (shard, y - LANE_PX - 4.0)
            })
            .collect();
        let consumers_top = y + 6.0;
        y = consumers_top + 14.0;
        let consumer_tops = consumers
            .map(|process| {
                y += LANE_PX + 4.0;
                (process, y - LANE_PX - 4.0)
            })
            .collect();
        Self {
            faults_top,
            violations_top,
            axis_y,
            shards_top,
            consumers_top,
            bottom: y + 4.0,
            shard_tops,
            consumer_tops,
        }
    }

    /// Section titles, lane names and lane separators (outside the zoomed plot).
    fn names(&self, end_us: Us) -> String {
        let mut names = Canvas::new(end_us);
        names.name(self.faults_top + 10.0, "section", "FAULTS / ACTIONS");
        names.name(self.violations_top + 10.0, "section", "VIOLATIONS");
        names.name(self.shards_top + 9.0, "section", "SHARDS (who read)");
        for (shard, top) in &self.shard_tops {
            names.name(top + 16.0, "lane-name", &format!("shard {shard}"));
        }
        names.name(self.consumers_top + 9.0, "section", "CONSUMERS (told)");
        for (process, top) in &self.consumer_tops {
            names.name(top + 16.0, "lane-name", &process.to_string());
        }
        for top in self.shard_tops.values().chain(self.consumer_tops.values()) {
            names.rule(top + LANE_PX + 2.0, "stroke:#eee");
        }
        names.body
    }
}

/// A fault band or action marker with its header row (`None`: no room for its label).
struct HeaderItem {
    from_us: Us,
    to_us: Us,
    text: String,
    row: Option<usize>,
    is_fault: bool,
}

fn scheduled(plan: &Plan, canvas: &Canvas, packer: &mut Packer) -> Vec<HeaderItem> {
    let faults = plan.faults.iter().map(|s| {
        let from_us = s.at_ms * 1_000;
        (from_us, from_us + s.item.healed_after_ms() * 1_000, squash(&s.item.to_string()), true)
    });
    let actions = plan.actions.iter().map(|s| (s.at_ms * 1_000, s.at_ms * 1_000, squash(&s.item.to_string()), false));
    let mut all: Vec<_> = faults.chain(actions).collect();
    all.sort_by_key(|(from_us, ..)| *from_us);
    all.into_iter()
        .map(|(from_us, to_us, text, is_fault)| {
            let row = packer.place(canvas.x(from_us), &text);
            HeaderItem { from_us, to_us, text, row, is_fault }
        })
        .collect()
}

/// Faults: a shaded band over every lane and a label in its header row; actions: dashed markers.
fn draw_scheduled(canvas: &mut Canvas, layout: &Layout, items: &[HeaderItem]) {
    let (top, bottom) = (layout.faults_top, layout.bottom);
    for item in items {
        let title = format!("{} ({}s to {}s)", item.text, secs(item.from_us), secs(item.to_us));
        if item.is_fault {
            let span = (item.from_us, item.to_us);
            canvas.band(span, top, bottom - top, 2.0, "fault", "fill:#f59e0b;fill-opacity:0.12", &title);
            canvas.mark(item.from_us, (top, bottom), "fault-edge", "stroke:#d97706;stroke-opacity:0.5", "");
        } else {
            canvas.mark(item.from_us, (top, bottom), "action", "stroke:#999;stroke-dasharray:3 3", &title);
        }
        if let Some(row) = item.row {
            let class = if item.is_fault { "fault-label" } else { "action-label" };
            canvas.label(item.from_us, 3.0, top + row as f64 * ROW_PX + 11.0, class, &item.text);
        }
    }
}

/// Shard lanes: whom the Redis node served, stacked when two read at once.
fn draw_shards(canvas: &mut Canvas, layout: &Layout, spans: &BTreeMap<ShardId, Vec<ReadSpan>>) {
    for (shard, shard_spans) in spans {
        let top = layout.shard_tops[shard];
        let (rows, n) = stack(shard_spans);
        let h = (LANE_PX - 2.0) / n as f64;
        for (span, row) in shard_spans.iter().zip(rows) {
            let title = format!(
                "{} read shard {shard} from {}s to {}s ({} reads, {} entries)",
                span.process,
                secs(span.from_us),
                secs(span.to_us),
                span.reads,
                span.entries
            );
            let style = format!("fill:{}", colour(span.process));
            canvas.band((span.from_us, span.to_us), top + 1.0 + row as f64 * h, h - 1.0, 2.0, "read", &style, &title);
        }
    }
}

/// Consumer lanes: alive line, pauses, leases held, drains, answer ticks.
fn draw_consumers(canvas: &mut Canvas, layout: &Layout, lanes: &BTreeMap<ProcessId, ConsumerLane>) {
    for (process, lane) in lanes {
        let top = layout.consumer_tops[process];
        let stop = lane.stopped_us.unwrap_or(canvas.end_us);
        let life = format!("{process} alive {}s to {}s", secs(lane.started_us), secs(stop));
        canvas.band((lane.started_us, stop), top + 10.5, 1.5, 1.0, "alive", "fill:#bbb", &life);
        for (from, to) in &lane.paused {
            let to = to.unwrap_or(stop);
            let title = format!("{process} paused {}s to {}s", secs(*from), secs(to));
            canvas.band((*from, to), top + 1.0, LANE_PX - 2.0, 2.0, "paused", "fill:#999;fill-opacity:0.35", &title);
        }
        let fill = format!("fill:{}", colour(*process));
        for (from, to) in &lane.leases {
            let title = format!("{process} held a lease {}s to {}s", secs(*from), secs(*to));
            canvas.band((*from, *to), top + 2.0, 8.0, 1.0, "lease", &fill, &title);
        }
        for (from, to, shards) in &lane.drains {
            let title = format!("{process} told to drain shards {shards:?} from {}s to {}s", secs(*from), secs(*to));
            canvas.band((*from, *to), top + 12.0, 6.0, 2.0, "drain", "fill:url(#drain)", &title);
        }
        for (at, class, tip) in &lane.answers {
            canvas.mark(*at, (top + 18.5, top + LANE_PX), class, "", tip);
        }
    }
}

/// Violations: a red line over every lane, a label in the violations header, a dot on the shard
/// lane the finding names, and the full text as the tooltip.
/// The label of each finding: the first of a run of findings of one kind that would be drawn
/// within a label's width of each other is labelled `! kind ×n`; the others are not labelled.
fn violation_labels(findings: &[Finding], canvas: &Canvas) -> Vec<Option<String>> {
    let mut labels: Vec<Option<String>> = vec![None; findings.len()];
    let mut i = 0;
    while i < findings.len() {
        let x = canvas.x(findings[i].at_us);
        let same = findings[i..]
            .iter()
            .take_while(|f| f.kind == findings[i].kind && canvas.x(f.at_us) - x < VIOLATION_CLUSTER_PX)
            .count();
        let times = if same > 1 { format!(" ×{same}") } else { String::new() };
        labels[i] = Some(format!("! {}{times}", findings[i].kind));
        i += same;
    }
    labels
}

fn draw_violations(canvas: &mut Canvas, layout: &Layout, input: &TimelineInput<'_>, rows: &[Option<(usize, String)>]) {
    let findings = input.findings;
    for (i, (finding, row)) in findings.iter().zip(rows).enumerate() {
        let attrs = format!(r#"id="v{i}" data-kind="{}""#, esc(finding.kind));
        canvas.open_group("violation", &attrs, &finding.to_string());
        let style = "stroke:#d00;stroke-width:1.5;stroke-opacity:0.8";
        canvas.mark(finding.at_us, (layout.violations_top, layout.bottom), "violation-line", style, "");
        if let Some((row, text)) = row {
            let y = layout.violations_top + *row as f64 * ROW_PX + 11.0;
            canvas.label(finding.at_us, 3.0, y, "violation-label", text);
        }
        if let Some(top) =
            named_shard(&finding.detail, &input.group.stream_prefix).and_then(|s| layout.shard_tops.get(&s))
        {
            let (x, y) = (canvas.x(finding.at_us), top + LANE_PX / 2.0);
            let _ = write!(
                canvas.body,
                r#"<circle data-a="{}" cx="{x:.1}" cy="{y:.1}" r="5" style="fill:#d00;stroke:#fff;stroke-width:1.5"/>"#,
                finding.at_us
            );
        }
        canvas.close_group();
    }
}

/// Renders the timeline page of one run.
pub fn render(input: &TimelineInput<'_>) -> String {
    let mut canvas = Canvas::new(input.end_us);
    let mut fault_packer = Packer::new(FAULT_ROWS_MAX);
    let items = scheduled(input.plan, &canvas, &mut fault_packer);
    let mut violation_packer = Packer::new(VIOLATION_ROWS_MAX);
    let violation_labels = violation_labels(input.findings, &canvas);
    let violation_rows: Vec<Option<(usize, String)>> = violation_labels
        .into_iter()
        .zip(input.findings)
        .map(|(label, f)| label.and_then(|text| Some((violation_packer.place(canvas.x(f.at_us), &text)?, text))))
        .collect();
    let spans = read_spans(input);
    let lanes = consumer_lanes(input);
    let rows = (fault_packer.used(), violation_packer.used());
    let layout = Layout::new(rows, spans.keys().copied(), lanes.keys().copied());

    draw_scheduled(&mut canvas, &layout, &items);
    draw_shards(&mut canvas, &layout, &spans);
    draw_consumers(&mut canvas, &layout, &lanes);
    draw_violations(&mut canvas, &layout, input, &violation_rows);

    let names = layout.names(input.end_us);
    let axis = page::axis(&canvas, layout.axis_y, layout.bottom);
    let title = format!("{} seed {}", input.plan.name, input.plan.seed);
    page::Page {
        title: &title,
        header_html: &header_html(input),
        legend_html: &legend_html(&lanes),
        fixed_svg: &names,
        svg_body: &canvas.body,
        axis: &axis,
        axis_y: layout.axis_y,
        height_px: layout.bottom + 4.0,
        end_us: input.end_us,
        findings_html: &findings_html(input.findings),
    }
    .render()
}

fn header_html(input: &TimelineInput<'_>) -> String {
    let plan = input.plan;
    let t = &plan.topology;
    let planted: Vec<String> = plan.planted.iter().map(|b| format!("{b:?}")).collect();
    let planted = match (planted.is_empty(), input.planted_on) {
        (true, _) => "none".to_string(),
        (false, true) => planted.join(", "),
        (false, false) => format!("off (--without-planted; plan lists {})", planted.join(", ")),
    };
    let verdict = if input.findings.is_empty() {
        "no violations".to_string()
    } else {
        format!("<b style=\"color:#c00\">{} violation(s)</b>", input.findings.len())
    };
    format!(
        "<h1>{} &middot; seed {}</h1>\n<div class=\"meta\">{} coordinators, {} consumers, {} producers, {} shards; \
         run {} s, faults heal by {} s; planted bugs: {}; {verdict}. \
         Replay: <code>{}</code> &middot; this page: <code>{}</code></div>",
        esc(&plan.name),
        plan.seed,
        t.coordinators,
        t.consumers,
        t.producers,
        t.shards,
        secs(input.end_us),
        plan.durations.heal_ms / 1_000,
        esc(&planted),
        esc(&input.reproduce),
        esc(&input.this_page),
    )
}

fn legend_html(lanes: &BTreeMap<ProcessId, ConsumerLane>) -> String {
    let mut out = String::from("<div class=\"legend\">");
    let mut seen = std::collections::BTreeSet::new();
    for process in lanes.keys().filter(|p| seen.insert(p.node)) {
        let _ =
            write!(out, r#"<span><i class="sw" style="background:{}"></i>{}</span>"#, colour(*process), process.node);
    }
    out.push_str(
        r##"<span><i class="sw" style="background:#ccc;height:4px"></i>lease held (upper bar)</span>
<span><i class="sw" style="background:repeating-linear-gradient(45deg,#f6c453 0 3px,#8a5a00 3px 5px)"></i>told to drain</span>
<span><i class="sw" style="background:#2a9d4f;width:3px"></i>answer OK</span>
<span><i class="sw" style="background:#e0a800;width:3px"></i>REVOKE_PENDING / SYNC_METADATA</span>
<span><i class="sw" style="background:#6b21a8;width:3px"></i>fenced / unknown</span>
<span><i class="sw" style="background:#999;width:3px"></i>error / hidden</span>
<span><i class="sw" style="background:#f59e0b;opacity:.35"></i>fault</span>
<span><i class="sw" style="background:#d00;width:3px"></i>violation</span></div>"##,
    );
    out
}

fn findings_html(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "<p class=\"meta\">The checkers found nothing in this run.</p>".to_string();
    }
    let mut out = String::from("<ol class=\"findings\">");
    for finding in findings {
        let _ = write!(
            out,
            r#"<li class="violation" data-at="{}"><b>{}</b> at {}s [{}]: {}</li>"#,
            finding.at_us,
            esc(finding.kind),
            secs(finding.at_us),
            finding.checker,
            esc(&finding.detail)
        );
    }
    out.push_str("</ol>");
    out
}

#[cfg(test)]
mod tests;
