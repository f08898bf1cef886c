//! upstream: pkg/kubelet/status/status_manager_test.go, the cases that decide whether and
//! what the status manager sends the API server, under their names, through our pure
//! [`unchanged`] and [`plan`]. Upstream counts API calls on a fake clientset (a GET, then a
//! patch); we send no GET (the patch carries the pod's UID as a precondition, so a pod
//! deleted or recreated under the same name is refused by the API server, which is what
//! upstream's GET guards: `TestSyncPodIgnoresNotFound`, `TestSyncPodChecksMismatchedUID`
//! cannot apply here), so "an update" is `Step::Patch` and "no action" is `unchanged` or
//! `Step::AlreadyThere`. `getRandomPodStatus()` is a status with only a message.

use super::*;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Upstream's `getRandomPodStatus()`: only a message, different each time.
fn random_status(n: u32) -> PodStatus {
    PodStatus {
        message: Some(format!("random message {n}")),
        ..Default::default()
    }
}

/// What the fake API server holds after `step`: the status it was patched to.
fn applied(step: &Step) -> PodStatus {
    match step {
        Step::Patch { status, .. } | Step::AlreadyThere(status) => status.clone(),
    }
}

fn is_patch(step: &Step) -> bool {
    matches!(step, Step::Patch { .. })
}

#[test]
fn test_new_status() {
    // The pod exists at the API server with no status; the first status is sent.
    let api = PodStatus::default();
    let new = random_status(1);
    assert!(!unchanged(&new, None, false));
    let step = plan(new, None, Some(&api), false, false);
    let Step::Patch { diff, .. } = &step else {
        panic!("{step:?}")
    };
    assert_eq!(diff["message"], "random message 1");
}

#[test]
fn test_unchanged_status() {
    // SetPodStatus twice with the same status: one update.
    let api = PodStatus::default();
    let status = random_status(1);
    let first = plan(status.clone(), None, Some(&api), false, false);
    assert!(is_patch(&first));
    let sent = applied(&first);
    assert!(unchanged(&status, Some(&sent), false), "no second update");
}

#[test]
fn test_changed_status() {
    // Two different statuses: two updates, the second with only what changed.
    let api = PodStatus::default();
    let first = plan(random_status(1), None, Some(&api), false, false);
    assert!(is_patch(&first));
    let sent = applied(&first);
    let second = random_status(2);
    assert!(!unchanged(&second, Some(&sent), false));
    let step = plan(second, Some(&sent), Some(&api), false, false);
    let Step::Patch { diff, .. } = &step else {
        panic!("{step:?}")
    };
    assert_eq!(diff, &serde_json::json!({"message": "random message 2"}));
}

#[test]
fn test_reconcile_pod_status() {
    let t =
        |nanos: i64| Time(k8s_openapi::jiff::Timestamp::from_nanosecond(nanos as i128).unwrap());
    let mut status = random_status(1);
    status.start_time = Some(t(1_700_000_000_123_456_789));
    let first = plan(
        status.clone(),
        None,
        Some(&PodStatus::default()),
        true,
        false,
    );
    assert!(is_patch(&first));
    let sent = applied(&first);

    // "If the pod status is the same, a reconciliation is not needed and syncBatch should
    // do nothing": at a resync the status is looked at again, and nothing is sent.
    let api = sent.clone();
    assert!(
        !unchanged(&status, Some(&sent), true),
        "a resync looks again"
    );
    assert_eq!(
        plan(status.clone(), Some(&sent), Some(&api), true, false),
        Step::AlreadyThere(sent.clone())
    );

    // "If the pod status is the same, only the timestamp is in Rfc3339 format (lower
    // precision without nanosecond), a reconciliation is not needed".
    let mut api = sent.clone();
    api.start_time = Some(t(1_700_000_000_000_000_000));
    assert!(!is_patch(&plan(
        status.clone(),
        Some(&sent),
        Some(&api),
        true,
        false
    )));

    // "If the pod status is different, a reconciliation is needed, syncBatch should
    // trigger an update".
    let changed = random_status(2);
    let step = plan(changed, Some(&sent), Some(&api), true, false);
    let Step::Patch { diff, .. } = &step else {
        panic!("{step:?}")
    };
    assert_eq!(diff["message"], "random message 2");
}

#[test]
fn test_stale_updates() {
    // "Unchanged status should not send an update ... even if it's stale as long as
    // nothing changes": the API server has what was sent; a resync sends nothing.
    let status = PodStatus {
        message: Some("second version bump".into()),
        ..Default::default()
    };
    let sent = applied(&plan(
        status.clone(),
        None,
        Some(&PodStatus::default()),
        false,
        false,
    ));
    assert!(unchanged(&status, Some(&sent), false));
    assert!(!is_patch(&plan(
        status,
        Some(&sent),
        Some(&sent),
        true,
        false
    )));
}

#[test]
fn test_sync_pod_no_deadlock() {
    let running = || {
        Some(vec![ContainerStatus {
            name: "c".into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }])
    };
    let api = PodStatus {
        phase: Some("Running".into()),
        container_statuses: running(),
        ..Default::default()
    };
    // "Pod not deleted (success case)": a patch.
    let sent = applied(&plan(random_status(1), None, Some(&api), false, true));

    // "Pod is terminated, but still running": a patch, which does not say Failed while a
    // container may still run (mergePodStatus).
    let mut failed = random_status(2);
    failed.phase = Some("Failed".into());
    let step = plan(failed.clone(), Some(&sent), Some(&api), false, true);
    assert!(is_patch(&step));
    assert_ne!(applied(&step).phase.as_deref(), Some("Failed"));
    let sent = applied(&step);

    // "Pod is terminated successfully": the same status, now that no container can run,
    // is not `unchanged` (what was sent held the phase back) and goes out Failed.
    assert!(!unchanged(&failed, Some(&sent), false));
    let step = plan(failed, Some(&sent), Some(&api), false, false);
    let Step::Patch { diff, .. } = &step else {
        panic!("{step:?}")
    };
    assert_eq!(diff["phase"], "Failed");
}
