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

/// Upstream's `getTestPod()` with annotations.
fn test_pod(uid: &str, annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: kube::api::ObjectMeta {
            uid: Some(uid.into()),
            name: Some("foo".into()),
            namespace: Some("new".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Upstream's static pod (`config.source: file`). Upstream's status manager pairs a static
/// pod with its mirror by name alone; the pod worker's `IsMirrorPodOf` also compares the
/// hash, and our status loop does both, so the static pod carries the hash its mirror
/// names, as config-source writes for every static pod.
fn static_pod() -> Pod {
    test_pod(
        "12345678",
        &[
            (k8s::labels::CONFIG_SOURCE, "file"),
            (k8s::labels::CONFIG_HASH, "mirror"),
        ],
    )
}

/// Upstream's mirror pod: `config.source: api`, `config.mirror: mirror`.
fn mirror_pod(uid: &str) -> Pod {
    test_pod(
        uid,
        &[
            (k8s::labels::CONFIG_SOURCE, "api"),
            (k8s::labels::CONFIG_MIRROR, "mirror"),
        ],
    )
}

fn deleted(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    pod
}

#[test]
fn test_static_pod() {
    let static_pod = static_pod();
    // "Should not sync pod in syncBatch because there is no corresponding mirror pod":
    // upstream's pod worker creates the mirror and the status manager waits for it; our
    // status loop creates it itself, so no status is patched until it exists either.
    assert_eq!(mirror(&static_pod, None), Mirror::Create { stale: None });

    // "Should sync pod because the corresponding mirror pod is created": a get, then a
    // patch onto the mirror.
    let mut existing = mirror_pod("mirror-12345678");
    let Mirror::Current { uid, status } = mirror(&static_pod, Some(&existing)) else {
        panic!("the mirror is the static pod's")
    };
    assert_eq!(uid, "mirror-12345678");
    let mut status_set = random_status(1);
    status_set.start_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let step = plan(status_set.clone(), None, status.as_deref(), true, false);
    assert!(is_patch(&step));
    let sent = applied(&step);

    // "syncBatch should not sync any pods because nothing is changed": the mirror now
    // holds what was sent.
    existing.status = Some(sent.clone());
    let Mirror::Current { status, .. } = mirror(&static_pod, Some(&existing)) else {
        panic!("the mirror is the static pod's")
    };
    assert!(unchanged(&status_set, Some(&sent), false));
    assert!(!is_patch(&plan(
        status_set.clone(),
        Some(&sent),
        status.as_deref(),
        true,
        false
    )));

    // "Change mirror pod identity ... Should not update to mirror pod, because UID has
    // changed": upstream's patch would go to a UID the API server no longer has. We read
    // the mirror before each patch and the patch names the UID read (a precondition), so
    // the status goes to the new mirror, in full, since the new one has none.
    let mut renewed = mirror_pod("new-mirror-pod");
    renewed.status = Some(PodStatus::default());
    let Mirror::Current { uid, status } = mirror(&static_pod, Some(&renewed)) else {
        panic!("the new mirror is the static pod's")
    };
    assert_eq!(uid, "new-mirror-pod");
    let Step::Patch { diff, .. } = plan(status_set, Some(&sent), status.as_deref(), true, false)
    else {
        panic!("the new mirror gets the status")
    };
    assert_eq!(diff["message"], "random message 1");
}

#[test]
fn mirror_pods_are_replaced_when_outdated_or_deleted_and_others_are_not_ours() {
    // upstream kubelet.go syncPod: "mirrorPod.DeletionTimestamp != nil ||
    // !IsMirrorPodOf(mirrorPod, pod)": deleted (with its UID as the precondition), then
    // created anew.
    let static_pod = static_pod();
    let mut outdated = mirror_pod("old");
    outdated
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(k8s::labels::CONFIG_MIRROR.into(), "older-hash".into());
    assert_eq!(
        mirror(&static_pod, Some(&outdated)),
        Mirror::Create {
            stale: Some("old".into())
        }
    );
    assert_eq!(
        mirror(&static_pod, Some(&deleted(mirror_pod("going")))),
        Mirror::Create {
            stale: Some("going".into())
        }
    );
    // A regular pod of that name is not a mirror (upstream's pod manager never lists it
    // as one, and its create fails AlreadyExists): left alone, nothing patched onto it.
    let regular = test_pod("regular", &[(k8s::labels::CONFIG_SOURCE, "api")]);
    assert!(matches!(
        mirror(&static_pod, Some(&regular)),
        Mirror::NotOurs(e) if e.contains("is not a mirror pod")
    ));
}

#[test]
fn a_mirror_made_from_the_static_pod_is_its_mirror() {
    // What `CreateMirrorPod` writes must be what `IsMirrorPodOf` accepts, or every
    // resync would replace the mirror.
    let static_pod = static_pod();
    let mut made = mirror_of(&static_pod);
    made.metadata.uid = Some("made".into());
    assert!(matches!(
        mirror(&static_pod, Some(&made)),
        Mirror::Current { uid, .. } if uid == "made"
    ));
}

fn failed() -> PodStatus {
    let mut status = random_status(1);
    status.phase = Some("Failed".into());
    status
}

#[test]
fn test_delete_pod_before_finished() {
    // "Expect not to see a delete action as the pod isn't finished yet (TerminatePod
    // isn't called)": while a container may run, the status loop patches (holding the
    // phase back) and has no step that deletes; deletion is decided only by `finish`,
    // which the kill path reaches once the pod's containers are gone.
    let pod = deleted(test_pod("12345678", &[(k8s::labels::CONFIG_SOURCE, "api")]));
    let step = plan(failed(), None, pod.status.as_ref(), false, true);
    assert!(is_patch(&step));
    assert_ne!(applied(&step).phase.as_deref(), Some("Failed"));
}

#[test]
fn test_delete_pod_finished() {
    // "Expect to see a delete action as the pod is finished (TerminatePod called)": a
    // get, a patch, a delete; ours: the patch, then the delete.
    let pod = deleted(test_pod("12345678", &[(k8s::labels::CONFIG_SOURCE, "api")]));
    let Finish { patch, delete } = finish(&pod, Some(&failed()));
    assert_eq!(
        patch.expect("the terminal status goes first")["phase"],
        "Failed"
    );
    assert!(delete);
    // What the API server has already is not sent again; the deletion still completes.
    let mut there = pod.clone();
    there.status = Some(failed());
    assert_eq!(
        finish(&there, Some(&failed())),
        Finish {
            patch: None,
            delete: true
        }
    );
    // Not being deleted (a pod that finished by itself): its status, no delete.
    let finished = test_pod("12345678", &[(k8s::labels::CONFIG_SOURCE, "api")]);
    assert!(!finish(&finished, Some(&failed())).delete);
}

#[test]
fn test_do_not_delete_mirror_pods() {
    // "Expect not to see a delete action": a mirror pod being deleted is never deleted
    // by the status manager (canBeDeleted: IsMirrorPod), and neither is the static pod,
    // which is not the API server's.
    let none = Finish {
        patch: None,
        delete: false,
    };
    assert_eq!(
        finish(&deleted(mirror_pod("mirror-12345678")), Some(&failed())),
        none
    );
    assert_eq!(finish(&deleted(static_pod()), Some(&failed())), none);
}

#[test]
fn orphaned_mirror_pods_are_those_of_no_static_pod() {
    // upstream kubelet_pods.go HandlePodCleanups: "Remove any orphaned mirror pods"; a
    // static pod still terminating keeps its mirror (IsPodForMirrorPodTerminatingByFullName).
    let kept = mirror_pod("kept");
    let mut orphan = mirror_pod("orphan");
    orphan.metadata.name = Some("gone".into());
    let regular = {
        let mut p = test_pod("regular", &[(k8s::labels::CONFIG_SOURCE, "api")]);
        p.metadata.name = Some("other".into());
        p
    };
    let on_node = [kept, orphan, regular];
    let statics = [("new".to_string(), "foo".to_string())].into();
    let found: Vec<&str> = orphaned_mirrors(&on_node, &statics)
        .into_iter()
        .map(k8s::pod_uid)
        .collect();
    assert_eq!(
        found,
        ["orphan"],
        "only the mirror of no static pod, never a regular pod"
    );
}
