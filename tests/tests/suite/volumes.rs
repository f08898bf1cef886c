//! configMap, secret, downwardAPI, projected (with the service-account token an API server
//! admits every pod with) and Memory emptyDir volumes, on real mounts, read by real
//! containers: content, modes and ownership, tmpfs where upstream uses it, an update seen
//! atomically, a token refreshed before it expires, a missing config map that keeps the pod
//! waiting with a FailedMount event until it appears, a volume-service kill that disturbs
//! nothing, and nothing left on the host once the pods are gone.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nodeagent_config::Service;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::{
    Node, NodeOptions, consistently, eventually, eventually_every, mounts_under, require_runtime,
};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
/// The API server grants tokens of at most this lifetime, so the refresh (at 80 %) is seen
/// within the test; above five pod-sync resync periods (10 s), as upstream's one-hour
/// tokens are far above its one-minute resync.
const TOKEN_SECONDS: i64 = 60;
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn pod(name: &str, node: &str, extra: serde_json::Value) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "demo"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]}]
        }
    });
    nodeagent_tests::apiserver::merge_patch(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

async fn sh(node: &Node, id: &str, cmd: &str) -> Result<String, String> {
    node.exec(id, &["sh", "-c", cmd]).await
}

/// How many CRI containers of the pod named `pod` run.
async fn running_containers(node: &Node, pod: &str) -> usize {
    let running = nodeagent_proto::cri::ContainerState::ContainerRunning as i32;
    node.containers()
        .await
        .into_iter()
        .filter(|c| c.labels["io.kubernetes.pod.name"] == pod && c.state == running)
        .count()
}

/// Waits until no directory and no mount is left under `<root-dir>/pods`.
async fn nothing_left_under(pods_dir: &Path) {
    eventually("nothing left under pods/", DEADLINE, || async {
        let left: Vec<_> = std::fs::read_dir(pods_dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        if left.is_empty() && mounts_under(pods_dir).is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?} {:?}", mounts_under(pods_dir)))
        }
    })
    .await;
}

async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(&format!("{name} Running"), DEADLINE, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        if phase.as_deref() == Some("Running") {
            Ok(p)
        } else {
            Err(format!("{:?}", p.status))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_pods_read_their_volumes_see_updates_and_a_refreshed_token() {
    if !require_runtime("config map, secret and projected volumes") {
        return;
    }
    let state = ApiState::default();
    state
        .service_accounts
        .set_max_expiration_seconds(Some(TOKEN_SECONDS));
    let server = ApiServer::start(state.clone(), 0).await;
    let mut node = Node::start(
        "volumes",
        NodeOptions {
            kubeconfig: Some(server.kubeconfig()),
            ..Default::default()
        },
    )
    .await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let cm = |a: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": "app-config"},
            "data": {"greeting": "hello", "a": a, "b": a}
        }))
        .unwrap()
    };
    config_maps
        .create(&PostParams::default(), &cm("v1"))
        .await
        .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "app-secret"},
        "data": {"password": "aHVudGVyMg=="}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let name = node.pod_name("vols");
    // One resolution of `..data` per round, as a reader that wants a consistent view does:
    // both files through the same version (a version removed meanwhile fails the round).
    let reader = "trap 'exit 0' TERM; \
        while true; do d=$(readlink /all/..data) && a=$(cat /all/$d/a 2>/dev/null) && \
        b=$(cat /all/$d/b 2>/dev/null) && \
        [ \"$a\" != \"$b\" ] && echo \"$a/$b\" >> /mem/mixed; sleep 0.01; done";
    let spec = json!({"spec": {
        "securityContext": {"fsGroup": 2000},
        "containers": [{"name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", reader],
            "resources": {"limits": {"memory": "64Mi"}},
            "volumeMounts": [
                {"name": "cfg", "mountPath": "/cfg"},
                {"name": "cfg", "mountPath": "/sub/greeting", "subPath": "dir/greeting"},
                {"name": "all", "mountPath": "/all"},
                {"name": "sec", "mountPath": "/sec"},
                {"name": "info", "mountPath": "/info"},
                {"name": "mem", "mountPath": "/mem"}
            ]}],
        "volumes": [
            {"name": "cfg", "configMap": {"name": "app-config",
                "items": [{"key": "greeting", "path": "dir/greeting", "mode": 0o600}]}},
            {"name": "all", "configMap": {"name": "app-config"}},
            {"name": "sec", "secret": {"secretName": "app-secret", "defaultMode": 0o400}},
            {"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory"}}
            ]}},
            {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}
        ]
    }});
    let created = pods
        .create(&PostParams::default(), &pod(&name, &node.name, spec))
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    // Admission added the kube-api-access volume: the pod runs only if it is served.
    let access = created
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|vs| vs.iter().find(|v| v.name.starts_with("kube-api-access-")))
        .map(|v| v.name.clone())
        .expect("the admitted pod has a kube-api-access volume");
    running(&pods, &name).await;
    let id = node.container_id("vols", "c").await.expect("container");

    // Content, modes and the fsGroup: 0600 | 0440 = 0640, 0400 | 0440 = 0440.
    assert_eq!(
        sh(&node, &id, "cat /cfg/dir/greeting").await.unwrap(),
        "hello"
    );
    assert_eq!(
        sh(&node, &id, "stat -L -c '%a %g' /cfg/dir/greeting")
            .await
            .unwrap()
            .trim(),
        "640 2000"
    );
    assert_eq!(
        sh(&node, &id, "cat /sec/password").await.unwrap(),
        "hunter2"
    );
    assert_eq!(
        sh(&node, &id, "stat -L -c '%a %g' /sec/password")
            .await
            .unwrap()
            .trim(),
        "440 2000"
    );
    assert_eq!(
        sh(&node, &id, "cat /info/labels").await.unwrap(),
        "app=\"demo\""
    );
    assert_eq!(sh(&node, &id, "cat /info/mem").await.unwrap(), "67108864");
    assert_eq!(
        sh(&node, &id, &format!("cat {SA_DIR}/namespace"))
            .await
            .unwrap(),
        "default"
    );
    assert_eq!(
        sh(&node, &id, &format!("cat {SA_DIR}/ca.crt"))
            .await
            .unwrap(),
        state.root_ca_pem()
    );
    let token = sh(&node, &id, &format!("cat {SA_DIR}/token"))
        .await
        .unwrap();
    let claims = state
        .service_accounts
        .verify(&token)
        .expect("a valid token");
    assert_eq!(
        claims["kubernetes.io"]["pod"]["uid"], uid,
        "bound to the pod"
    );
    // The volumes cannot be written by the container (read-only mounts).
    assert!(sh(&node, &id, "echo x > /cfg/new").await.is_err());

    // Upstream's layout; secrets, tokens and pod fields on tmpfs, config maps on disk.
    let volumes = node.path(&format!("root/pods/{uid}/volumes"));
    let mounts = mounts_under(&volumes);
    let fs_of = |plugin: &str, volume: &str| {
        let p = volumes.join(plugin).join(volume);
        mounts
            .iter()
            .find(|(m, _)| *m == p)
            .map(|(_, fs)| fs.clone())
    };
    assert_eq!(
        fs_of("kubernetes.io~secret", "sec").as_deref(),
        Some("tmpfs")
    );
    assert_eq!(
        fs_of("kubernetes.io~projected", &access).as_deref(),
        Some("tmpfs")
    );
    assert_eq!(
        fs_of("kubernetes.io~downward-api", "info").as_deref(),
        Some("tmpfs")
    );
    assert_eq!(
        fs_of("kubernetes.io~empty-dir", "mem").as_deref(),
        Some("tmpfs")
    );
    assert_eq!(fs_of("kubernetes.io~configmap", "cfg"), None);
    assert!(volumes.join("kubernetes.io~configmap/cfg/..data").exists());

    // The Memory emptyDir's sizeLimit really limits.
    let dd = sh(
        &node,
        &id,
        "dd if=/dev/zero of=/mem/big bs=1M count=16 2>&1; echo rc=$?",
    )
    .await
    .unwrap();
    assert!(
        dd.contains("No space left on device") && dd.ends_with("rc=1\n"),
        "{dd}"
    );
    let size: u64 = sh(&node, &id, "stat -c %s /mem/big")
        .await
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(size <= 8 << 20, "{size}");
    sh(&node, &id, "rm /mem/big").await.unwrap();

    // An update reaches the files within the sync period, all at once: the reader loop
    // never saw a from one version and b from another.
    config_maps
        .replace("app-config", &PostParams::default(), &cm("v2"))
        .await
        .unwrap();
    eventually("the update in the container", DEADLINE, || async {
        match sh(&node, &id, "cat /all/a /all/b").await {
            Ok(s) if s == "v2v2" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let mixed = sh(&node, &id, "cat /mem/mixed 2>/dev/null || true")
        .await
        .unwrap();
    assert_eq!(mixed, "", "a reader saw a half-applied update");

    // The token is refreshed before it expires (the API server granted 60 s).
    eventually(
        "a refreshed token in the container",
        Duration::from_secs(2 * TOKEN_SECONDS as u64),
        || async {
            let now = sh(&node, &id, &format!("cat {SA_DIR}/token")).await?;
            if now != token && state.service_accounts.verify(&now).is_ok() {
                Ok(())
            } else {
                Err("still the first token".to_string())
            }
        },
    )
    .await;

    // A config map that does not exist yet: the pod waits in ContainerCreating and a
    // FailedMount event says why (upstream's status has no message: the failure is the
    // event's, `kubectl describe` shows it), and starts once it appears.
    let waiter = node.pod_name("waiter");
    let spec = json!({"spec": {"volumes": [{"name": "late", "configMap": {"name": "later"}}],
        "containers": [{"name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            "volumeMounts": [{"name": "late", "mountPath": "/late"}]}]}});
    pods.create(&PostParams::default(), &pod(&waiter, &node.name, spec))
        .await
        .unwrap();
    let want = "MountVolume.SetUp failed for volume \"late\" : configmaps \"later\" not found";
    eventually("a FailedMount event", DEADLINE, || async {
        state
            .objects("events")
            .into_iter()
            .find(|e| {
                e["reason"] == "FailedMount"
                    && e["involvedObject"]["name"] == waiter.as_str()
                    && e["message"] == want
                    && e["type"] == "Warning"
            })
            .ok_or_else(|| "no FailedMount event yet".to_string())
    })
    .await;
    // pod-sync retries the mount every 5 s; over two tries the status stays upstream's.
    consistently(
        "the waiting container's status has no message",
        Duration::from_secs(6),
        Duration::from_millis(500),
        || async {
            let message = node
                .waiting_message("waiter", "c", "ContainerCreating", DEADLINE)
                .await;
            if message.is_empty() {
                Ok(())
            } else {
                Err(format!("message {message:?}"))
            }
        },
    )
    .await;
    let later: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "later"}, "data": {"k": "v"}
    }))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &later)
        .await
        .unwrap();
    running(&pods, &waiter).await;

    // Killing the volume service disturbs no running pod: same containers, same files,
    // and a restarted one takes up the volumes it finds (a config map change still
    // arrives, the mounts are not made twice).
    let before = node.container_id("vols", "c").await;
    node.signal(Service::Volume, nix::sys::signal::Signal::SIGKILL)
        .await;
    assert_eq!(
        sh(&node, &id, "cat /sec/password").await.unwrap(),
        "hunter2"
    );
    node.spawn(Service::Volume);
    node.wait_serving(Service::Volume).await;
    config_maps
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"greeting": "again"}})),
        )
        .await
        .unwrap();
    eventually("the update after a restart", DEADLINE, || async {
        match sh(&node, &id, "cat /cfg/dir/greeting").await {
            Ok(s) if s == "again" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // A subPath mount of it does not update, as upstream.
    assert_eq!(sh(&node, &id, "cat /sub/greeting").await.unwrap(), "hello");
    assert_eq!(node.container_id("vols", "c").await, before);
    assert_eq!(mounts_under(&volumes), mounts, "no mount added or lost");

    // Deleted pods leave nothing: no mount and no directory under <root-dir>/pods.
    for p in [&name, &waiter] {
        pods.delete(p, &DeleteParams::default()).await.unwrap();
    }
    let pods_dir = node.path("root/pods");
    nothing_left_under(&pods_dir).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_pods_get_downward_api_and_type_checked_host_paths_and_a_clear_fetch_error() {
    if !require_runtime("standalone payload volumes") {
        return;
    }
    let node = Node::start("volumes-standalone", NodeOptions::default()).await;
    let manifest = |name: &str, volume: serde_json::Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"tier": "static"}},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                "volumes": [volume]}
        })
        .to_string()
    };
    node.write_manifest(
        "info.yaml",
        &manifest(
            "info",
            json!({"name": "v", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}),
        ),
    );
    node.write_manifest(
        "cfg.yaml",
        &manifest("cfg", json!({"name": "v", "configMap": {"name": "x"}})),
    );
    // hostPath types are checked for what the path is, not only that it exists.
    node.write_manifest(
        "chr.yaml",
        &manifest(
            "chr",
            json!({"name": "v", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}),
        ),
    );
    node.write_manifest(
        "blk.yaml",
        &manifest(
            "blk",
            json!({"name": "v", "hostPath": {"path": "/dev/null", "type": "BlockDevice"}}),
        ),
    );
    let message = node
        .waiting_message("blk", "c", "ContainerCreating", DEADLINE)
        .await;
    assert_eq!(
        message,
        "MountVolume.SetUp failed for volume \"v\" : hostPath type check failed: /dev/null is not a block device, it's a CharDevice"
    );
    let message = node
        .waiting_message("cfg", "c", "ContainerCreating", DEADLINE)
        .await;
    assert_eq!(
        message,
        "MountVolume.SetUp failed for volume \"v\" : cannot get configmaps \"x\": this node runs standalone, without an API server"
    );
    let id = eventually("the info pod's container", DEADLINE, || async {
        node.container_id("info", "c")
            .await
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let labels = eventually("the labels file", DEADLINE, || async {
        node.exec(&id, &["cat", "/v/labels"]).await
    })
    .await;
    assert_eq!(labels, "tier=\"static\"");
    let chr = eventually("the chr pod's container", DEADLINE, || async {
        node.container_id("chr", "c")
            .await
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let stat = eventually(
        "the character device in the container",
        DEADLINE,
        || async { node.exec(&chr, &["stat", "-c", "%F", "/v"]).await },
    )
    .await;
    assert_eq!(stat.trim(), "character special file");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_service_kills_during_set_up_disturb_no_running_pod_and_every_set_up_finishes() {
    if !require_runtime("volume service kills during set-up") {
        return;
    }
    let (server, mut node) =
        Node::start_with_api_server("volumes-kill", NodeOptions::default()).await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // Many keys, so that a set-up takes a while and a kill lands inside it.
    let data: serde_json::Map<String, serde_json::Value> = (0..200)
        .map(|i| (format!("key{i}"), json!(format!("value{i}"))))
        .collect();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "many"}, "data": data})).unwrap();
    config_maps
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let spec = json!({"spec": {
        "volumes": [
            {"name": "cfg", "configMap": {"name": "many"}},
            {"name": "mem", "emptyDir": {"medium": "Memory"}},
            {"name": "proj", "projected": {"sources": [{"configMap": {"name": "many"}},
                {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}]}}
        ],
        "containers": [{"name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}, {"name": "mem", "mountPath": "/mem"},
                {"name": "proj", "mountPath": "/proj"}]}]
    }});
    let first = node.pod_name("first");
    pods.create(
        &PostParams::default(),
        &pod(&first, &node.name, spec.clone()),
    )
    .await
    .unwrap();
    running(&pods, &first).await;
    let first_id = node.container_id("first", "c").await.unwrap();
    let mut rng = nodeagent_tests::chaos::Rng::new(10);
    let mut names = vec![first.clone()];
    for round in 0..6 {
        let base = format!("set-up{round}");
        let name = node.pod_name(&base);
        let created = pods
            .create(
                &PostParams::default(),
                &pod(&name, &node.name, spec.clone()),
            )
            .await
            .unwrap();
        // The kill lands inside the set-up: as soon as the first volume directory exists,
        // or after the first of a seeded random number of checks finds it.
        let uid = created.metadata.uid.unwrap();
        let volumes = node.path(&format!("root/pods/{uid}/volumes"));
        let extra_checks = rng.below(3);
        let mut checks = 0;
        eventually_every(
            "the set-up under way",
            DEADLINE,
            Duration::from_millis(1),
            || {
                checks += u64::from(volumes.exists());
                let ready = checks > extra_checks;
                async move {
                    if ready {
                        Ok(())
                    } else {
                        Err("not yet".to_string())
                    }
                }
            },
        )
        .await;
        node.signal(Service::Volume, nix::sys::signal::Signal::SIGKILL)
            .await;
        node.spawn(Service::Volume);
        node.wait_serving(Service::Volume).await;
        running(&pods, &name).await;
        let id = node.container_id(&base, "c").await.unwrap();
        for n in [0, 199] {
            assert_eq!(
                sh(&node, &id, &format!("cat /cfg/key{n} /proj/key{n}"))
                    .await
                    .unwrap(),
                format!("value{n}value{n}")
            );
        }
        assert_eq!(sh(&node, &id, "cat /proj/name").await.unwrap(), name);
        // The running pod did not notice.
        assert_eq!(
            node.container_id("first", "c").await.as_ref(),
            Some(&first_id)
        );
        assert_eq!(
            sh(&node, &first_id, "cat /cfg/key7").await.unwrap(),
            "value7"
        );
        names.push(name);
    }
    // Each tmpfs volume is mounted once, however many set-ups were cut short.
    let pods_dir = node.path("root/pods");
    let mounts = mounts_under(&pods_dir);
    assert_eq!(
        mounts.len(),
        3 * names.len(),
        "per pod one Memory emptyDir, one projected volume and kube-api-access: {mounts:?}"
    );
    for name in &names {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    nothing_left_under(&pods_dir).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_dir_over_its_size_limit_evicts_its_pod_and_only_it_for_good() {
    if !require_runtime("emptyDir sizeLimit eviction") {
        return;
    }
    let (server, mut node) =
        Node::start_with_api_server("volumes-evict", NodeOptions::default()).await;
    let state = server.state.clone();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let spec = |command: &str| {
        json!({"spec": {
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}],
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", command],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]
        }})
    };
    let hog = node.pod_name("hog");
    let quiet = node.pod_name("quiet");
    let forever = "trap 'exit 0' TERM; while true; do sleep 0.2; done";
    pods.create(
        &PostParams::default(),
        &pod(
            &quiet,
            &node.name,
            spec(&format!("echo small > /scratch/f; {forever}")),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod(
            &hog,
            &node.name,
            spec(&format!(
                "dd if=/dev/zero of=/scratch/big bs=1M count=4; {forever}"
            )),
        ),
    )
    .await
    .unwrap();
    let quiet_id = {
        running(&pods, &quiet).await;
        node.container_id("quiet", "c").await.unwrap()
    };
    let message = "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ";
    let evicted = eventually("the hog evicted", Duration::from_secs(90), || async {
        let p = pods.get(&hog).await.map_err(|e| e.to_string())?;
        let s = p.status.clone().unwrap_or_default();
        if s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted") {
            Ok(s)
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;
    assert_eq!(evicted.message.as_deref(), Some(message));
    let disruption = evicted
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("a DisruptionTarget condition");
    assert_eq!(disruption.status, "True");
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    eventually("an Evicted event", DEADLINE, || async {
        state
            .objects("events")
            .into_iter()
            .find(|e| {
                e["reason"] == "Evicted"
                    && e["involvedObject"]["name"] == hog.as_str()
                    && e["message"] == message
            })
            .ok_or_else(|| "no Evicted event".to_string())
    })
    .await;
    eventually("the hog's container stopped", DEADLINE, || async {
        match running_containers(&node, &hog).await {
            0 => Ok(()),
            n => Err(format!("{n} running")),
        }
    })
    .await;
    // Evicted for good: even once its volume is back under the limit, a pod-sync restart
    // neither runs it again nor changes its phase (upstream never reruns a terminal pod).
    let hog_uid = pods.get(&hog).await.unwrap().metadata.uid.unwrap();
    std::fs::remove_file(node.path(&format!(
        "root/pods/{hog_uid}/volumes/kubernetes.io~empty-dir/scratch/big"
    )))
    .unwrap();
    let created_before = node.container_ids(&hog).await;
    node.signal(Service::PodSync, nix::sys::signal::Signal::SIGKILL)
        .await;
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    eventually("pod-sync lists both pods again", DEADLINE, || async {
        let hog_pod = node.pod("hog").await?;
        node.pod("quiet").await?;
        if hog_pod["status"]["phase"] == "Failed" && hog_pod["status"]["reason"] == "Evicted" {
            Ok(())
        } else {
            Err(hog_pod["status"].to_string())
        }
    })
    .await;
    // Two resync periods (10 s each) later, still nothing of it runs.
    let resynced = std::time::Instant::now();
    eventually("two resyncs after the restart", DEADLINE, || async {
        if running_containers(&node, &hog).await != 0 {
            panic!("the evicted pod runs again");
        }
        if resynced.elapsed() > Duration::from_secs(20) {
            Ok(())
        } else {
            Err("waiting".to_string())
        }
    })
    .await;
    assert_eq!(
        node.container_ids(&hog).await,
        created_before,
        "no container of the evicted pod was created again"
    );
    let p = pods.get(&hog).await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Failed"));
    // The other pod was never touched.
    assert_eq!(node.container_id("quiet", "c").await, Some(quiet_id));
    assert_eq!(
        pods.get(&quiet)
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
    node.stop().await;
}
