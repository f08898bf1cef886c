//! `kubectl debug` (ephemeral containers, issue 28), judged by what kubectl and `/pods`
//! show. Oracles: kubectl's own `debug` command (it PATCHes `pods/{name}/ephemeralcontainers`
//! with a strategic merge patch), upstream's `--target` semantics (the container shares
//! the target's PID namespace: `NamespaceMode_TARGET`), upstream's
//! `TestComputePodActionsWithInitAndEphemeralContainers` ("Ephemeral container exited; do
//! not restart") and `generateAPIPodStatus` (ephemeral containers count for neither phase
//! nor readiness; their statuses are never ready).

use super::*;
use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_proto::cri::RemoveContainerRequest;
use nodeagent_tests::consistently;

/// The kubectl minor version from which `debug` sends a Pod (not the `EphemeralContainers`
/// kind of 1.22 and before) and `patch` has `--subresource`.
const POD_KIND_DEBUG: u32 = 24;

/// How long a second start of the finished ephemeral container is given to show.
const NO_RESTART_WINDOW: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_debug_runs_an_ephemeral_container_once_among_its_targets_processes() {
    if !require_runtime("kubectl debug") || require_kubectl("kubectl debug").is_none() {
        return;
    }
    if !kubectl_at_least(
        POD_KIND_DEBUG,
        "kubectl debug patches a Pod on pods/ephemeralcontainers, and patch takes --subresource,",
    ) {
        return;
    }
    let (_server, mut node, kubectl) = cluster("kubectl-debug").await;
    let pod = "debugged";
    kubectl
        .create(&pod_yaml(
            pod,
            &node.name,
            "  containers:\n  - name: app\n    image: busybox:1.36\n    command: [\"sleep\", \"3601\"]\n",
        ))
        .await;
    kubectl.wait_running(pod).await;

    // No `-i`: kubectl adds the container and returns.
    kubectl
        .ok(&[
            "debug",
            pod,
            "--image=busybox:1.36",
            "--image-pull-policy=IfNotPresent",
            "-c",
            "debugger",
            "--target=app",
            "--",
            "ps",
        ])
        .await;
    // In the target's PID namespace, `ps` lists the app's `sleep 3601` (in a namespace of
    // its own it would list only itself).
    eventually("the debugger's ps output", DEADLINE, || async {
        let reason = kubectl
            .jsonpath(
                pod,
                "{.status.ephemeralContainerStatuses[0].state.terminated.reason}",
            )
            .await?;
        let logs = kubectl.try_ok(&["logs", pod, "-c", "debugger"]).await?;
        match (reason.as_str(), logs.contains("sleep 3601")) {
            ("Completed", true) => Ok(()),
            _ => Err(format!("terminated reason {reason:?}, logs {logs:?}")),
        }
    })
    .await;
    // The pod itself is untouched: Running, 1/1 ready, the app never restarted.
    kubectl.wait_running(pod).await;
    assert_eq!(
        kubectl
            .jsonpath(pod, "{.status.containerStatuses[0].restartCount}")
            .await
            .unwrap(),
        "0"
    );
    // The node's own view says the same, as upstream's status does: the ephemeral
    // container's status is never ready and has no `started`.
    let on_node = eventually("the ephemeral status in /pods", DEADLINE, || async {
        let pods = node.pods().await?;
        let p = pods
            .iter()
            .find(|p| p["metadata"]["name"] == pod)
            .ok_or("not listed")?;
        let s = &p["status"]["ephemeralContainerStatuses"][0];
        match s["state"]["terminated"]["reason"].as_str() {
            Some("Completed") => Ok(p.clone()),
            _ => Err(p["status"].to_string()),
        }
    })
    .await;
    let status = &on_node["status"];
    assert_eq!(status["phase"], "Running", "{status}");
    let debugger = &status["ephemeralContainerStatuses"][0];
    assert_eq!(debugger["name"], "debugger");
    assert_eq!(debugger["ready"], false, "{debugger}");
    assert!(debugger.get("started").is_none(), "{debugger}");
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "True", "{status}");

    // `kubectl debug -i`, as a user types it (without a terminal): kubectl waits for the
    // ephemeral container to run and attaches to it; a line typed runs among the app's
    // processes, and `exit` ends the container and kubectl.
    let mut debug = kubectl
        .command(&[
            "debug",
            "-i",
            pod,
            "--image=busybox:1.36",
            "--image-pull-policy=IfNotPresent",
            "-c",
            "shell",
            "--target=app",
            "--",
            "sh",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .expect("kubectl debug -i");
    let mut typed = debug.stdin.take().expect("stdin");
    let mut lines = stdout_lines(&mut debug);
    typed.write_all(b"ps\n").await.expect("type ps");
    read_until(&mut lines, "sleep 3601").await.unwrap();
    typed.write_all(b"exit\n").await.expect("type exit");
    drop(typed);
    let ended = tokio::time::timeout(COMMAND_TIMEOUT, debug.wait())
        .await
        .expect("kubectl debug -i ends when its container does")
        .expect("kubectl debug -i");
    assert!(ended.success(), "kubectl debug -i: {ended:?}");

    // Its dead container goes (as `crictl rm` or a container GC would), and pod-sync is
    // killed and started again: upstream would run the command a second time; here the
    // status it published says it ran, and it never runs again.
    let full = |c: &nodeagent_proto::cri::Container| {
        c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(pod)
            && c.metadata.as_ref().is_some_and(|m| m.name == "debugger")
    };
    let cri = node.cri.clone();
    let debuggers = || async {
        let all = cri.list_containers(None).await.expect("ListContainers");
        all.into_iter()
            .filter(full)
            .map(|c| c.id)
            .collect::<Vec<_>>()
    };
    let dead = debuggers().await;
    assert_eq!(dead.len(), 1, "one debugger container: {dead:?}");
    let mut rt = cri.runtime.clone();
    rt.remove_container(RemoveContainerRequest {
        container_id: dead[0].clone(),
    })
    .await
    .expect("RemoveContainer");
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    consistently(
        "the ephemeral container not started again",
        NO_RESTART_WINDOW,
        Duration::from_millis(500),
        || async {
            let again = debuggers().await;
            let reason = kubectl
                .jsonpath(
                    pod,
                    "{.status.ephemeralContainerStatuses[0].state.terminated.reason}",
                )
                .await?;
            match (again.is_empty(), reason.as_str()) {
                (true, "Completed") => Ok(()),
                _ => Err(format!(
                    "containers {again:?}, terminated reason {reason:?}"
                )),
            }
        },
    )
    .await;
    kubectl.wait_running(pod).await;

    // What upstream's API server refuses, this one does too: a changed or removed
    // ephemeral container, and a pod created with one.
    let patch = r#"{"spec":{"ephemeralContainers":[{"name":"debugger","image":"busybox:1.36","command":["true"]}]}}"#;
    let refused = kubectl
        .try_ok(&[
            "patch",
            "pod",
            pod,
            "--subresource=ephemeralcontainers",
            "--type=strategic",
            "-p",
            patch,
        ])
        .await
        .unwrap_err();
    // kubectl prints the causes of kube-apiserver's 422 after the message.
    assert!(
        refused.contains("The Pod \"debugged\" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debugger\" may not be changed"),
        "{refused}"
    );
    node.stop().await;
}
