//! Sidecars (restartable init containers) and termination, to upstream's letter, against
//! the real containerd: a sidecar's startup probe holds the next init container back, its
//! readiness counts for the pod's, a failed liveness probe restarts it, a sidecar in
//! crash-loop back-off does not hold back the restart of a regular container, a deleted
//! pod's sidecars stop after its regular containers in reverse order, and a second,
//! shorter deletion (a force delete) shortens a termination under way.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams, WatchEvent, WatchParams};
use nodeagent_tests::{
    Node, NodeOptions, consistently, container_status, eventually, eventually_event,
    require_runtime,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(90);

/// A hostPath directory the pods write to and the test reads (and writes, to drive probes).
fn out_dir(node: &Node) -> String {
    let dir = node.path("out");
    std::fs::create_dir_all(&dir).unwrap();
    dir.display().to_string()
}

fn read(out: &str, file: &str) -> Option<String> {
    std::fs::read_to_string(format!("{out}/{file}"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The host's uptime (seconds, 10 ms steps) that a container wrote: one clock for all
/// containers (busybox's `date` has no sub-second format).
fn uptime(out: &str, file: &str) -> Option<f64> {
    read(out, file)?.parse().ok()
}

fn restarts(pod: &Value, name: &str) -> i64 {
    container_status(pod, name)
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(-1)
}

fn condition(pod: &Value, t: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == t))
        .map(|c| c["status"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// A shell loop that runs until SIGTERM (the trap's `then` first).
fn until_term(then: &str) -> String {
    format!("trap '{then} exit 0' TERM; while true; do sleep 0.2; done")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecars_probes_gate_the_next_init_container_drive_ready_and_restart_it() {
    if !require_runtime("sidecar probes") {
        return;
    }
    let node = Node::start("sidecar-probes", NodeOptions::default()).await;
    let out = out_dir(&node);
    let proxy = format!(
        "sleep 3; read u _ < /proc/uptime; echo $u > /out/proxy-up; touch /tmp/up; {}",
        until_term("")
    );
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probed"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "out", "hostPath": {"path": out}}],
            "initContainers": [
                {"name": "proxy", "image": "busybox:1.36", "restartPolicy": "Always",
                 "command": ["sh", "-c", proxy],
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                 "startupProbe": {"exec": {"command": ["test", "-f", "/tmp/up"]},
                     "periodSeconds": 1, "failureThreshold": 60},
                 "readinessProbe": {"exec": {"command": ["test", "-f", "/out/proxy-ready"]},
                     "periodSeconds": 1},
                 "livenessProbe": {"exec": {"command": ["test", "!", "-f", "/out/proxy-kill"]},
                     "periodSeconds": 1, "failureThreshold": 1}},
                {"name": "setup", "image": "busybox:1.36",
                 "command": ["sh", "-c", "read u _ < /proc/uptime; echo $u > /out/setup-start"],
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}]}
            ],
            "containers": [{"name": "app", "image": "busybox:1.36",
                "command": ["sh", "-c", until_term("")]}]
        }
    });
    node.write_manifest("probed.json", &pod.to_string());

    // The next init container waited for the sidecar's startup probe (upstream); before,
    // it started as soon as the sidecar was running, 3 s before it was up.
    let (up, setup) = eventually("the init container ran", DEADLINE, || async {
        match (uptime(&out, "proxy-up"), uptime(&out, "setup-start")) {
            (Some(up), Some(setup)) => Ok((up, setup)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        setup >= up,
        "setup started {:.2} s before the sidecar was up",
        up - setup
    );

    // The app is ready, the sidecar is not: the pod is not Ready (upstream counts sidecars).
    let pod = eventually("the app running, the sidecar unready", DEADLINE, || async {
        let pod = node.pod("probed").await?;
        let app_ready = container_status(&pod, "app").is_some_and(|c| c["ready"] == true);
        let proxy_started = container_status(&pod, "proxy").is_some_and(|c| c["started"] == true);
        if app_ready && proxy_started {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    assert_eq!(condition(&pod, "Ready"), "False", "{}", pod["status"]);
    assert_eq!(condition(&pod, "ContainersReady"), "False");
    std::fs::write(format!("{out}/proxy-ready"), "").unwrap();
    eventually("the pod Ready once its sidecar is", DEADLINE, || async {
        let pod = node.pod("probed").await?;
        let proxy_ready = container_status(&pod, "proxy").is_some_and(|c| c["ready"] == true);
        if proxy_ready && condition(&pod, "Ready") == "True" {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;

    // A failed liveness probe restarts the sidecar, and only the sidecar.
    let app_id = container_status(&pod, "app").unwrap()["containerID"].clone();
    std::fs::write(format!("{out}/proxy-kill"), "").unwrap();
    eventually("the sidecar restarted", DEADLINE, || async {
        let pod = node.pod("probed").await?;
        if restarts(&pod, "proxy") >= 1 {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    std::fs::remove_file(format!("{out}/proxy-kill")).unwrap();
    let pod = eventually("the new sidecar up and ready", DEADLINE, || async {
        let pod = node.pod("probed").await?;
        let proxy_ready = container_status(&pod, "proxy").is_some_and(|c| c["ready"] == true);
        if proxy_ready && condition(&pod, "Ready") == "True" {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let app = container_status(&pod, "app").unwrap();
    assert_eq!(app["containerID"], app_id, "the app was not restarted");
    assert_eq!(app["restartCount"], 0);
    assert_eq!(
        restarts(&pod, "setup"),
        0,
        "the init container did not run again"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_in_back_off_does_not_hold_back_a_regular_containers_restart() {
    if !require_runtime("sidecar back-off") {
        return;
    }
    let node = Node::start("sidecar-backoff", NodeOptions::default()).await;
    let out = out_dir(&node);
    // Crashes on each of its first four runs: after the second, each restart waits 10 s,
    // then 20 s, then 40 s.
    let flaky = "echo run >> /out/runs; if [ $(wc -l < /out/runs) -le 4 ]; then sleep 1; exit 1; fi; while true; do sleep 0.2; done";
    // Fails its liveness probe once, when the test drops /out/app-kill.
    let liveness = "if [ -f /out/app-kill ]; then rm /out/app-kill; exit 1; fi";
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "backoff"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "out", "hostPath": {"path": out}}],
            "initContainers": [{"name": "flaky", "image": "busybox:1.36",
                "restartPolicy": "Always", "command": ["sh", "-c", flaky],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}]}],
            "containers": [{"name": "app", "image": "busybox:1.36",
                "command": ["sh", "-c", until_term("")],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                "livenessProbe": {"exec": {"command": ["sh", "-c", liveness]},
                    "periodSeconds": 1, "failureThreshold": 1}}]
        }
    });
    node.write_manifest("backoff.json", &pod.to_string());
    // The sidecar waits out a 20 s back-off after its third run.
    eventually("the sidecar in a 20 s back-off", DEADLINE, || async {
        let pod = node.pod("backoff").await?;
        let waiting = container_status(&pod, "flaky")
            .and_then(|c| c["state"]["waiting"]["reason"].as_str())
            .unwrap_or_default()
            .to_string();
        if restarts(&pod, "flaky") == 2 && waiting == "CrashLoopBackOff" {
            Ok(())
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    std::fs::write(format!("{out}/app-kill"), "").unwrap();
    // The app is killed and restarted while the sidecar still waits (before, the pod's
    // sync stopped at the sidecar until its back-off ended).
    let pod = eventually("the app restarted", DEADLINE, || async {
        let pod = node.pod("backoff").await?;
        if restarts(&pod, "app") >= 1
            && container_status(&pod, "app").is_some_and(|c| c["state"]["running"].is_object())
        {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    assert_eq!(
        restarts(&pod, "flaky"),
        2,
        "the app restarted within the sidecar's back-off: {}",
        pod["status"]
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_sidecars_stop_last_and_a_shorter_deletion_takes_effect() {
    if !require_runtime("termination order") {
        return;
    }
    let (server, node) = Node::start_with_api_server("termination", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let out = out_dir(&node);
    let mount = json!([{"name": "out", "mountPath": "/out"}]);
    // Each writes when it got SIGTERM; the app takes 2 s to stop.
    let term = |name: &str, delay: &str| {
        until_term(&format!(
            "read u _ < /proc/uptime; echo $u > /out/{name}-term; {delay}"
        ))
    };
    let ordered = node.pod_name("ordered");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": ordered, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "out", "hostPath": {"path": out}}],
            "initContainers": [
                {"name": "first", "image": "busybox:1.36", "restartPolicy": "Always",
                 "command": ["sh", "-c", term("first", "")], "volumeMounts": mount},
                {"name": "second", "image": "busybox:1.36", "restartPolicy": "Always",
                 "command": ["sh", "-c", term("second", "")], "volumeMounts": mount}
            ],
            "containers": [{"name": "app", "image": "busybox:1.36",
                "command": ["sh", "-c", term("app", "sleep 2;")], "volumeMounts": mount}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // PID 1 ignores SIGTERM: only SIGKILL, at the end of the grace period, stops it.
    let stubborn = node.pod_name("stubborn");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": stubborn, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 300,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done"]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    for name in ["ordered", "stubborn"] {
        eventually("the pod running", DEADLINE, || async {
            let pod = node.pod(name).await?;
            if pod["status"]["phase"] == "Running" && condition(&pod, "Ready") == "True" {
                Ok(())
            } else {
                Err(pod["status"].to_string())
            }
        })
        .await;
    }

    // Regular containers first, then the sidecars in reverse order, each once the one
    // before it has stopped (before, all got SIGTERM at once).
    // Every phase the API server holds from now until the pod is gone.
    let version = pods
        .get(&ordered)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let params = WatchParams::default().fields(&format!("metadata.name={ordered}"));
    let mut watch = pods.watch(&params, &version).await.unwrap().boxed();
    let phases = tokio::spawn(async move {
        let mut phases = Vec::new();
        while let Some(Ok(event)) = watch.next().await {
            match event {
                WatchEvent::Modified(p) => phases.push(p.status.and_then(|s| s.phase)),
                WatchEvent::Deleted(p) => {
                    phases.push(p.status.and_then(|s| s.phase));
                    break;
                }
                _ => {}
            }
        }
        phases
    });
    pods.delete(&ordered, &DeleteParams::default())
        .await
        .unwrap();
    let times = eventually("every container got SIGTERM", DEADLINE, || async {
        match (
            uptime(&out, "app-term"),
            uptime(&out, "second-term"),
            uptime(&out, "first-term"),
        ) {
            (Some(a), Some(s), Some(f)) => Ok((a, s, f)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (app, second, first) = times;
    assert!(
        second >= app + 1.5,
        "the second sidecar got SIGTERM {:.2} s after the app, before the app had stopped",
        second - app
    );
    assert!(
        first >= second,
        "the first sidecar stopped before the second"
    );
    eventually("the pod gone from the API", DEADLINE, || async {
        match pods.get_opt(&ordered).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Its status said how it ended before it went: every container exited 0 on SIGTERM,
    // so Succeeded (upstream; before, it went while still saying Running).
    let phases = tokio::time::timeout(DEADLINE, phases)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        phases.last().cloned().flatten().as_deref(),
        Some("Succeeded"),
        "phases seen: {phases:?}"
    );

    // A 300 s termination, then a force delete: the container is killed within seconds.
    pods.delete(&stubborn, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deletion under way", DEADLINE, || async {
        let p = pods.get(&stubborn).await.map_err(|e| e.to_string())?;
        let g = p.metadata.deletion_grace_period_seconds;
        if g == Some(300) {
            Ok(())
        } else {
            Err(format!("{g:?}"))
        }
    })
    .await;
    // The kill is under way (its Killing event is posted as it begins) before the period
    // is shortened; the container ignores SIGTERM, so only SIGKILL ends it.
    let id = node
        .container_id("stubborn", "c")
        .await
        .expect("the container's id");
    eventually_event(
        &server.client(),
        "default",
        "the Killing event",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("Killing")
                && e.involved_object.name.as_deref() == Some(stubborn.as_str())
        },
    )
    .await;
    let forced = Instant::now();
    pods.delete(&stubborn, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("the container killed", Duration::from_secs(30), || async {
        // Stopped, or already stopped and removed with its pod.
        let status = match node.cri.container_status(&id).await {
            Err(e) if nodeagent_cri::is_not_found(&e) => return Ok(()),
            other => other.map_err(|e| e.to_string())?,
        };
        let s = status.status.ok_or("no status")?;
        if s.finished_at > 0 {
            Ok(())
        } else {
            Err(format!("state {}", s.state))
        }
    })
    .await;
    let took = forced.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "killed {took:?} after the force delete"
    );
    node.stop().await;
}

/// Issue 28's first known difference, judged by upstream's `getPhase`
/// (pkg/kubelet/kubelet_pods.go; kubelet_pods_test.go's
/// TestPodPhaseWithRestartNeverRestartableInitContainers, "restartable init container
/// terminated, regular container running" -> Running): once the pod has initialized, a
/// sidecar that is down (exited, or waiting out its back-off) does not make the phase
/// Pending, nor Failed under `restartPolicy: Never`. Here the sidecar exits every 2 s and
/// is restarted (with growing back-off) while the regular container runs; `/pods` must say
/// Running at every look. The old code said Failed the moment the sidecar first exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downed_sidecar_leaves_the_phase_running_under_restart_policy_never() {
    if !require_runtime("downed sidecar phase") {
        return;
    }
    let node = Node::start("sidecar-down", NodeOptions::default()).await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "flaky"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "initContainers": [
                {"name": "proxy", "image": "busybox:1.36", "restartPolicy": "Always",
                 "command": ["sh", "-c", "sleep 2; exit 1"]},
            ],
            "containers": [
                {"name": "app", "image": "busybox:1.36", "command": ["sh", "-c", until_term("")]},
            ],
        },
    });
    node.write_manifest("flaky.json", &pod.to_string());
    eventually("flaky Running with app running", DEADLINE, || async {
        let pod = node.pod("flaky").await?;
        let app = container_status(&pod, "app").ok_or("no app status")?;
        match (
            pod["status"]["phase"].as_str(),
            app["state"]["running"].is_object(),
        ) {
            (Some("Running"), true) => Ok(()),
            (phase, running) => Err(format!("phase {phase:?}, app running {running}")),
        }
    })
    .await;
    // For as long as it takes the sidecar to exit and restart twice (2 s runs, 10 s then
    // 20 s of back-off), the phase stays Running and app is never touched.
    let app_id = node.container_id("flaky", "app").await;
    let sidecar_down_seen = std::sync::atomic::AtomicBool::new(false);
    consistently(
        "flaky's phase Running while its sidecar exits and restarts",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let pod = node.pod("flaky").await?;
            if pod["status"]["phase"] != "Running" {
                return Err(format!("the phase changed: {}", pod["status"]));
            }
            let proxy_running = pod["status"]["initContainerStatuses"]
                .as_array()
                .and_then(|s| s.iter().find(|c| c["name"] == "proxy"))
                .is_some_and(|c| c["state"]["running"].is_object());
            if !proxy_running {
                sidecar_down_seen.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        },
    )
    .await;
    assert!(
        sidecar_down_seen.load(std::sync::atomic::Ordering::Relaxed),
        "the sidecar was never seen down: the test proved nothing"
    );
    assert_eq!(
        node.container_id("flaky", "app").await,
        app_id,
        "app was restarted"
    );
    node.stop().await;
}

/// An init container that fails under `restartPolicy: Never` fails the pod, and upstream's
/// `computePodActions` kills the pod (`KillPod`): its running sidecars are killed as every
/// kill is, with SIGTERM and the pod's grace period, before the sandbox goes. Here the
/// sidecar exits 7 on SIGTERM; the old code only stopped the sandbox, whose SIGKILL left
/// exit code 137.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_init_container_under_never_kills_its_sidecars_gracefully() {
    if !require_runtime("init failure kills sidecars") {
        return;
    }
    let node = Node::start("init-fails", NodeOptions::default()).await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "setup-fails"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 10,
            "initContainers": [
                {"name": "proxy", "image": "busybox:1.36", "restartPolicy": "Always",
                 "command": ["sh", "-c", "trap 'exit 7' TERM; while true; do sleep 0.2; done"]},
                {"name": "setup", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 2; exit 3"]},
            ],
            "containers": [
                {"name": "app", "image": "busybox:1.36", "command": ["sh", "-c", until_term("")]},
            ],
        },
    });
    node.write_manifest("setup-fails.json", &pod.to_string());
    let init_status = |pod: &Value, name: &str| {
        pod["status"]["initContainerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|c| c["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    let pod = eventually(
        "the pod Failed with its sidecar stopped",
        DEADLINE,
        || async {
            let pod = node.pod("setup-fails").await?;
            let proxy = init_status(&pod, "proxy");
            if pod["status"]["phase"] == "Failed" && proxy["state"]["terminated"].is_object() {
                Ok(pod)
            } else {
                Err(pod["status"].to_string())
            }
        },
    )
    .await;
    assert_eq!(
        init_status(&pod, "setup")["state"]["terminated"]["exitCode"],
        3,
        "{}",
        pod["status"]
    );
    assert_eq!(
        init_status(&pod, "proxy")["state"]["terminated"]["exitCode"],
        7,
        "the sidecar got SIGTERM, not the sandbox's SIGKILL: {}",
        pod["status"]
    );
    assert!(
        container_status(&pod, "app").is_some_and(|c| c["state"]["running"].is_null()),
        "app never ran: {}",
        pod["status"]
    );
    node.stop().await;
}
