//! The timeline draws what was recorded: readers per shard (stacked when two read at once), what
//! each consumer was told, and every finding as a red mark carrying its text.

use super::{read_spans, render, stack, TimelineInput};
use crate::checkers::fixtures::World;
use crate::checkers::Finding;
use crate::plan::{Action, Fault, NodeRef, Origin, Role, Scheduled, Target};

/// The `<g class="violation" ...>` element of finding number `i`, up to its closing tag.
fn violation_element(html: &str, i: usize) -> &str {
    let start = html.find(&format!(r#"<g class="violation" id="v{i}""#)).expect("the finding's violation mark");
    let end = html[start..].find("</g>").expect("a closed group");
    &html[start..start + end]
}

fn input<'a>(w: &'a World, findings: &'a [Finding]) -> TimelineInput<'a> {
    TimelineInput {
        plan: &w.plan,
        group: &w.group,
        records: &w.records,
        findings,
        end_us: 60_000_000,
        planted_on: true,
        reproduce: "cargo sim replay fixture 0".into(),
        this_page: "cargo sim timeline fixture 0".into(),
    }
}

/// consumer-1 reads shard 1 from 2 s; consumer-2 is told to take it at 10 s and reads it from
/// 10 s while consumer-1 still does until 14 s: a split, as a checker would report it.
fn split_world() -> (World, Vec<Finding>) {
    let mut w = World::new();
    let c1 = w.consumer(1);
    let c2 = w.consumer(2);
    w.grant(c1, 1_000_000, &[0, 1], 8_000);
    w.reads(c1, 1, 2_000_000..=14_000_000, 100_000);
    w.withdraw_to(c1, 9_000_000, &[0]);
    if let Some(Some(Ok(resp))) = w.records.heartbeats.last_mut().map(|c| c.answer.as_mut()) {
        resp.revoke = vec![1];
    }
    w.grant(c2, 10_000_000, &[1], 8_000);
    w.reads(c2, 1, 10_000_000..=20_000_000, 100_000);
    let finding = Finding {
        checker: "split",
        kind: "split-ownership",
        at_us: 10_001_000,
        detail: "consumer-1#0 and consumer-2#0 both read shard 1 <from 10.0s>".to_string(),
    };
    (w, vec![finding])
}

#[test]
fn a_finding_is_a_red_mark_with_its_kind_label_and_its_text_as_tooltip() {
    let (w, findings) = split_world();
    let html = render(&input(&w, &findings));
    let mark = violation_element(&html, 0);
    assert!(mark.contains(r#"data-kind="split-ownership""#), "{mark}");
    assert!(mark.contains(">! split-ownership</text>"), "visible label: {mark}");
    // The tooltip is the finding's full text, escaped.
    assert!(mark.contains("<title>[split] split-ownership @10.001000s: consumer-1#0 and consumer-2#0 both read shard 1 &lt;from 10.0s&gt;</title>"), "{mark}");
    // The shard it names gets a dot at the finding's instant.
    assert!(mark.contains(r#"<circle data-a="10001000""#), "{mark}");
    // And the list under the chart repeats it.
    assert!(html.contains(r#"<li class="violation" data-at="10001000"><b>split-ownership</b>"#));
}

#[test]
fn two_readers_of_one_shard_are_stacked_in_their_own_colours() {
    let (w, findings) = split_world();
    let spans = read_spans(&input(&w, &findings));
    let shard1 = &spans[&1];
    assert_eq!(shard1.len(), 2, "{shard1:?}");
    let (rows, n) = stack(shard1);
    assert_eq!((rows, n), (vec![0, 1], 2));
    // Every initial shard has a lane, read or not.
    assert_eq!(spans.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert!(spans[&0].is_empty());
    let html = render(&input(&w, &findings));
    assert!(html.contains("consumer-1#0 read shard 1 from 2.0s to 14.0s (121 reads, 0 entries)"), "merged reads");
    assert!(html.contains(r#"class="read" data-a="10001000" data-b="20001000""#));
    assert!(html.contains("fill:#1f77b4") && html.contains("fill:#ff7f0e"), "one colour per consumer");
}

#[test]
fn a_consumer_lane_shows_its_lease_its_drain_and_every_answer() {
    let (w, findings) = split_world();
    let html = render(&input(&w, &findings));
    // consumer-1: a lease from the grant's receipt (1.001 s) to its end (sent at 1 s + 8 s), then
    // one from the REVOKE_PENDING answer that still lists shard 0 (received 9.001 s, sent at 9 s);
    // told to drain shard 1 from then on (nothing told it otherwise before the run's end).
    assert!(html.contains("consumer-1#0 held a lease 1.0s to 9.0s"), "lease");
    assert!(html.contains("consumer-1#0 held a lease 9.0s to 17.0s"), "lease renewed after a 1 ms gap");
    assert!(html.contains("consumer-1#0 told to drain shards [1] from 9.0s to 60.0s"), "drain");
    let answers = html.matches(r#"<line class="ans-"#).count();
    assert_eq!(answers, 3);
    assert_eq!(html.matches(r#"<line class="ans-pending""#).count(), 1);
}

#[test]
fn faults_and_actions_are_drawn_and_the_page_is_self_contained_and_deterministic() {
    let (mut w, findings) = split_world();
    let partition = Fault::Partition { target: Target::Node(NodeRef::new(Role::Consumer, 1)), duration_ms: 4_000 };
    w.plan.faults.push(Scheduled { at_ms: 11_000, item: partition, origin: Origin::Plan(0) });
    w.plan.actions.push(Scheduled { at_ms: 30_000, item: Action::ConsumerJoin, origin: Origin::Plan(0) });
    let html = render(&input(&w, &findings));
    assert_eq!(html, render(&input(&w, &findings)), "a pure function of its input");
    assert!(html.contains(r#"<rect class="fault" data-a="11000000" data-b="15000000""#), "the fault's band");
    assert!(html.contains(">partition consumer-1 for 4000ms</text>"), "the fault's label");
    assert!(html.contains(r#"<line class="action" data-a="30000000""#) && html.contains(">consumer-join</text>"));
    assert!(!html.contains("<link") && !html.contains(" src=") && !html.contains("url(http"), "nothing fetched");
    let clean: Vec<Finding> = Vec::new();
    let html = render(&input(&w, &clean));
    assert!(!html.contains(r#"<g class="violation""#));
    assert!(html.contains("The checkers found nothing in this run."));
}

/// `cargo sim timeline` on a real planted failure: every finding of the run gets its mark.
#[cfg(madsim)]
#[test]
fn the_timeline_of_a_planted_failure_marks_its_violations() {
    use crate::plan::{default_plan_dir, load_plan};
    use crate::runner::{run_seed, sim_group};
    // Seed 3 of this plan is caught (see `cargo sim planted`).
    let plan = load_plan(&default_plan_dir(), "planted-accept-stale-revoked").unwrap().draw(PLANTED_SEED).unwrap();
    let outcome = run_seed(plan.clone(), true);
    assert!(!outcome.findings.is_empty(), "seed {PLANTED_SEED} of the planted plan fails");
    let records = outcome.records.as_ref().expect("a traced run keeps its records");
    let input = TimelineInput {
        plan: &plan,
        group: &sim_group(),
        records,
        findings: &outcome.findings,
        end_us: plan.durations.run_ms * 1_000,
        planted_on: true,
        reproduce: String::new(),
        this_page: String::new(),
    };
    let html = render(&input);
    for (i, finding) in outcome.findings.iter().enumerate() {
        let mark = violation_element(&html, i);
        assert!(mark.contains(&format!(r#"data-kind="{}""#, finding.kind)), "{mark}");
    }
    let first = violation_element(&html, 0);
    assert!(first.contains(&format!(">! {}", outcome.findings[0].kind)), "the first finding is labelled");
    assert!(html.contains(r#"class="read""#) && html.contains(r#"class="lease""#), "lanes are drawn");
}

#[cfg(madsim)]
const PLANTED_SEED: u64 = 3;

/// The header's commands are the ones the caller built (`cli::reproduce`): a control run's page
/// names the control run, not `cargo sim replay`, which runs the planted bugs.
#[test]
fn the_header_gives_the_commands_that_run_this_run_again() {
    let (w, findings) = split_world();
    let mut input = input(&w, &findings);
    input.planted_on = false;
    input.reproduce = "cargo sim --plans /tmp/p run x --seeds 3 --without-planted".into();
    input.this_page = "cargo sim --plans /tmp/p timeline x 3 --without-planted".into();
    let html = render(&input);
    assert!(html.contains("Replay: <code>cargo sim --plans /tmp/p run x --seeds 3 --without-planted</code>"), "{html}");
    assert!(html.contains("this page: <code>cargo sim --plans /tmp/p timeline x 3 --without-planted</code>"));
}
