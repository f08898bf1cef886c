//! In-place resize (issue 30), driven as a user drives it: `kubectl patch --subresource
//! resize` against the test API server, judged by what kubectl shows and by the cgroup
//! files the container and the pod run under. Oracles: upstream's resize semantics (KEP-1287,
//! GA in 1.35): the same container keeps running with new limits under `resizePolicy:
//! NotRequired`, a container whose policy for a changed resource is `RestartContainer` is
//! restarted (its restart count goes up); `status.containerStatuses[].resources` and
//! `allocatedResources` as `convertContainerStatusResources` fills them; a resize beyond
//! the node's allocatable is `PodResizePending` / `Infeasible` with the allocation
//! manager's message, and observedGeneration the pod's generation; kube-apiserver's
//! `ValidatePodResize` words for a QoS change.

use super::*;
use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{cgroup, consistently};

/// kubectl's `patch --subresource` accepts `resize` from 1.32.
const RESIZE_SUBRESOURCE: u32 = 32;

/// How long a pod-sync restart is watched for a changed container, phase or readiness.
const RESTART_WINDOW: Duration = Duration::from_secs(6);

const MI: i64 = 1 << 20;

/// A container's cgroup file as the container itself sees it.
async fn inside(kubectl: &Kubectl, pod: &str, container: &str, v1: &str, v2: &str) -> String {
    let path = if cgroup::is_v2() { v2 } else { v1 };
    kubectl
        .ok(&["exec", pod, "-c", container, "--", "cat", path])
        .await
        .trim()
        .to_string()
}

/// The memory limit a container sees on its own cgroup.
async fn memory_inside(kubectl: &Kubectl, pod: &str, container: &str) -> String {
    let (v1, v2) = (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory.max",
    );
    inside(kubectl, pod, container, v1, v2).await
}

/// The CFS quota a container sees on its own cgroup (v2's `cpu.max` without its period).
async fn quota_inside(kubectl: &Kubectl, pod: &str, container: &str) -> String {
    let (v1, v2) = (
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        "/sys/fs/cgroup/cpu.max",
    );
    let text = inside(kubectl, pod, container, v1, v2).await;
    text.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Waits until the pod's `kind` condition has `reason`; its message.
async fn condition_with_reason(kubectl: &Kubectl, pod: &str, kind: &str, reason: &str) -> String {
    eventually(&format!("{kind} {reason}"), DEADLINE, || async {
        let got = condition(kubectl, pod, kind, "reason").await;
        let message = condition(kubectl, pod, kind, "message").await;
        match got == reason {
            true => Ok(message),
            false => Err(format!("reason {got:?}, message {message:?}")),
        }
    })
    .await
}

async fn condition(kubectl: &Kubectl, pod: &str, kind: &str, field: &str) -> String {
    let path = format!("{{.status.conditions[?(@.type==\"{kind}\")].{field}}}");
    kubectl.jsonpath(pod, &path).await.unwrap_or_default()
}

fn container_field(name: &str, field: &str) -> String {
    format!("{{.status.containerStatuses[?(@.name==\"{name}\")].{field}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_resize_changes_limits_in_place_and_restarts_only_where_the_policy_says() {
    let Some((_server, mut node, kubectl)) =
        resize_cluster("kubectl resize", "kubectl-resize").await
    else {
        return;
    };
    let pod = "resized";
    let resources = "    resources:\n      requests: {cpu: 100m, memory: 32Mi}\n      limits: {cpu: 200m, memory: 64Mi}\n";
    kubectl
        .create(&pod_yaml(
            pod,
            &node.name,
            &format!(
                "  containers:\n  - name: app\n    image: busybox:1.36\n    command: [\"sleep\", \"3601\"]\n{resources}  - name: db\n    image: busybox:1.36\n    command: [\"sleep\", \"3602\"]\n    resizePolicy:\n    - resourceName: memory\n      restartPolicy: RestartContainer\n{resources}"
            ),
        ))
        .await;
    kubectl.wait_running(pod).await;
    let uid = kubectl.jsonpath(pod, "{.metadata.uid}").await.unwrap();
    let app_id = kubectl
        .jsonpath(pod, &container_field("app", "containerID"))
        .await
        .unwrap();
    let db_id = kubectl
        .jsonpath(pod, &container_field("db", "containerID"))
        .await
        .unwrap();
    assert_eq!(
        memory_inside(&kubectl, pod, "app").await,
        (64 * MI).to_string()
    );

    // The resize: more cpu and memory for app (NotRequired: in place), more memory for db
    // (RestartContainer for memory).
    let patch = r#"{"spec":{"containers":[
        {"name":"app","resources":{"requests":{"cpu":"150m","memory":"48Mi"},"limits":{"cpu":"300m","memory":"96Mi"}}},
        {"name":"db","resources":{"requests":{"cpu":"100m","memory":"32Mi"},"limits":{"cpu":"200m","memory":"80Mi"}}}]}}"#;
    kubectl
        .ok(&["patch", "pod", pod, "--subresource=resize", "-p", patch])
        .await;
    assert_eq!(
        kubectl
            .jsonpath(pod, "{.metadata.generation}")
            .await
            .unwrap(),
        "2"
    );
    eventually("the resize carried out", DEADLINE, || async {
        let app_limit = kubectl
            .jsonpath(pod, &container_field("app", "resources.limits.memory"))
            .await?;
        let db_restarts = kubectl
            .jsonpath(pod, &container_field("db", "restartCount"))
            .await?;
        let in_progress = condition(&kubectl, pod, "PodResizeInProgress", "status").await;
        match (
            app_limit.as_str(),
            db_restarts.as_str(),
            in_progress.as_str(),
        ) {
            ("96Mi", "1", "") => Ok(()),
            _ => Err(format!(
                "app limit {app_limit:?}, db restarts {db_restarts:?}, in progress {in_progress:?}"
            )),
        }
    })
    .await;
    kubectl.wait_running(pod).await;
    // app: the same container, never restarted, with the new limits in its cgroup.
    let field = |c: &'static str, f: &'static str| {
        let kubectl = &kubectl;
        async move { kubectl.jsonpath(pod, &container_field(c, f)).await.unwrap() }
    };
    assert_eq!(
        field("app", "containerID").await,
        app_id,
        "app kept its container"
    );
    assert_eq!(field("app", "restartCount").await, "0");
    assert_ne!(field("db", "containerID").await, db_id, "db was restarted");
    assert_eq!(field("app", "resources.limits.cpu").await, "300m");
    assert_eq!(field("app", "resources.requests.cpu").await, "150m");
    assert_eq!(field("app", "allocatedResources.memory").await, "48Mi");
    assert_eq!(field("db", "resources.limits.memory").await, "80Mi");
    assert_eq!(
        memory_inside(&kubectl, pod, "app").await,
        (96 * MI).to_string()
    );
    assert_eq!(quota_inside(&kubectl, pod, "app").await, "30000");
    assert_eq!(
        memory_inside(&kubectl, pod, "db").await,
        (80 * MI).to_string()
    );
    // The events a 1.36 kubelet shows in `kubectl describe` for a resize: ResizeStarted
    // and ResizeCompleted, each with the pod as allocated and its generation.
    let details = r#"{"containers":[{"name":"app","resources":{"limits":{"cpu":"300m","memory":"96Mi"},"requests":{"cpu":"150m","memory":"48Mi"}}},{"name":"db","resources":{"limits":{"cpu":"200m","memory":"80Mi"},"requests":{"cpu":"100m","memory":"32Mi"}}}],"generation":2}"#;
    eventually("the resize events", DEADLINE, || async {
        let events = pod_events(&kubectl, pod).await;
        let has = |line: String| events.lines().any(|l| l == line);
        if has(format!(
            "Normal ResizeStarted Pod resize started: {details}"
        )) && has(format!(
            "Normal ResizeCompleted Pod resize completed: {details}"
        )) {
            Ok(())
        } else {
            Err(events)
        }
    })
    .await;
    // The pod cgroup holds both: 96 + 80 MiB.
    let pod_cgroup = format!("kubepods/burstable/pod{uid}");
    assert_eq!(
        cgroup::memory_limit(&pod_cgroup),
        Ok(Some(176 * MI)),
        "{pod_cgroup}"
    );
    assert_eq!(
        cgroup::cpu_quota(&pod_cgroup),
        Ok(Some(50_000)),
        "{pod_cgroup}"
    );

    // Beyond the node: Infeasible, in the allocation manager's words (the pod's requests:
    // 1000 CPUs for app and 100m for db), and nothing changes.
    let too_much = r#"{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"1000"},"limits":{"cpu":"1000"}}}]}}"#;
    kubectl
        .ok(&["patch", "pod", pod, "--subresource=resize", "-p", too_much])
        .await;
    let pending = condition_with_reason(&kubectl, pod, "PodResizePending", "Infeasible").await;
    assert!(
        pending
            .starts_with("Node didn't have enough capacity: cpu, requested: 1000100, capacity: "),
        "{pending}"
    );
    assert_eq!(
        condition(&kubectl, pod, "PodResizePending", "observedGeneration").await,
        kubectl
            .jsonpath(pod, "{.metadata.generation}")
            .await
            .unwrap()
    );
    assert_eq!(field("app", "allocatedResources.cpu").await, "150m");

    // pod-sync killed and started again: the pending resize is not taken as allocated, no
    // container changes, the pod stays Running and ready.
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    let app_id = field("app", "containerID").await;
    let db_id = field("db", "containerID").await;
    consistently(
        "the pod untouched by a pod-sync restart",
        RESTART_WINDOW,
        Duration::from_millis(500),
        || async {
            let ids = (
                kubectl
                    .jsonpath(pod, &container_field("app", "containerID"))
                    .await?,
                kubectl
                    .jsonpath(pod, &container_field("db", "containerID"))
                    .await?,
            );
            let ready = condition(&kubectl, pod, "Ready", "status").await;
            let phase = kubectl.jsonpath(pod, "{.status.phase}").await?;
            let allocated = kubectl
                .jsonpath(pod, &container_field("app", "allocatedResources.cpu"))
                .await?;
            match (
                ids == (app_id.clone(), db_id.clone()),
                ready.as_str(),
                phase.as_str(),
                allocated.as_str(),
            ) {
                (true, "True", "Running", "150m") => Ok(()),
                _ => Err(format!(
                    "ids {ids:?}, ready {ready:?}, phase {phase:?}, allocated cpu {allocated:?}"
                )),
            }
        },
    )
    .await;
    eventually("still Infeasible after the restart", DEADLINE, || async {
        match condition(&kubectl, pod, "PodResizePending", "reason")
            .await
            .as_str()
        {
            "Infeasible" => Ok(()),
            other => Err(other.to_string()),
        }
    })
    .await;
    assert_eq!(quota_inside(&kubectl, pod, "app").await, "30000");

    // kube-apiserver's refusal of a QoS change (Burstable to Guaranteed).
    let guaranteed = r#"{"spec":{"containers":[
        {"name":"app","resources":{"requests":{"cpu":"300m","memory":"96Mi"},"limits":{"cpu":"300m","memory":"96Mi"}}},
        {"name":"db","resources":{"requests":{"cpu":"200m","memory":"80Mi"},"limits":{"cpu":"200m","memory":"80Mi"}}}]}}"#;
    let refused = kubectl
        .try_ok(&[
            "patch",
            "pod",
            pod,
            "--subresource=resize",
            "-p",
            guaranteed,
        ])
        .await
        .unwrap_err();
    assert!(
        refused.contains("Pod QOS Class may not change as a result of resizing"),
        "{refused}"
    );
    node.stop().await;
}

/// A node and its API server for a test of deferred resizes, with kubectl and the node's
/// allocatable cpu (millicores) as kubectl shows it; None where the test cannot run here
/// (it says why).
/// The test API server, a node and kubectl, where this machine can run a resize test
/// (the runtime, kubectl, and a kubectl that takes `--subresource=resize`).
async fn resize_cluster(what: &str, name: &str) -> Option<(ApiServer, Node, Kubectl)> {
    if !require_runtime(what) || require_kubectl(what).is_none() {
        return None;
    }
    if !kubectl_at_least(
        RESIZE_SUBRESOURCE,
        "kubectl patch takes --subresource=resize",
    ) {
        return None;
    }
    Some(cluster(name).await)
}

async fn deferrable_cluster(what: &str, name: &str) -> Option<(ApiServer, Node, Kubectl, i64)> {
    let (server, node, kubectl) = resize_cluster(what, name).await?;
    let allocatable = kubectl
        .ok(&[
            "get",
            "node",
            &node.name,
            "-o",
            "jsonpath={.status.allocatable.cpu}",
        ])
        .await;
    let allocatable: i64 = match allocatable.trim().strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => allocatable.trim().parse::<i64>().unwrap() * 1000,
    };
    Some((server, node, kubectl, allocatable))
}

/// A resize that does not fit beside another pod waits (`PodResizePending`, `Deferred`,
/// the scheduler predicate's words as upstream's allocation manager gives them) and is
/// admitted once that pod goes (pod-sync tries a deferred resize again when a pod leaves,
/// at every resync and every 30 s; this test does not tell which of them admitted it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_resize_deferred_until_another_pod_goes() {
    let Some((_server, node, kubectl, allocatable)) =
        deferrable_cluster("kubectl resize deferred", "kubectl-resize-deferred").await
    else {
        return;
    };
    let big = allocatable - 600;
    let spec = |cpu: i64| {
        format!(
            "  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n    resources:\n      requests: {{cpu: {cpu}m}}\n"
        )
    };
    kubectl
        .create(&pod_yaml("big", &node.name, &spec(big)))
        .await;
    kubectl
        .create(&pod_yaml("small", &node.name, &spec(100)))
        .await;
    kubectl.wait_running("big").await;
    kubectl.wait_running("small").await;
    let patch = r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"800m"}}}]}}"#;
    kubectl
        .ok(&["patch", "pod", "small", "--subresource=resize", "-p", patch])
        .await;
    let message = condition_with_reason(&kubectl, "small", "PodResizePending", "Deferred").await;
    assert_eq!(
        message,
        format!(
            "Node didn't have enough resource: cpu, requested: 800, used: {big}, capacity: {allocatable}"
        )
    );
    assert_eq!(
        kubectl
            .jsonpath("small", &container_field("c", "allocatedResources.cpu"))
            .await
            .unwrap(),
        "100m"
    );
    // upstream's ResizeDeferred event (allocation_manager.go handlePodResourcesResize,
    // events/resize.go PodResizePendingMsg): the resources asked for, the generation and
    // the condition's message as `error`; posted once, however often the pod syncs.
    let deferred_event = format!(
        r#"Warning ResizeDeferred Pod resize Deferred: {{"containers":[{{"name":"c","resources":{{"requests":{{"cpu":"800m"}}}}}}],"generation":2,"error":"{message}"}}"#
    );
    eventually("the ResizeDeferred event", DEADLINE, || async {
        let events = pod_events(&kubectl, "small").await;
        events
            .lines()
            .any(|l| l == deferred_event)
            .then_some(())
            .ok_or(events)
    })
    .await;
    // upstream's resize metrics (pkg/kubelet/metrics, kubernetes#132903), as a dashboard
    // reads them from /metrics.
    for line in [
        r#"kubelet_pod_pending_resizes{reason="deferred"} 1"#,
        "kubelet_pod_in_progress_resizes 0",
        r#"kubelet_container_requested_resizes_total{operation="increase",requirement="requests",resource="cpu"} 1"#,
    ] {
        metric_line(&node, line).await;
    }
    kubectl.ok(&["delete", "pod", "big", "--wait=false"]).await;
    eventually("the deferred resize admitted", DEADLINE, || async {
        let allocated = kubectl
            .jsonpath("small", &container_field("c", "allocatedResources.cpu"))
            .await?;
        let pending = condition(&kubectl, "small", "PodResizePending", "reason").await;
        match (allocated.as_str(), pending.as_str()) {
            ("800m", "") => Ok(()),
            _ => Err(format!("allocated {allocated:?}, pending {pending:?}")),
        }
    })
    .await;
    assert_eq!(
        kubectl
            .jsonpath("small", &container_field("c", "restartCount"))
            .await
            .unwrap(),
        "0"
    );
    // Admitted after its deferral (by the pod leaving, or by the timer: this test does not
    // tell which), carried out in place once, and no longer pending.
    let accepted = eventually(
        "kubelet_pod_deferred_accepted_resizes_total",
        DEADLINE,
        || async {
            let body = node.api.get("/metrics").await?.text();
            let counted: Vec<&str> = body
                .lines()
                .filter(|l| l.starts_with("kubelet_pod_deferred_accepted_resizes_total{"))
                .collect();
            match counted.as_slice() {
                [one] if one.ends_with(" 1") => Ok(one.to_string()),
                _ => Err(format!("{counted:?}")),
            }
        },
    )
    .await;
    assert!(
        accepted.contains(r#"retry_trigger="pods_removed""#)
            || accepted.contains(r#"retry_trigger="periodic_retry""#),
        "{accepted}"
    );
    metric_line(
        &node,
        r#"kubelet_pod_resize_duration_milliseconds_count{success="true"} 1"#,
    )
    .await;
    let body = node.api.get("/metrics").await.unwrap().text();
    assert!(
        !body.contains("kubelet_pod_pending_resizes{"),
        "no resize is pending any more: {body}"
    );
    let events = pod_events(&kubectl, "small").await;
    assert_eq!(
        events
            .lines()
            .filter(|l| l.contains(" ResizeDeferred "))
            .count(),
        1,
        "{events}"
    );
}

/// The pod's events as `type reason message` lines.
async fn pod_events(kubectl: &Kubectl, pod: &str) -> String {
    kubectl
        .ok(&[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod}"),
            "-o",
            "jsonpath={range .items[*]}{.type} {.reason} {.message}{\"\\n\"}{end}",
        ])
        .await
}

/// Waits until `/metrics` serves `line` as it is.
async fn metric_line(node: &Node, line: &str) {
    let family = line.split(['{', ' ']).next().unwrap_or_default();
    eventually(&format!("{line} in /metrics"), DEADLINE, || async {
        let body = node.api.get("/metrics").await?.text();
        body.lines()
            .any(|l| l == line)
            .then_some(())
            .ok_or_else(|| {
                body.lines()
                    .filter(|l| l.starts_with(family))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
    })
    .await;
}

/// Two deferred resizes and room for one when a pod leaves: the one of higher priority is
/// admitted and the other stays Deferred, as upstream's `sortPendingResizes` orders them
/// (allocation_manager_test.go `TestSortPendingResizes`: priority before the time waited).
/// The lower-priority pod asked first, so that waiting longer does not decide it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_deferred_resizes_go_by_priority_when_room_frees() {
    let Some((_server, node, kubectl, allocatable)) =
        deferrable_cluster("kubectl resize priority", "kubectl-resize-priority").await
    else {
        return;
    };
    // stay + big + 100m + 600m is 200m too many for either resize; once big goes, one
    // of them fits (300m to spare) and both do not (200m short).
    let spec = |cpu: i64, priority: i32| {
        format!(
            "  priority: {priority}\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n    resources:\n      requests: {{cpu: {cpu}m}}\n"
        )
    };
    for (name, cpu, priority) in [
        ("stay", allocatable - 1000, 0),
        ("big", 500, 0),
        ("low", 100, 0),
        ("high", 100, 1000),
    ] {
        kubectl
            .create(&pod_yaml(name, &node.name, &spec(cpu, priority)))
            .await;
    }
    for name in ["stay", "big", "low", "high"] {
        kubectl.wait_running(name).await;
    }
    let patch = r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"600m"}}}]}}"#;
    for name in ["low", "high"] {
        kubectl
            .ok(&["patch", "pod", name, "--subresource=resize", "-p", patch])
            .await;
        condition_with_reason(&kubectl, name, "PodResizePending", "Deferred").await;
    }
    kubectl.ok(&["delete", "pod", "big", "--wait=false"]).await;
    eventually("the high-priority resize admitted", DEADLINE, || async {
        let allocated = kubectl
            .jsonpath("high", &container_field("c", "allocatedResources.cpu"))
            .await?;
        match allocated.as_str() {
            "600m" => Ok(()),
            _ => Err(format!("allocated {allocated:?}")),
        }
    })
    .await;
    let low = |field: &'static str| {
        let kubectl = &kubectl;
        async move { condition(kubectl, "low", "PodResizePending", field).await }
    };
    assert_eq!(low("reason").await, "Deferred");
    assert_eq!(
        kubectl
            .jsonpath("low", &container_field("c", "allocatedResources.cpu"))
            .await
            .unwrap(),
        "100m"
    );
}

/// A memory limit below what the pod and its container use now is refused, as upstream's
/// `doPodResizeAction` refuses it, in a 1.35 kubelet's words (its
/// `PodResizeInProgress` condition, quoted from a real cluster: "cannot decrease memory
/// limits: [attempting to set pod memory limit (134217728) below current usage
/// (319180800), attempting to set container \"probe\" memory limit (134217728) below
/// current usage (319180800)]", and its `ResizeError` event, "Pod resize error: " with the
/// allocated pod and that error). The container runs on with its old limit; once it uses
/// less, the retried resize goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_resize_below_memory_use_is_refused_as_upstream() {
    let Some((_server, node, kubectl)) =
        resize_cluster("kubectl resize below use", "kubectl-resize-below-use").await
    else {
        return;
    };
    let pod = "filled";
    // 40 MiB in /dev/shm (tmpfs: charged to the container's memory cgroup).
    let spec = "  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 && touch /tmp/filled && sleep 3600\"]\n    resources:\n      requests: {memory: 32Mi}\n      limits: {memory: 64Mi}\n";
    kubectl.create(&pod_yaml(pod, &node.name, spec)).await;
    kubectl.wait_running(pod).await;
    eventually("40 MiB written", DEADLINE, || async {
        kubectl
            .try_ok(&["exec", pod, "-c", "c", "--", "test", "-e", "/tmp/filled"])
            .await
    })
    .await;
    let id = kubectl
        .jsonpath(pod, &container_field("c", "containerID"))
        .await
        .unwrap();
    let patch = r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"memory":"16Mi"},"limits":{"memory":"32Mi"}}}]}}"#;
    kubectl
        .ok(&["patch", "pod", pod, "--subresource=resize", "-p", patch])
        .await;
    let limit = 32 * MI;
    let message = condition_with_reason(&kubectl, pod, "PodResizeInProgress", "Error").await;
    let pod_part = format!(
        "cannot decrease memory limits: [attempting to set pod memory limit ({limit}) below current usage ("
    );
    let container_part =
        format!(", attempting to set container \"c\" memory limit ({limit}) below current usage (");
    assert!(
        message.starts_with(&pod_part)
            && message.contains(&container_part)
            && message.ends_with(")]"),
        "{message}"
    );
    let error_event = format!(
        r#"Warning ResizeError Pod resize error: {{"containers":[{{"name":"c","resources":{{"limits":{{"memory":"32Mi"}},"requests":{{"memory":"16Mi"}}}}}}],"generation":2,"error":"{}"#,
        pod_part.replace('"', "\\\"")
    );
    eventually("the ResizeError event", DEADLINE, || async {
        let events = pod_events(&kubectl, pod).await;
        events
            .lines()
            .any(|l| l.starts_with(&error_event))
            .then_some(())
            .ok_or(events)
    })
    .await;
    // Refused, not half done: the same container, its old limit.
    assert_eq!(
        memory_inside(&kubectl, pod, "c").await,
        (64 * MI).to_string()
    );
    assert_eq!(
        kubectl
            .jsonpath(pod, &container_field("c", "containerID"))
            .await
            .unwrap(),
        id
    );
    // Once the container uses less, the resize is tried again and carried out in place.
    kubectl
        .ok(&["exec", pod, "-c", "c", "--", "rm", "/dev/shm/fill"])
        .await;
    eventually("the resize carried out", DEADLINE, || async {
        let inside = memory_inside(&kubectl, pod, "c").await;
        let progress = condition(&kubectl, pod, "PodResizeInProgress", "reason").await;
        match (inside == limit.to_string(), progress.as_str()) {
            (true, "") => Ok(()),
            _ => Err(format!("limit {inside}, in progress {progress:?}")),
        }
    })
    .await;
    assert_eq!(
        kubectl
            .jsonpath(pod, &container_field("c", "containerID"))
            .await
            .unwrap(),
        id
    );
}
