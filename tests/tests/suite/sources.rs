//! config-source's API server source against the test API server, driven by the same
//! kube-rs client production uses: pods bound to this node run and follow their changes,
//! status reaches the API, graceful deletion completes, the watch survives `410 Gone` and
//! an API server restart, and invalid or duplicate pods are refused without disturbing
//! the others.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nodeagent_config::Service;
use nodeagent_tests::apiserver::ApiServer;
use nodeagent_tests::{
    Node, NodeOptions, consistently, eventually, eventually_event, require_runtime,
};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn pod(name: &str, node: &str, extra: serde_json::Value) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]}]
        }
    });
    nodeagent_tests::apiserver::merge_patch(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

/// Waits until the API server has no pod `name`.
async fn api_gone(pods: &Api<Pod>, name: &str, what: &str) {
    eventually(what, DEADLINE, || async {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(p) => Err(format!(
                "still there: deletionTimestamp {:?}",
                p.metadata.deletion_timestamp
            )),
        }
    })
    .await;
}

async fn api_phase(pods: &Api<Pod>, name: &str) -> Result<String, String> {
    let p = pods.get(name).await.map_err(|e| e.to_string())?;
    Ok(p.status.and_then(|s| s.phase).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_pods_run_report_status_and_complete_graceful_deletion() {
    if !require_runtime("api server pods") {
        return;
    }
    let (server, mut node) = Node::start_with_api_server("apisrc", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");

    // A name that ends in the node's suffix, so the harness can find its containers.
    let name = format!("api-{}", node.name);
    pods.create(&PostParams::default(), &pod(&name, &node.name, json!({})))
        .await
        .unwrap();
    let other = format!("elsewhere-{}", node.name);
    pods.create(
        &PostParams::default(),
        &pod(&other, "some-other-node", json!({})),
    )
    .await
    .unwrap();

    eventually(
        "the API pod Running in the API server's status",
        DEADLINE,
        || async {
            match api_phase(&pods, &name).await? {
                p if p == "Running" => Ok(()),
                p => Err(p),
            }
        },
    )
    .await;
    let ids = node.container_ids(&name).await;
    assert_eq!(ids.len(), 1);
    assert!(
        node.container_ids(&other).await.is_empty(),
        "a pod bound to another node does not run here"
    );
    let status = pods.get(&name).await.unwrap().status.unwrap();
    assert!(status.pod_ip.is_some_and(|ip| !ip.is_empty()));
    assert!(
        status.container_statuses.unwrap()[0]
            .container_id
            .as_deref()
            .unwrap()
            .ends_with(&ids[0])
    );

    // A label change is an UPDATE that needs no container change.
    pods.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "web"}}})),
    )
    .await
    .unwrap();
    eventually("the new label in /pods", DEADLINE, || async {
        let p = node
            .pods()
            .await?
            .into_iter()
            .find(|p| p["metadata"]["name"] == name.as_str())
            .ok_or("not listed")?;
        if p["metadata"]["labels"]["tier"] == "web" {
            Ok(())
        } else {
            Err(p["metadata"].to_string())
        }
    })
    .await;
    assert_eq!(
        node.container_ids(&name).await,
        ids,
        "a metadata change restarts nothing"
    );

    // A static pod on a connected node gets a mirror pod carrying its status, and the
    // mirror goes when the static pod goes.
    let static_manifest = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n"
        )
    };
    node.write_manifest("static.yaml", &static_manifest("static"));
    node.write_manifest("orphan.yaml", &static_manifest("orphan"));
    let mirror_name = node.pod_name("static");
    let orphan_name = node.pod_name("orphan");
    eventually("the second static pod's mirror", DEADLINE, || async {
        pods.get_opt(&orphan_name)
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .ok_or_else(|| "no mirror yet".to_string())
    })
    .await;
    let mirror = eventually(
        "the mirror pod Running in the API server",
        DEADLINE,
        || async {
            let p = pods.get(&mirror_name).await.map_err(|e| e.to_string())?;
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            if phase == "Running" {
                Ok(p)
            } else {
                Err(phase)
            }
        },
    )
    .await;
    let annotations = mirror.metadata.annotations.unwrap();
    assert_eq!(
        annotations.get("kubernetes.io/config.mirror"),
        annotations.get("kubernetes.io/config.hash")
    );
    assert_eq!(
        node.container_ids(&mirror_name).await.len(),
        1,
        "the mirror pod itself is never run"
    );
    // A static pod removed while pod-sync is down: its mirror is deleted once pod-sync is
    // back and every source has listed (upstream's HandlePodCleanups, "orphaned mirror
    // pods"), and the other static pod runs on, its mirror kept.
    let running = node.container_ids(&mirror_name).await;
    let kept_uid = mirror.metadata.uid.clone();
    node.signal(Service::PodSync, nix::sys::signal::Signal::SIGKILL)
        .await;
    node.remove_manifest("orphan.yaml");
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    api_gone(
        &pods,
        &orphan_name,
        "the orphaned mirror pod deleted after pod-sync's restart",
    )
    .await;
    assert_eq!(
        pods.get(&mirror_name).await.unwrap().metadata.uid,
        kept_uid,
        "the running static pod's mirror is kept"
    );
    assert_eq!(node.container_ids(&mirror_name).await, running);
    // `kubectl delete pod` of a mirror pod: the static pod keeps running and its mirror
    // comes back, a new one (upstream kubelet.go syncPod: a mirror being deleted is
    // deleted and created anew).
    let old_uid = mirror.metadata.uid.clone().unwrap();
    pods.delete(&mirror_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "a new mirror pod, Running, after the mirror's deletion",
        DEADLINE,
        || async {
            let p = pods
                .get_opt(&mirror_name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no mirror".to_string())?;
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            if p.metadata.uid.as_deref() != Some(old_uid.as_str())
                && p.metadata.deletion_timestamp.is_none()
                && phase.as_deref() == Some("Running")
            {
                Ok(())
            } else {
                Err(format!("uid {:?}, phase {phase:?}", p.metadata.uid))
            }
        },
    )
    .await;
    assert_eq!(
        node.container_ids(&mirror_name).await,
        running,
        "deleting the mirror restarts nothing"
    );
    // A deletion meant for the old mirror (its UID as the precondition, as the node
    // deletes one) is refused and leaves the new one: the API server's 409.
    let refused = pods
        .delete(
            &mirror_name,
            &DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: Some(old_uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 409),
        "{refused:?}"
    );
    assert!(pods.get_opt(&mirror_name).await.unwrap().is_some());
    node.remove_manifest("static.yaml");
    api_gone(&pods, &mirror_name, "the mirror pod deleted").await;

    // Graceful deletion: the node stops the containers, then deletes the pod with grace 0.
    pods.delete(
        &name,
        &DeleteParams {
            grace_period_seconds: Some(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        pods.get(&name)
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    api_gone(&pods, &name, "the pod gone from the API server").await;
    assert!(
        node.container_ids(&name).await.is_empty(),
        "its containers are gone first"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_survives_410_gone_and_an_api_server_restart() {
    if !require_runtime("watch resilience") {
        return;
    }
    let (server, node) = Node::start_with_api_server("apiwatch", NodeOptions::default()).await;
    let port = server.port;
    let first = format!("first-{}", node.name);
    {
        let pods: Api<Pod> = Api::namespaced(server.client(), "default");
        pods.create(&PostParams::default(), &pod(&first, &node.name, json!({})))
            .await
            .unwrap();
        eventually("the first pod Running", DEADLINE, || async {
            match api_phase(&pods, &first).await? {
                p if p == "Running" => Ok(()),
                p => Err(p),
            }
        })
        .await;
    }
    let ids = node.container_ids(&first).await;

    // The API server goes away mid-watch and comes back with its history compacted: the
    // watcher's resume version is too old (410 Gone), so it must re-list.
    let state = server.stop().await;
    state.compact();
    let server = ApiServer::start(state, port).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let second = format!("second-{}", node.name);
    pods.create(&PostParams::default(), &pod(&second, &node.name, json!({})))
        .await
        .unwrap();
    eventually(
        "a pod created after the restart runs",
        Duration::from_secs(90),
        || async {
            match api_phase(&pods, &second).await? {
                p if p == "Running" => Ok(()),
                p => Err(p),
            }
        },
    )
    .await;
    assert_eq!(
        node.container_ids(&first).await,
        ids,
        "the first pod was not disturbed"
    );
    let expired = server
        .state
        .expired_watches
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        expired >= 1,
        "the watcher resumed from a compacted version and got 410 Gone"
    );
    let log = node.log(Service::ConfigSource);
    assert!(
        log.contains("API server watch failed"),
        "the broken watch is reported: {log}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_and_duplicate_api_pods_are_refused_with_an_event() {
    if !require_runtime("invalid api pods") {
        return;
    }
    let (server, node) = Node::start_with_api_server("apibad", NodeOptions::default()).await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let good = format!("good-{}", node.name);
    pods.create(&PostParams::default(), &pod(&good, &node.name, json!({})))
        .await
        .unwrap();
    eventually("the good API pod Running", DEADLINE, || async {
        match api_phase(&pods, &good).await? {
            p if p == "Running" => Ok(()),
            p => Err(p),
        }
    })
    .await;
    let before = node.container_ids(&good).await;

    // The test API server does not validate, so a pod with no containers gets through to
    // the node, which must refuse it.
    let bad = format!("bad-{}", node.name);
    pods.create(
        &PostParams::default(),
        &pod(&bad, &node.name, json!({"spec": {"containers": []}})),
    )
    .await
    .unwrap();
    // A static pod with the same name as the running API pod "good": refused, reported.
    node.write_manifest(
        "good.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: good\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n",
    );
    let dup = good.clone();

    let event = eventually_event(
        &client,
        "default",
        "a FailedValidation event for the invalid pod",
        DEADLINE,
        |e| e.involved_object.name.as_deref() == Some(bad.as_str()),
    )
    .await;
    assert_eq!(event.reason.as_deref(), Some("FailedValidation"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .message
            .unwrap()
            .contains("spec.containers: Required value")
    );
    eventually("the duplicate name reported", DEADLINE, || async {
        let log = node.log(Service::ConfigSource);
        if log
            .lines()
            .any(|l| l.contains("duplicate pod name") && l.contains(&dup))
        {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    assert!(node.container_ids(&bad).await.is_empty());
    assert_eq!(
        node.container_ids(&good).await,
        before,
        "the good pod is undisturbed"
    );
    // Exactly one pod of that name runs: the API server's, which was there first.
    let listed: Vec<_> = node
        .pods()
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p["metadata"]["name"] == dup.as_str())
        .collect();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0]["metadata"]["annotations"]["kubernetes.io/config.source"],
        "api"
    );
    node.stop().await;
}

/// A tiny HTTP server whose answer the test changes: (status code, body); it records the
/// last request's headers.
#[derive(Clone, Default)]
struct ManifestServer {
    answer: std::sync::Arc<std::sync::Mutex<(u16, String)>>,
    last_request: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ManifestServer {
    async fn start(&self) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let this = self.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                *this.last_request.lock().unwrap() =
                    String::from_utf8_lossy(&buf[..n]).into_owned();
                let (code, body) = this.answer.lock().unwrap().clone();
                let reply = format!(
                    "HTTP/1.0 {code} X\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        port
    }

    fn answer(&self, code: u16, body: &str) {
        *self.answer.lock().unwrap() = (code, body.to_string());
    }
}

fn pod_list(names: &[&str]) -> String {
    let items: Vec<_> = names
        .iter()
        .map(|n| json!({"metadata": {"name": n}, "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}}))
        .collect();
    json!({"apiVersion": "v1", "kind": "PodList", "items": items}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_source_serves_pods_and_keeps_the_last_good_set_through_failures() {
    if !require_runtime("http source") {
        return;
    }
    let manifests = ManifestServer::default();
    manifests.answer(200, &pod_list(&["one"]));
    let port = manifests.start().await;
    let extra_config = format!(
        "staticPodURL: http://127.0.0.1:{port}/pods\nstaticPodURLHeader:\n  X-Node-Token: [\"s3cret\"]\nhttpCheckFrequency: 1s\n"
    );
    let node = Node::start(
        "httpsrc",
        NodeOptions {
            extra_config,
            ..Default::default()
        },
    )
    .await;
    let one = node.pod_name("one");
    eventually("the pod from the URL running", DEADLINE, || async {
        let ids = node.container_ids(&one).await;
        let pod = node.pod("one").await?;
        if ids.len() == 1 && pod["status"]["phase"] == "Running" {
            Ok(())
        } else {
            Err(format!("{ids:?}"))
        }
    })
    .await;
    // Header names are case-insensitive (hyper sends them lowercased).
    assert!(
        manifests
            .last_request
            .lock()
            .unwrap()
            .to_ascii_lowercase()
            .contains("x-node-token: s3cret")
    );
    let pod = node.pod("one").await.unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/config.source"],
        "http"
    );
    let ids = node.container_ids(&one).await;

    // The server flaps: HTML, a list with an item that is not a pod (which once panicked
    // the source for good: found by tests/fuzz), then an error status. Each is reported
    // once; the pod stays.
    for (code, body, reason) in [
        (
            200,
            "<html><body>maintenance</body></html>",
            "not a mapping",
        ),
        (
            200,
            r#"{"apiVersion":"v1","kind":"PodList","items":["one"]}"#,
            "items[0]: the item is not a mapping",
        ),
        (503, "down", "answered HTTP 503"),
    ] {
        manifests.answer(code, body);
        eventually(&format!("{reason} reported"), DEADLINE, || async {
            let log = node.log(Service::ConfigSource);
            if log
                .lines()
                .any(|l| l.contains("static pod URL") && l.contains(reason))
            {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        })
        .await;
        // The URL is polled every second (httpCheckFrequency): several polls' time.
        consistently(
            "the last good set keeps running",
            Duration::from_secs(4),
            Duration::from_millis(500),
            || async {
                let now = node.container_ids(&one).await;
                (now == ids)
                    .then_some(())
                    .ok_or(format!("{now:?} != {ids:?}"))
            },
        )
        .await;
    }

    // Back, with a second pod; then without the first.
    manifests.answer(200, &pod_list(&["one", "two"]));
    let two = node.pod_name("two");
    eventually("the second pod running", DEADLINE, || async {
        let n = node.container_ids(&two).await.len();
        if n == 1 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    assert_eq!(node.container_ids(&one).await, ids);
    manifests.answer(200, &pod_list(&["two"]));
    eventually("the first pod removed", DEADLINE, || async {
        let n = node.container_ids(&one).await.len();
        if n == 0 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_maps_and_secrets_reach_the_environment() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    if !require_runtime("configmap and secret env") {
        return;
    }
    let (server, node) = Node::start_with_api_server("apienv", NodeOptions::default()).await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "settings"}, "data": {"MODE": "fast", "LEVEL": "3"}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "creds"}, "data": {"password": "aHVudGVyMg=="}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let out = node.path("out");
    std::fs::create_dir_all(&out).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let name = format!("env-{}", node.name);
    let spec = json!({"spec": {
        "containers": [{
            "name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", "echo \"$CFG_MODE|$CFG_LEVEL|$PASSWORD|${MAYBE-unset}\" > /out/env; trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
            "env": [
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "MAYBE", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": true}}}
            ],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]
        }],
        "volumes": [{"name": "out", "hostPath": {"path": out.display().to_string()}}]
    }});
    pods.create(&PostParams::default(), &pod(&name, &node.name, spec))
        .await
        .unwrap();
    // The shell creates the file before it writes the line: only a whole line counts (an
    // empty read here failed CI once).
    let line = eventually("the env file's line", DEADLINE, || async {
        let text = std::fs::read_to_string(out.join("env")).map_err(|e| e.to_string())?;
        if text.ends_with('\n') {
            Ok(text)
        } else {
            Err(format!("partial: {text:?}"))
        }
    })
    .await;
    assert_eq!(line.trim(), "fast|3|hunter2|unset");

    // A required ConfigMap that does not exist: CreateContainerConfigError, reported in
    // the API server's status.
    let broken = format!("broken-{}", node.name);
    let spec = json!({"spec": {"containers": [{
        "name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}]
    }]}});
    pods.create(&PostParams::default(), &pod(&broken, &node.name, spec))
        .await
        .unwrap();
    let waiting = eventually(
        "CreateContainerConfigError in the API status",
        DEADLINE,
        || async {
            let p = pods.get(&broken).await.map_err(|e| e.to_string())?;
            let w = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|cs| cs.into_iter().next())
                .and_then(|c| c.state)
                .and_then(|s| s.waiting)
                .ok_or("not waiting")?;
            if w.reason.as_deref() == Some("CreateContainerConfigError") {
                Ok(w)
            } else {
                Err(format!("{w:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        waiting.message.as_deref(),
        Some("configmap \"nope\" not found")
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connected_node_registers_itself_and_renews_its_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node as KubeNode;
    if !require_runtime("node registration") {
        return;
    }
    let options = NodeOptions {
        extra_config: "nodeLeaseDurationSeconds: 4\nnodeStatusUpdateFrequency: 1s\n".into(),
        ..Default::default()
    };
    let (server, node) = Node::start_with_api_server("register", options).await;
    let client = server.client();
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let registered = eventually("the Node registered and Ready", DEADLINE, || async {
        let n = nodes.get(&node.name).await.map_err(|e| e.to_string())?;
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
            .unwrap_or_default();
        if ready == "True" {
            Ok(n)
        } else {
            Err(format!("Ready={ready}"))
        }
    })
    .await;
    let status = registered.status.unwrap();
    assert!(status.capacity.unwrap().contains_key("memory"));
    assert!(
        status
            .node_info
            .unwrap()
            .container_runtime_version
            .starts_with("containerd://")
    );
    assert_eq!(
        registered.metadata.labels.unwrap()["kubernetes.io/hostname"],
        node.name
    );

    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let first = eventually("the node lease", DEADLINE, || async {
        let l = leases.get(&node.name).await.map_err(|e| e.to_string())?;
        l.spec
            .and_then(|s| s.renew_time)
            .ok_or_else(|| "no renewTime".to_string())
    })
    .await;
    eventually("the lease renewed", DEADLINE, || async {
        let l = leases.get(&node.name).await.map_err(|e| e.to_string())?;
        let spec = l.spec.ok_or("no spec")?;
        assert_eq!(spec.holder_identity.as_deref(), Some(node.name.as_str()));
        assert_eq!(spec.lease_duration_seconds, Some(4));
        match spec.renew_time {
            Some(t) if t != first => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    node.stop().await;
}
