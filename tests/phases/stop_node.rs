//! The `stop-node` phase: plans the units' stops in order, each needing its own grant.

use super::*;

#[test]
fn plans_stops_in_order_and_needs_each_unit_granted() {
    let f = Fixture::new();
    let s = f.session(RunMode::Plan);
    phase(&s, "stop-node", &input(&f)).expect("plan");
    let stops: Vec<_> = changes_json(&s)
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c["kind"].as_str().unwrap_or(""),
                c["unit"].as_str().unwrap_or("")
            )
        })
        .collect();
    // Without a bus the plan lists every stop, in order; with one (inside the harness)
    // it asks systemd, and none of these units runs there, so nothing would stop.
    let expected: Vec<&str> = if s.systemd.manager().is_ok() {
        Vec::new()
    } else {
        vec![
            "unit-stop nodeward-kubelet.service",
            "unit-stop nodeward-containerd.service",
            "unit-stop kubepods.slice",
        ]
    };
    assert_eq!(stops, expected);
    no_denials(&s, "stop-node");

    let mut g = bundle_grants("stop-node");
    g.systemd.start.retain(|u| u != "kubepods.slice");
    let s = f.session(RunMode::Plan);
    let err = phase_with_grants(&s, "stop-node", g, &input(&f)).expect_err("slice");
    assert!(
        err.to_string().contains("stopping kubepods.slice") && err.to_string().contains("denied"),
        "{err}"
    );
}
