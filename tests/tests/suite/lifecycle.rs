//! Pod lifecycle to the upstream kubelet's semantics, against the real containerd:
//! restart policy and crash-loop back-off, image and runtime errors, init containers and
//! sidecars, preStop and the grace period, env expansion and the downward API,
//! activeDeadlineSeconds, and --runonce. pod-sync and pleg are killed along the way to
//! show that a restart never restarts a container the spec did not ask to restart.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{
    Node, NodeOptions, binary, consistently, container_status, eventually, is_running,
    require_runtime,
};
use serde_json::Value;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(90);

fn waiting_reason(pod: &Value, name: &str) -> String {
    container_status(pod, name)
        .and_then(|c| c["state"]["waiting"]["reason"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn restart_count(pod: &Value, name: &str) -> i64 {
    container_status(pod, name)
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(-1)
}

/// A hostPath the test can read after the pod is gone.
fn out_dir(node: &Node) -> String {
    let dir = node.path("out");
    std::fs::create_dir_all(&dir).unwrap();
    dir.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_container_enters_crash_loop_back_off_with_growing_delays() {
    if !require_runtime("crash loop back-off") {
        return;
    }
    let mut node = Node::start("crashloop", NodeOptions::default()).await;
    node.write_manifest(
        "crash.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: crash\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: fail\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"exit 1\"]\n",
    );
    // Record when each restart count is first seen.
    let mut seen: Vec<(i64, Instant)> = Vec::new();
    let mut saw_backoff_message = String::new();
    let mut killed_pod_sync = false;
    let started = Instant::now();
    while seen.last().map(|s| s.0).unwrap_or(-1) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "restarts seen: {seen:?}"
        );
        if let Ok(pod) = node.pod("crash").await {
            let n = restart_count(&pod, "fail");
            if n >= 0 && seen.last().is_none_or(|s| s.0 < n) {
                seen.push((n, Instant::now()));
            }
            if waiting_reason(&pod, "fail") == "CrashLoopBackOff" {
                let c = container_status(&pod, "fail").unwrap();
                saw_backoff_message = c["state"]["waiting"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                assert_eq!(c["lastState"]["terminated"]["exitCode"], 1, "{c}");
                assert_eq!(
                    pod["status"]["phase"], "Running",
                    "Always restarts: the pod stays Running"
                );
            }
            // In the middle of the second back-off, kill pod-sync: the restart that
            // follows must still wait out the back-off, not happen at once.
            if n == 2 && !killed_pod_sync {
                node.signal(Service::PodSync, Signal::SIGKILL).await;
                node.spawn(Service::PodSync);
                killed_pod_sync = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        saw_backoff_message.starts_with("back-off "),
        "{saw_backoff_message:?}"
    );
    assert!(
        saw_backoff_message.contains("restarting failed container=fail"),
        "{saw_backoff_message}"
    );
    let at = |n: i64| {
        seen.iter()
            .find(|s| s.0 == n)
            .map(|s| s.1)
            .unwrap_or_else(|| panic!("restart {n} not seen: {seen:?}"))
    };
    let first_gap = at(2) - at(1);
    let second_gap = at(3) - at(2);
    // Upstream: 10 s, then 20 s (each measured from the container's exit).
    assert!(
        first_gap >= Duration::from_secs(8),
        "first back-off {first_gap:?}"
    );
    assert!(
        second_gap >= Duration::from_secs(17),
        "second back-off {second_gap:?} (pod-sync was killed in it)"
    );
    assert!(second_gap > first_gap, "{first_gap:?} then {second_gap:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_and_runtime_errors_are_reported_with_upstream_reasons() {
    if !require_runtime("image and runtime errors") {
        return;
    }
    let node = Node::start("errors", NodeOptions::default()).await;
    // Never pull an image that is not there.
    node.write_manifest(
        "never.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: never\nspec:\n  containers:\n  - name: c\n    image: nodeagent.test/absent:1.0\n    imagePullPolicy: Never\n",
    );
    // Pull from a registry that is not reachable (localhost:1 refuses at once).
    node.write_manifest(
        "pull.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pull\nspec:\n  containers:\n  - name: c\n    image: localhost:1/absent:1.0\n    imagePullPolicy: IfNotPresent\n",
    );
    // A command that does not exist.
    node.write_manifest(
        "nocmd.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: nocmd\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"/no/such/binary\"]\n",
    );
    let never = eventually("ErrImageNeverPull", DEADLINE, || async {
        let pod = node.pod("never").await?;
        match waiting_reason(&pod, "c").as_str() {
            "ErrImageNeverPull" => Ok(pod),
            other => Err(other.to_string()),
        }
    })
    .await;
    let msg = container_status(&never, "c").unwrap()["state"]["waiting"]["message"].clone();
    assert_eq!(
        msg,
        "Container image \"nodeagent.test/absent:1.0\" is not present with pull policy of Never"
    );
    assert_eq!(never["status"]["phase"], "Pending");

    let backoff = eventually("ImagePullBackOff", DEADLINE, || async {
        let pod = node.pod("pull").await?;
        match waiting_reason(&pod, "c").as_str() {
            "ImagePullBackOff" => Ok(pod),
            other => Err(other.to_string()),
        }
    })
    .await;
    let msg = &container_status(&backoff, "c").unwrap()["state"]["waiting"]["message"];
    // With the failed pull's error, as upstream shows it during the back-off.
    let msg = msg.as_str().unwrap_or_default();
    assert!(
        msg.starts_with("Back-off pulling image \"localhost:1/absent:1.0\": ErrImagePull: ")
            && msg.contains("connection refused"),
        "{msg}"
    );
    // The failed pull itself was reported as ErrImagePull with the runtime's whole error
    // (upstream's evalCRIPullErr: `err.Error()`, which names the image).
    let log = node.log(Service::PodSync);
    assert!(
        log.lines().any(|l| l.contains("ErrImagePull")
            && l.contains("localhost:1/absent:1.0")
            && l.contains("connection refused")),
        "{log}"
    );

    // Termination messages: the file at terminationMessagePath, or with
    // FallbackToLogsOnError and an empty file, the tail of the log.
    node.write_manifest(
        "messages.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: messages\nspec:\n  restartPolicy: Never\n  containers:\n  - name: file\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"echo -n 'disk full' > /dev/termination-log; exit 2\"]\n  - name: logs\n    image: busybox:1.36\n    terminationMessagePolicy: FallbackToLogsOnError\n    command: [\"sh\", \"-c\", \"echo starting; echo 'fatal: no config'; exit 3\"]\n",
    );
    let messages = eventually("both containers terminated", DEADLINE, || async {
        let pod = node.pod("messages").await?;
        let done = ["file", "logs"].iter().all(|n| {
            container_status(&pod, n).is_some_and(|c| c["state"]["terminated"].is_object())
        });
        if done && pod["status"]["phase"] == "Failed" {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let terminated =
        |n: &str| container_status(&messages, n).unwrap()["state"]["terminated"].clone();
    assert_eq!(terminated("file")["exitCode"], 2);
    assert_eq!(terminated("file")["message"], "disk full");
    assert_eq!(terminated("logs")["exitCode"], 3);
    assert_eq!(terminated("logs")["message"], "starting\nfatal: no config");
    // Four containers with 4 KiB messages each: the pod's 12 KiB are shared evenly, 3 KiB
    // each (upstream's status manager `normalizeStatus`, its
    // `TestStatusNormalizationEnforcesMaxBytes`), not everything to the first three.
    let four: String = (0..4)
        .map(|i| format!("  - name: c{i}\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"printf '%5000s' '' | tr ' ' x > /dev/termination-log; exit 1\"]\n"))
        .collect();
    node.write_manifest(
        "long-messages.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: long-messages\nspec:\n  restartPolicy: Never\n  containers:\n{four}"),
    );
    let long = eventually("the four containers terminated", DEADLINE, || async {
        let pod = node.pod("long-messages").await?;
        let done = (0..4).all(|i| {
            container_status(&pod, &format!("c{i}"))
                .is_some_and(|c| c["state"]["terminated"].is_object())
        });
        if done && pod["status"]["phase"] == "Failed" {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    for i in 0..4 {
        let message =
            container_status(&long, &format!("c{i}")).unwrap()["state"]["terminated"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        assert_eq!(message, "x".repeat(3072), "c{i}");
    }
    // A finished pod's sandbox is stopped (its network released); the pod keeps its IP
    // in the status, as upstream.
    let messages_pod = node.pod_name("messages");
    eventually("the finished pod's sandbox stopped", DEADLINE, || async {
        let sandboxes = node.sandboxes().await;
        let s = sandboxes
            .iter()
            .find(|s| s.metadata.as_ref().is_some_and(|m| m.name == messages_pod))
            .ok_or("no sandbox")?;
        if s.state == 1 {
            Ok(())
        } else {
            Err(format!("state {}", s.state))
        }
    })
    .await;
    assert!(node.pod("messages").await.unwrap()["status"]["podIP"].is_string());

    let nocmd = eventually("the missing command reported", DEADLINE, || async {
        let pod = node.pod("nocmd").await?;
        let c = container_status(&pod, "c").ok_or("no status")?.clone();
        let waiting = c["state"]["waiting"]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let terminated = c["state"]["terminated"].is_object();
        if waiting == "RunContainerError" || waiting == "CreateContainerError" || terminated {
            Ok(c)
        } else {
            Err(c.to_string())
        }
    })
    .await;
    let text = nocmd.to_string();
    assert!(
        text.contains("/no/such/binary"),
        "the runtime's message names the command: {text}"
    );
    // Nothing was created for the images that are not there.
    let containers = node.containers().await;
    let created = [
        node.pod_name("nocmd"),
        node.pod_name("messages"),
        node.pod_name("long-messages"),
    ];
    assert!(
        containers
            .iter()
            .all(|c| created.contains(&c.labels["io.kubernetes.pod.name"])),
        "{containers:?}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_with_a_new_sandbox_does_not_rerun_a_succeeded_container() {
    if !require_runtime("OnFailure and a new sandbox") {
        return;
    }
    let node = Node::start("onfailure-sandbox", NodeOptions::default()).await;
    node.write_manifest(
        "job.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: job\nspec:\n  restartPolicy: OnFailure\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: done\n    image: busybox:1.36\n    command: [\"true\"]\n  - name: long\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 0.2; done\"]\n",
    );
    eventually("done succeeded, long running", DEADLINE, || async {
        let pod = node.pod("job").await?;
        let done = container_status(&pod, "done").ok_or("no status")?;
        if done["state"]["terminated"]["exitCode"] == 0 && is_running(&pod, "long") {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    // The sandbox dies (stopped behind the agent's back): long is killed, and pod-sync
    // makes a new sandbox for it.
    let old = node.stop_only_sandbox().await;
    eventually("long running again in a new sandbox", DEADLINE, || async {
        let pod = node.pod("job").await?;
        let sandboxes = node.sandboxes().await;
        if sandboxes.len() == 2 && restart_count(&pod, "long") >= 1 && is_running(&pod, "long") {
            Ok(())
        } else {
            Err(format!("{} sandboxes; {}", sandboxes.len(), pod["status"]))
        }
    })
    .await;
    // done ran once, in the first sandbox, and is still shown as succeeded.
    let done: Vec<_> = node
        .containers()
        .await
        .into_iter()
        .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == "done"))
        .collect();
    assert_eq!(done.len(), 1, "done was run again: {done:?}");
    assert_eq!(done[0].pod_sandbox_id, old);
    let pod = node.pod("job").await.unwrap();
    let status = container_status(&pod, "done").unwrap();
    assert_eq!(status["state"]["terminated"]["exitCode"], 0, "{status}");
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_sidecars_succeeds_and_its_sidecars_stop_in_reverse_order() {
    if !require_runtime("sidecars of a finished job") {
        return;
    }
    let node = Node::start("sidecar-job", NodeOptions::default()).await;
    let out = out_dir(&node);
    let sidecar = |name: &str| {
        format!(
            "  - name: {name}\n    image: busybox:1.36\n    restartPolicy: Always\n    command: [\"sh\", \"-c\", \"trap 'echo {name} >> /out/order; exit 0' TERM; while true; do sleep 0.2; done\"]\n    volumeMounts: [{{name: out, mountPath: /out}}]\n"
        )
    };
    node.write_manifest(
        "job.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: job\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 5\n  volumes: [{{name: out, hostPath: {{path: {out}}}}}]\n  initContainers:\n{}{}  containers:\n  - name: app\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"sleep 1; exit 0\"]\n",
            sidecar("first"),
            sidecar("second")
        ),
    );
    eventually("the job Succeeded", DEADLINE, || async {
        let pod = node.pod("job").await?;
        if pod["status"]["phase"] == "Succeeded" {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    // Each sidecar got SIGTERM (its trap ran and it exited 0), the last one first.
    let order = eventually("both sidecars stopped", DEADLINE, || async {
        let order = std::fs::read_to_string(format!("{out}/order")).unwrap_or_default();
        if order.lines().count() == 2 {
            Ok(order)
        } else {
            Err(format!("order so far: {order:?}"))
        }
    })
    .await;
    assert_eq!(order, "second\nfirst\n");
    let pod = eventually("the sidecars shown terminated", DEADLINE, || async {
        let pod = node.pod("job").await?;
        let done = ["first", "second"].iter().all(|n| {
            container_status(&pod, n).is_some_and(|c| c["state"]["terminated"]["exitCode"] == 0)
        });
        if done {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    assert_eq!(pod["status"]["phase"], "Succeeded", "{pod}");
    let app = container_status(&pod, "app").unwrap();
    assert_eq!(app["state"]["terminated"]["exitCode"], 0, "{app}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_and_sidecars_run_alongside() {
    if !require_runtime("init containers") {
        return;
    }
    let mut node = Node::start("init", NodeOptions::default()).await;
    let out = out_dir(&node);
    node.write_manifest(
        "ordered.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: ordered
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: first
    image: busybox:1.36
    command: ["sh", "-c", "sleep 1; echo first >> /out/order"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  - name: second
    image: busybox:1.36
    command: ["sh", "-c", "echo second >> /out/order"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  - name: sidecar
    image: busybox:1.36
    restartPolicy: Always
    command: ["sh", "-c", "echo sidecar >> /out/order; trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", "echo app >> /out/order; trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  volumes:
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
"#
        ),
    );
    node.write_manifest(
        "blocked.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: blocked\nspec:\n  restartPolicy: Never\n  initContainers:\n  - name: broken\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"exit 3\"]\n  containers:\n  - name: app\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n",
    );
    eventually("app and sidecar running together", DEADLINE, || async {
        let pod = node.pod("ordered").await?;
        if is_running(&pod, "app")
            && is_running(&pod, "sidecar")
            && pod["status"]["phase"] == "Running"
        {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let order = std::fs::read_to_string(format!("{out}/order")).unwrap();
    assert_eq!(order, "first\nsecond\nsidecar\napp\n");

    // Kill pleg while they run: nothing restarts.
    node.signal(Service::Pleg, Signal::SIGKILL).await;
    node.spawn(Service::Pleg);
    node.wait_serving(Service::Pleg).await;

    let blocked = eventually(
        "the failed init container to fail the pod",
        DEADLINE,
        || async {
            let pod = node.pod("blocked").await?;
            if pod["status"]["phase"] == "Failed" {
                Ok(pod)
            } else {
                Err(pod["status"].to_string())
            }
        },
    )
    .await;
    let broken = container_status(&blocked, "broken").unwrap();
    assert_eq!(broken["state"]["terminated"]["exitCode"], 3, "{broken}");
    assert_eq!(waiting_reason(&blocked, "app"), "PodInitializing");
    let apps = node
        .containers()
        .await
        .into_iter()
        .filter(|c| {
            c.labels["io.kubernetes.pod.name"] == node.pod_name("blocked")
                && c.labels["io.kubernetes.container.name"] == "app"
        })
        .count();
    assert_eq!(
        apps, 0,
        "the app container of a pod whose init failed is never created"
    );

    // After the pleg restart: same containers, no restarts, the order file unchanged.
    let pod = node.pod("ordered").await.unwrap();
    for name in ["app", "sidecar"] {
        assert_eq!(restart_count(&pod, name), 0, "{name}");
    }
    assert_eq!(
        std::fs::read_to_string(format!("{out}/order")).unwrap(),
        order
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_stop_runs_before_the_stop_and_the_grace_period_is_honoured() {
    if !require_runtime("preStop and grace period") {
        return;
    }
    let node = Node::start("prestop", NodeOptions::default()).await;
    let out = out_dir(&node);
    node.write_manifest(
        "graceful.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: graceful
spec:
  terminationGracePeriodSeconds: 4
  containers:
  - name: polite
    image: busybox:1.36
    command: ["sh", "-c", "trap 'echo term >> /out/events; exit 0' TERM; while true; do sleep 0.2; done"]
    lifecycle:
      preStop:
        exec:
          command: ["sh", "-c", "echo prestop >> /out/events; sleep 1"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  - name: stubborn
    image: busybox:1.36
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done"]
  volumes:
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
"#
        ),
    );
    eventually("both containers running", DEADLINE, || async {
        let pod = node.pod("graceful").await?;
        if is_running(&pod, "polite") && is_running(&pod, "stubborn") {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let removed_at = Instant::now();
    node.remove_manifest("graceful.yaml");
    eventually("the pod's containers gone", DEADLINE, || async {
        let n = node.containers().await.len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} containers"))
        }
    })
    .await;
    let took = removed_at.elapsed();
    let events = std::fs::read_to_string(format!("{out}/events")).unwrap();
    assert_eq!(
        events, "prestop\nterm\n",
        "preStop runs first, then SIGTERM"
    );
    // The stubborn container ignores SIGTERM: it is killed once the 4 s grace period is over.
    assert!(
        took >= Duration::from_secs(4),
        "stopped after {took:?}, before the grace period ended"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_expansion_downward_api_and_active_deadline() {
    if !require_runtime("env and downward API") {
        return;
    }
    let node = Node::start("env", NodeOptions::default()).await;
    let out = out_dir(&node);
    node.write_manifest(
        "env.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: env
  namespace: team-a
  labels: {{tier: web}}
spec:
  activeDeadlineSeconds: 8
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c"]
    args: ["echo \"$(GREETING)|$POD_NAME|$POD_NS|$POD_UID|$NODE|$TIER|$MEM_MI|$POD_IP\" > /out/env; echo '$$(ESCAPED)|$(UNDEFINED)' >> /out/env; trap 'exit 0' TERM; while true; do sleep 0.2; done"]
    env:
    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: POD_NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
    - {{name: POD_UID, valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}}}
    - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
    - {{name: TIER, valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['tier']"}}}}}}
    - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
    - {{name: MEM_MI, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}
    - {{name: GREETING, value: "hello-$(POD_NAME)"}}
    resources:
      limits: {{memory: 64Mi, cpu: 250m}}
    volumeMounts: [{{name: out, mountPath: /out}}]
  volumes:
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
"#
        ),
    );
    let pod = eventually("the pod running", DEADLINE, || async {
        let pod = node.pod("env").await?;
        if is_running(&pod, "c") {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let ip = pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(pod["status"]["qosClass"], "Guaranteed");
    let line = eventually("both lines of the env file", DEADLINE, || async {
        let text = std::fs::read_to_string(format!("{out}/env")).map_err(|e| e.to_string())?;
        if text.lines().count() == 2 {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    let name = node.pod_name("env");
    let expected = format!(
        "hello-{name}|{name}|team-a|{uid}|{}|web|64|{ip}\n$(ESCAPED)|$(UNDEFINED)",
        node.name
    );
    assert_eq!(
        line.trim(),
        expected,
        "$$ escapes, undefined references stay as written"
    );
    // The Guaranteed pod's cgroup limit (`memory.limit_in_bytes` on v1, `memory.max` on v2).
    let cgroup = format!("kubepods/pod{uid}");
    assert_eq!(
        nodeagent_tests::cgroup::memory_limit(&cgroup),
        Ok(Some(64 << 20)),
        "{cgroup}"
    );

    // activeDeadlineSeconds: 8 s after start the pod is Failed, its container stopped.
    let failed = eventually("DeadlineExceeded", DEADLINE, || async {
        let pod = node.pod("env").await?;
        if pod["status"]["phase"] == "Failed" && !is_running(&pod, "c") {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    assert_eq!(failed["status"]["reason"], "DeadlineExceeded");
    let running = node
        .containers()
        .await
        .into_iter()
        .filter(|c| c.state == 1)
        .count();
    assert_eq!(running, 0);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runonce_runs_the_static_pods_prints_their_status_and_exits_0() {
    if !require_runtime("runonce") {
        return;
    }
    let node = Node::start(
        "runonce",
        NodeOptions {
            no_services: true,
            ..Default::default()
        },
    )
    .await;
    node.write_manifest(
        "once.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: once\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n",
    );
    let mut args = node.args();
    args.push("--runonce".into());
    let bin = binary(Service::PodSync);
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(bin).args(&args).output(),
    )
    .await
    .expect("runonce finished in time")
    .expect("runonce ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    let line: Value = serde_json::from_str(stdout.lines().next().unwrap_or_default())
        .expect("one JSON line per pod");
    assert_eq!(line["pod"], node.pod_name("once"));
    assert_eq!(line["phase"], "Running");
    assert_eq!(line["containers"][0]["state"], "running");
    // The pod keeps running after runonce exits, as upstream.
    let running = node
        .containers()
        .await
        .into_iter()
        .filter(|c| c.state == 1)
        .count();
    assert_eq!(running, 1);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_failure_restarts_and_a_startup_probe_holds_back_readiness() {
    if !require_runtime("liveness") {
        return;
    }
    let node = Node::start("liveness", NodeOptions::default()).await;
    node.write_manifest(
        "sick.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: sick
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "touch /tmp/alive; sleep 3; rm /tmp/alive; trap 'exit 0' TERM; while true; do sleep 0.2; done"]
    livenessProbe:
      exec:
        command: ["test", "-f", "/tmp/alive"]
      periodSeconds: 1
      failureThreshold: 2
"#,
    );
    let pod = eventually(
        "the container restarted after its liveness probe failed",
        DEADLINE,
        || async {
            let pod = node.pod("sick").await?;
            if restart_count(&pod, "c") >= 1 && is_running(&pod, "c") {
                Ok(pod)
            } else {
                Err(pod["status"].to_string())
            }
        },
    )
    .await;
    let c = container_status(&pod, "c").unwrap();
    assert!(c["lastState"]["terminated"].is_object(), "{c}");
    let log = node.log(Service::PodSync);
    assert!(
        log.contains("failed liveness probe, will be restarted"),
        "{log}"
    );
    // A startup probe holds back `started` and readiness until it succeeds.
    node.write_manifest(
        "slow.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: slow
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "sleep 3; touch /tmp/up; trap 'exit 0' TERM; while true; do sleep 0.2; done"]
    startupProbe:
      exec:
        command: ["test", "-f", "/tmp/up"]
      periodSeconds: 1
      failureThreshold: 30
    readinessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
"#,
    );
    let early = eventually(
        "the slow container running, not yet started",
        DEADLINE,
        || async {
            let pod = node.pod("slow").await?;
            if is_running(&pod, "c") {
                Ok(pod)
            } else {
                Err(pod["status"].to_string())
            }
        },
    )
    .await;
    let c = container_status(&early, "c").unwrap();
    assert_eq!(
        (c["started"].as_bool(), c["ready"].as_bool()),
        (Some(false), Some(false)),
        "{c}"
    );
    eventually("started, then ready", DEADLINE, || async {
        let pod = node.pod("slow").await?;
        let c = container_status(&pod, "c").ok_or("no status")?;
        if c["started"] == true && c["ready"] == true {
            Ok(())
        } else {
            Err(c.to_string())
        }
    })
    .await;
    assert_eq!(restart_count(&node.pod("slow").await.unwrap(), "c"), 0);

    // A liveness probe's own terminationGracePeriodSeconds (1) wins over the pod's (60):
    // a PID 1 that ignores SIGTERM is killed a second after the failed probe, not a minute.
    node.write_manifest(
        "stubborn.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: stubborn
spec:
  terminationGracePeriodSeconds: 60
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "trap '' TERM; touch /tmp/alive; sleep 2; rm /tmp/alive; while true; do sleep 0.2; done"]
    livenessProbe:
      exec:
        command: ["test", "-f", "/tmp/alive"]
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 1
"#,
    );
    let pod = eventually(
        "the stubborn container killed and restarted",
        DEADLINE,
        || async {
            let pod = node.pod("stubborn").await?;
            if restart_count(&pod, "c") >= 1 {
                Ok(pod)
            } else {
                Err(pod["status"].to_string())
            }
        },
    )
    .await;
    let last = &container_status(&pod, "c").unwrap()["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 137, "SIGKILLed after the grace: {last}");
    let at = |k: &str| {
        let t = last[k].as_str().unwrap_or_default();
        t.parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap_or_else(|e| panic!("{k} {t:?}: {e}"))
    };
    let ran = at("finishedAt").duration_since(at("startedAt"));
    assert!(
        ran < k8s_openapi::jiff::SignedDuration::from_secs(30),
        "the probe's grace of 1 s applied, not the pod's 60 s: the container ran {ran:?}"
    );
    node.stop().await;
}

/// The IDs of the runtime's sandboxes of the pod with this full name.
async fn sandboxes_named(node: &Node, full: &str) -> Vec<String> {
    node.sandboxes()
        .await
        .into_iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.name == full))
        .map(|s| s.id)
        .collect()
}

/// Upstream never runs a pod whose phase is terminal again (`SyncPod` returns before making
/// anything; `generateAPIPodStatus` keeps the terminal phase): removing a finished pod's
/// dead container and sandbox, as the container GC or an operator may, neither brings it
/// back nor changes what `/pods` says. Nor does a pod-sync restart after that: this static
/// pod's status is nowhere but pod-sync's `finished-pods.json` (upstream keeps a static
/// pod's status in memory only, so its kubelet would run such a pod again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_pod_never_runs_again_when_its_container_and_sandbox_are_removed() {
    use nodeagent_proto::cri::{
        RemoveContainerRequest, RemovePodSandboxRequest, StopPodSandboxRequest,
    };
    if !require_runtime("a finished pod stays finished") {
        return;
    }
    let mut node = Node::start("finished", NodeOptions::default()).await;
    node.write_manifest(
        "done.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: done\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"exit 0\"]\n",
    );
    eventually("the pod Succeeded", DEADLINE, || async {
        let pod = node.pod("done").await?;
        if pod["status"]["phase"] == "Succeeded" {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let full = node.pod_name("done");
    let containers = node.container_ids(&full).await;
    assert_eq!(containers.len(), 1, "one exited container: {containers:?}");
    let sandboxes = sandboxes_named(&node, &full).await;
    assert!(!sandboxes.is_empty(), "the finished pod's sandbox is kept");

    // Behind the agent's back, as the container GC or `crictl rm` would.
    let mut rt = node.cri.runtime.clone();
    for id in &containers {
        rt.remove_container(RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("RemoveContainer");
    }
    for id in &sandboxes {
        // pod-sync may be stopping the finished pod's sandbox at this very moment: two
        // CNI DELs at once fail one of them ("failed to delete \"eth0\": no such device",
        // CI run 1 of stop 44); a StopPodSandbox once the other is done succeeds.
        eventually("StopPodSandbox", DEADLINE, || {
            let mut rt = rt.clone();
            async move {
                rt.stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .map(|_| ())
                .map_err(|e| e.message().to_string())
            }
        })
        .await;
        rt.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .expect("RemovePodSandbox");
    }

    // A stability window: nothing of the pod comes back, and it stays Succeeded; then
    // the same after a pod-sync SIGKILL and restart, once the new pod-sync has both
    // snapshots (it logs the config snapshot and the finished pods it restored).
    for restarted in [false, true] {
        if restarted {
            node.signal(Service::PodSync, Signal::SIGKILL).await;
            node.spawn(Service::PodSync);
            eventually(
                "the new pod-sync restored the record and has the pods",
                DEADLINE,
                || async {
                    let log = node.log(Service::PodSync);
                    let at = log
                        .find("finished pods restored")
                        .ok_or_else(|| "no record restored".to_string())?;
                    if log[at..].contains("config snapshot") {
                        Ok(())
                    } else {
                        Err("no config snapshot since".to_string())
                    }
                },
            )
            .await;
        }
        let what = if restarted {
            "after a pod-sync restart, the finished pod stays finished with nothing of it back"
        } else {
            "the finished pod stays finished with nothing of it back"
        };
        consistently(
            what,
            Duration::from_secs(20),
            Duration::from_millis(500),
            || async {
                let containers = node.container_ids(&full).await;
                if !containers.is_empty() {
                    return Err(format!("a new container: {containers:?}"));
                }
                let sandboxes = sandboxes_named(&node, &full).await;
                if !sandboxes.is_empty() {
                    return Err(format!("a new sandbox: {sandboxes:?}"));
                }
                let pod = node.pod("done").await?;
                if pod["status"]["phase"] != "Succeeded" {
                    return Err(format!("phase: {pod}"));
                }
                let c = container_status(&pod, "c").ok_or("its container's last status is gone")?;
                if c["state"]["terminated"]["exitCode"] != 0 {
                    return Err(format!("last status: {c}"));
                }
                Ok(())
            },
        )
        .await;
    }
    node.stop().await;
}
