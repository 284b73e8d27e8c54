//! The shipped plans parse and draw for many seeds; drawing is a pure function of (plan, seed).

use super::*;

fn shipped() -> Vec<(String, PlanSpec)> {
    let dir = default_plan_dir();
    plan_names(&dir).unwrap().into_iter().map(|name| (name.clone(), load_plan(&dir, &name).unwrap())).collect()
}

#[test]
fn every_shipped_plan_draws_for_many_seeds() {
    let plans = shipped();
    assert!(plans.len() >= 17, "expected the matrix plans and the named scenarios, found {}", plans.len());
    for (name, spec) in &plans {
        assert_eq!(&spec.name, name, "the plan's name must match its file name");
        for seed in 0..200 {
            let plan = spec.draw(seed).unwrap_or_else(|e| panic!("{name} seed {seed}: {e}"));
            for f in &plan.faults {
                assert!(f.at_ms + f.item.healed_after_ms() <= plan.durations.heal_ms, "{name} seed {seed}: {f:?}");
            }
        }
    }
}

#[test]
fn drawing_is_deterministic_and_seeds_differ() {
    let dir = default_plan_dir();
    let swarm = load_plan(&dir, "swarm").unwrap();
    assert_eq!(swarm.draw(42).unwrap().describe(), swarm.draw(42).unwrap().describe());
    let distinct: std::collections::BTreeSet<String> = (0..20).map(|s| swarm.draw(s).unwrap().describe()).collect();
    assert_eq!(distinct.len(), 20, "every swarm seed draws a different run");
}

#[test]
fn the_matrix_plans_cover_the_seed_test_matrix() {
    let names: Vec<String> = shipped().into_iter().map(|(n, _)| n).collect();
    for i in 1..=11 {
        let prefix = format!("m{i:02}-");
        assert!(names.iter().any(|n| n.starts_with(&prefix)), "no plan for test matrix item {i}");
    }
    for required in ["standard", "swarm", "rolling-update", "coordinator-loss", "redis-outage", "resharding-under-load"]
    {
        assert!(names.iter().any(|n| n == required), "missing plan {required}");
    }
}

#[test]
fn bad_plans_are_rejected_with_a_reason() {
    let base = r#"
        name = "x"
        [topology]
        coordinators = 1
        consumers = 1
        producers = 0
        shards = 1
        [durations]
        run_ms = 60000
        heal_ms = 20000
        liveness_bound_ms = 20000
    "#;
    let cases = [
        (
            "[[fault]]\nat_ms = 19000\nkind = \"partition\"\ntarget = \"consumer-1\"\nparams = { duration_ms = 5000 }",
            "heals at",
        ),
        ("[[fault]]\nat_ms = 0\nkind = \"teleport\"", "unknown fault kind"),
        ("[[fault]]\nat_ms = 0\nkind = \"pause\"\ntarget = \"consumer-1\"\nparams = { duration = 5 }", "unknown param"),
        ("[[fault]]\nat_ms = 0\nkind = \"kill\"\ntarget = \"coordinator-1\"", "only one consumer or producer"),
        ("[[fault]]\nat_ms = 0\nkind = \"pause\"\ntarget = \"consumer-1\"", "needs a duration"),
        ("[group]\nassignment_lease_ms = 20000", "memberLeaseTtlMs must be at least assignmentLeaseMs"),
    ];
    for (extra, expected) in cases {
        let spec = PlanSpec::parse(&format!("{base}\n{extra}"), Path::new("x.toml")).unwrap();
        let err = spec.draw(1).unwrap_err().to_string();
        assert!(err.contains(expected), "{extra}: {err}");
    }
    let unknown_field = PlanSpec::parse(&format!("{base}\n[workload]\nspeed = 1"), Path::new("x.toml"));
    assert!(unknown_field.is_err());
}

#[test]
fn clock_drift_beyond_half_the_clock_rate_margin_is_refused_and_clock_faults_need_a_client() {
    let plan = |fault: &str| {
        let text = format!(
            "name = \"x\"\ndescription = \"x\"\n[topology]\ncoordinators = 1\nconsumers = 1\nproducers = 1\nshards = 1\n\
             [durations]\nrun_ms = 60000\nheal_ms = 20000\nliveness_bound_ms = 20000\n[[fault]]\nat_ms = 1000\n{fault}\n"
        );
        toml::from_str::<PlanSpec>(&text).unwrap().draw(1)
    };
    let drift = |percent: &str| {
        plan(&format!(
            "kind = \"clock-drift\"\ntarget = \"consumer-1\"\nparams = {{ drift_percent = {percent}, duration_ms = 1000 }}"
        ))
    };
    assert!(drift("-1.0").is_ok() && drift("0.5").is_ok());
    let refused = drift("1.5").unwrap_err().to_string();
    assert!(refused.contains("outside the model"), "{refused}");
    assert!(drift("[-2.0, -1.5]").is_err());
    let coordinator = plan("kind = \"clock-stop\"\ntarget = \"coordinator-1\"\nparams = { duration_ms = 1000 }");
    assert!(coordinator.unwrap_err().to_string().contains("only consumers and producers"));
    assert!(plan("kind = \"clock-stop\"\ntarget = \"producer-1\"\nparams = { duration_ms = 1000 }").is_ok());
}
