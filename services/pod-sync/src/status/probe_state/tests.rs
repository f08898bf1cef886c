//! The probe-result rule, one row per case, and the file round trip.

use super::*;
use nodeagent_proto::api::ProbeResult;

fn snapshot(results: Vec<ProbeResult>) -> ProbeResultUpdate {
    ProbeResultUpdate {
        snapshot: true,
        results,
        ..Default::default()
    }
}

fn delta(results: Vec<ProbeResult>) -> ProbeResultUpdate {
    ProbeResultUpdate {
        results,
        ..Default::default()
    }
}

fn result(id: &str, kind: Kind, outcome: Outcome) -> ProbeResult {
    ProbeResult {
        pod_uid: format!("pod-{id}"),
        container_name: "c".into(),
        container_id: id.into(),
        kind: kind as i32,
        outcome: outcome as i32,
        ..Default::default()
    }
}

/// Ready a, b; started a, b.
fn before() -> ProbeValues {
    ProbeValues {
        ready: [("a".into(), true), ("b".into(), true)].into(),
        started: ["a".into(), "b".into()].into(),
    }
}

#[test]
fn only_real_results_change_values() {
    use Kind::*;
    use Outcome::*;
    // (case, update, a ready, a started, b ready, touched pods)
    type Row = (
        &'static str,
        ProbeResultUpdate,
        Option<bool>,
        bool,
        Option<bool>,
        Vec<&'static str>,
    );
    let rows: Vec<Row> = vec![
        (
            "an empty snapshot (a restarted probe) keeps everything",
            snapshot(vec![]),
            Some(true),
            true,
            Some(true),
            vec![],
        ),
        (
            "a snapshot without a keeps a",
            snapshot(vec![result("b", Readiness, Success)]),
            Some(true),
            true,
            Some(true),
            vec![],
        ),
        (
            "a real failure flips a only",
            delta(vec![result("a", Readiness, Failure)]),
            Some(false),
            true,
            Some(true),
            vec!["pod-a"],
        ),
        (
            "a real failure in a snapshot flips a too",
            snapshot(vec![result("a", Readiness, Failure)]),
            Some(false),
            true,
            Some(true),
            vec!["pod-a"],
        ),
        (
            "a liveness failure changes no readiness",
            delta(vec![result("a", Liveness, Failure)]),
            Some(true),
            true,
            Some(true),
            vec!["pod-a"],
        ),
    ];
    for (case, update, a_ready, a_started, b_ready, touched) in rows {
        let mut values = before();
        let mut liveness_failed = HashSet::new();
        let got = values.apply(&mut liveness_failed, &update);
        assert_eq!(values.ready.get("a").copied(), a_ready, "{case}");
        assert_eq!(values.started.contains("a"), a_started, "{case}");
        assert_eq!(values.ready.get("b").copied(), b_ready, "{case}");
        assert_eq!(got, touched, "{case}");
    }
}

#[test]
fn a_new_container_id_starts_unready_and_unstarted() {
    let mut values = before();
    let mut liveness_failed = HashSet::new();
    // A restarted container has a new ID: nothing carries over from the old one.
    assert_eq!(values.ready.get("new"), None);
    assert!(!values.started.contains("new"));
    values.apply(
        &mut liveness_failed,
        &delta(vec![result("new", Kind::Startup, Outcome::Success)]),
    );
    assert!(values.started.contains("new"));
    assert_eq!(values.ready.get("new"), None);
    values.apply(
        &mut liveness_failed,
        &delta(vec![result("new", Kind::Readiness, Outcome::Success)]),
    );
    assert_eq!(values.ready.get("new"), Some(&true));
}

#[test]
fn liveness_and_startup_failures_mark_the_container_for_a_kill() {
    let mut values = before();
    let mut failed = HashSet::new();
    values.apply(
        &mut failed,
        &delta(vec![result("a", Kind::Startup, Outcome::Failure)]),
    );
    values.apply(
        &mut failed,
        &delta(vec![result("b", Kind::Liveness, Outcome::Failure)]),
    );
    assert_eq!(failed, ["a".to_string(), "b".to_string()].into());
    values.apply(
        &mut failed,
        &delta(vec![result("b", Kind::Liveness, Outcome::Success)]),
    );
    assert_eq!(failed, ["a".to_string()].into());
}

#[test]
fn prune_forgets_containers_that_are_gone() {
    let mut values = before();
    assert!(!values.prune(&["a", "b", "c"].into()));
    assert!(values.prune(&["b"].into()));
    assert_eq!(values.ready.keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(values.started.iter().collect::<Vec<_>>(), ["b"]);
}

#[tokio::test]
async fn values_survive_a_restart_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let saved = store(dir.path());
    assert_eq!(saved.load().await, ProbeValues::default());
    saved.save(&before()).await.unwrap();
    assert_eq!(store(dir.path()).load().await, before());
    // A broken file is not fatal: pod-sync starts from nothing, as before.
    std::fs::write(dir.path().join("pod-sync/probe-values.json"), b"{").unwrap();
    assert_eq!(saved.load().await, ProbeValues::default());
}
