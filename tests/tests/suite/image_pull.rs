//! Image pulls from a private registry (`nodeagent_tests::registry`, basic auth over plain
//! HTTP on 127.0.0.1) by the real containerd, with the credentials pod-sync passes over
//! CRI: a pod's `imagePullSecrets` (both secret types, tried in order, a missing one
//! skipped with upstream's event) and the node's own `<root-dir>/config.json`. Without a
//! credential the registry's 401 reaches the pod's status as `ErrImagePull`, and a pod
//! whose credential is refused does not run the copy another pod pulled.

use base64::Engine;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use nodeagent_config::Service;
use nodeagent_cri::Cri;
use nodeagent_tests::registry::{Image, Registry, nonce, remove_images};
use nodeagent_tests::{Node, NodeOptions, eventually, eventually_event, require_runtime};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn pod(name: &str, node: &str, image: &str, pull_secrets: &[&str]) -> Pod {
    let secrets: Vec<_> = pull_secrets.iter().map(|s| json!({"name": s})).collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "imagePullSecrets": secrets,
            "containers": [{
                "name": "c", "image": image, "imagePullPolicy": "Always",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
            }]
        }
    }))
    .unwrap()
}

fn secret(name: &str, ty: &str, key: &str, body: serde_json::Value) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "type": ty,
        "data": {key: b64(&body.to_string())}
    }))
    .unwrap()
}

/// The waiting reason and message of the pod's container, as the API server has them.
async fn waiting(pods: &Api<Pod>, name: &str) -> Result<(String, String), String> {
    let p = pods.get(name).await.map_err(|e| e.to_string())?;
    let state = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|cs| cs.into_iter().next())
        .and_then(|c| c.state)
        .ok_or("no container status yet")?;
    if state.running.is_some() {
        return Err("running".into());
    }
    let shown = format!("{state:?}");
    let w = state.waiting.ok_or(shown)?;
    Ok((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
}

/// Waits until the pod's container waits on its image with the registry's 401 in the
/// message: ErrImagePull, or the ImagePullBackOff that follows at once (whose message
/// carries the failed pull's, as upstream's does).
async fn wait_unauthorized(pods: &Api<Pod>, name: &str) -> String {
    eventually(
        &format!("{name} waiting on its image with 401 Unauthorized"),
        DEADLINE,
        || async {
            let (reason, message) = waiting(pods, name).await?;
            if (reason == "ErrImagePull" || reason == "ImagePullBackOff")
                && message.contains("401 Unauthorized")
            {
                Ok(message)
            } else {
                Err(format!("{reason}: {message}"))
            }
        },
    )
    .await
}

async fn wait_running(pods: &Api<Pod>, name: &str) {
    eventually(&format!("{name} running"), DEADLINE, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        if nodeagent_tests::is_running(&serde_json::to_value(&p).unwrap(), "c") {
            Ok(())
        } else {
            Err(format!("{:?}", p.status))
        }
    })
    .await;
}

/// Whether containerd has an image of that name.
async fn image_present(cri: &Cri, image: &str) -> bool {
    nodeagent_tests::registry::image_status(cri, image)
        .await
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_secrets_open_a_private_registry_and_a_refused_one_runs_nothing() {
    if !require_runtime("image pull secrets") {
        return;
    }
    let marker = nonce();
    let registry = Registry::start(
        "private/busybox",
        "1.36",
        Image::busybox(&marker),
        "puller",
        "s3cret-pw",
    )
    .await;
    let image = registry.image_ref();
    let (server, node) = Node::start_with_api_server("pullsecret", NodeOptions::default()).await;
    remove_images(&node.cri, "private/busybox").await;
    assert!(!image_present(&node.cri, &image).await);
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");

    // No credential: an anonymous pull, refused.
    let anon = format!("anon-{}", node.name);
    pods.create(&PostParams::default(), &pod(&anon, &node.name, &image, &[]))
        .await
        .unwrap();
    let message = wait_unauthorized(&pods, &anon).await;
    assert!(message.contains(&image), "{message}");
    let log = registry.requests();
    assert!(
        log.iter().all(|r| r.user.is_none() && r.status == 401),
        "{log:?}"
    );

    // A dockerconfigjson secret with the right password (`auth`), after a legacy dockercfg
    // secret with a wrong one (username/password) and a secret that does not exist: the
    // missing one is skipped with upstream's event, the credentials are tried in order.
    secrets
        .create(
            &PostParams::default(),
            &secret(
                "regcred",
                "kubernetes.io/dockerconfigjson",
                ".dockerconfigjson",
                json!({"auths": {registry.host(): {"auth": b64("puller:s3cret-pw")}}}),
            ),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret(
                "wrongcred",
                "kubernetes.io/dockercfg",
                ".dockercfg",
                json!({format!("http://{}", registry.host()): {"username": "intruder", "password": "guess"}}),
            ),
        )
        .await
        .unwrap();
    let authed = format!("authed-{}", node.name);
    pods.create(
        &PostParams::default(),
        &pod(
            &authed,
            &node.name,
            &image,
            &["absent", "wrongcred", "regcred"],
        ),
    )
    .await
    .unwrap();
    wait_running(&pods, &authed).await;
    assert!(image_present(&node.cri, &image).await);
    let anon_failures_at_authed = node
        .log(Service::PodSync)
        .lines()
        .filter(|l| {
            l.contains(&format!("k8s.pod.name=\"{anon}\"")) && l.contains("reason=\"ErrImagePull\"")
        })
        .count();
    let id = node.container_id("authed", "c").await.expect("a container");
    assert_eq!(
        node.exec(&id, &["cat", "/etc/registry-marker"]).await,
        Ok(marker.clone()),
        "the container runs the registry's image"
    );
    let log = registry.requests();
    let refused_intruder = log
        .iter()
        .position(|r| r.user.as_deref() == Some("intruder") && r.status == 401);
    let layer = format!(
        "/v2/private/busybox/blobs/{}",
        registry.image().layer_digest
    );
    let fetched_layer = log.iter().position(|r| {
        r.user.as_deref() == Some("puller")
            && r.status == 200
            && r.method == "GET"
            && r.path == layer
    });
    assert!(
        matches!((refused_intruder, fetched_layer), (Some(a), Some(b)) if a < b),
        "the wrong credential first, then the layer with the right one: {log:?}"
    );
    eventually_event(
        &client,
        "default",
        "the FailedToRetrieveImagePullSecret event",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedToRetrieveImagePullSecret")
                && e.involved_object.name.as_deref() == Some(authed.as_str())
                && e.message.as_deref().is_some_and(|m| m.contains("(absent)"))
        },
    )
    .await;

    // Only the wrong password: refused, although the image is now on the node (Always
    // pulls, and a refused pull does not fall back to another pod's copy).
    let wrong = format!("wrong-{}", node.name);
    pods.create(
        &PostParams::default(),
        &pod(&wrong, &node.name, &image, &["wrongcred"]),
    )
    .await
    .unwrap();
    wait_unauthorized(&pods, &wrong).await;
    // The anonymous pod, retried after its back-off, still does not run either.
    let anon_failures = || {
        node.log(Service::PodSync)
            .lines()
            .filter(|l| {
                l.contains(&format!("k8s.pod.name=\"{anon}\""))
                    && l.contains("reason=\"ErrImagePull\"")
                    && l.contains("401 Unauthorized")
            })
            .count()
    };
    let before = anon_failures_at_authed;
    eventually(
        "an anonymous retry after the image arrived",
        DEADLINE,
        || async {
            let now = anon_failures();
            if now > before {
                Ok(())
            } else {
                Err(format!("{now} refused anonymous pulls"))
            }
        },
    )
    .await;
    wait_unauthorized(&pods, &anon).await;
    assert!(node.container_id("wrong", "c").await.is_none());
    assert!(node.container_id("anon", "c").await.is_none());
    let log = registry.requests();
    assert!(
        log.iter()
            .all(|r| r.user.as_deref() == Some("puller") || r.status == 401),
        "only the right credential got anything: {log:?}"
    );

    let cri = node.cri.clone();
    node.stop().await;
    remove_images(&cri, "private/busybox").await;
    assert!(!image_present(&cri, &image).await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_credential_file_opens_a_private_registry() {
    if !require_runtime("node image credentials") {
        return;
    }
    let marker = nonce();
    let registry = Registry::start(
        "private/nodecred",
        "1.36",
        Image::busybox(&marker),
        "node-puller",
        "n0de-pw",
    )
    .await;
    let image = registry.image_ref();
    let (server, node) = Node::start_with_api_server("nodecred", NodeOptions::default()).await;
    remove_images(&node.cri, "private/nodecred").await;
    assert!(!image_present(&node.cri, &image).await);
    // <root-dir>/config.json, with a scheme and a path prefix in its key; beside it a
    // .dockercfg that upstream never reads while a valid config.json is found first.
    std::fs::write(
        node.path("root/config.json"),
        json!({"auths": {format!("http://{}/private", registry.host()): {"auth": b64("node-puller:n0de-pw")}}})
            .to_string(),
    )
    .unwrap();
    std::fs::write(
        node.path("root/.dockercfg"),
        json!({registry.host(): {"username": "stale", "password": "old"}}).to_string(),
    )
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let name = format!("nodecred-{}", node.name);
    pods.create(&PostParams::default(), &pod(&name, &node.name, &image, &[]))
        .await
        .unwrap();
    wait_running(&pods, &name).await;
    let id = node
        .container_id("nodecred", "c")
        .await
        .expect("a container");
    assert_eq!(
        node.exec(&id, &["cat", "/etc/registry-marker"]).await,
        Ok(marker)
    );
    let log = registry.requests();
    let layer = format!(
        "/v2/private/nodecred/blobs/{}",
        registry.image().layer_digest
    );
    assert!(
        log.iter().any(|r| r.user.as_deref() == Some("node-puller")
            && r.status == 200
            && r.path == layer),
        "{log:?}"
    );
    assert!(
        log.iter().all(|r| r.user.as_deref() != Some("stale")),
        ".dockercfg was read although config.json is valid: {log:?}"
    );
    let cri = node.cri.clone();
    node.stop().await;
    remove_images(&cri, "private/nodecred").await;
    assert!(!image_present(&cri, &image).await);
    server.stop().await;
}

/// A static pod running `image` (pulled anew: `Always`).
fn static_pod(name: &str, image: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": image, "imagePullPolicy": "Always",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
            }]
        }
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_pull_is_not_cut_short_by_the_runtime_request_timeout() {
    if !require_runtime("a slow pull") {
        return;
    }
    let options = NodeOptions {
        extra_config: "runtimeRequestTimeout: 5s\n".into(),
        ..Default::default()
    };
    let node = Node::start("slow-pull", options).await;
    let registry = Registry::start("slow/busybox", "v1", Image::busybox(&nonce()), "", "").await;
    remove_images(&node.cri, "slow/busybox").await;
    // Each blob takes 8 s to come: longer than every other CRI call may take, not a pull
    // (upstream gives PullImage no deadline). Before, every pull failed at 5 s.
    registry.delay_blobs(Duration::from_secs(8));
    node.write_manifest("slow.json", &static_pod("slow", &registry.image_ref()));
    eventually("the slowly pulled image running", DEADLINE, || async {
        let p = node.pod("slow").await?;
        if nodeagent_tests::is_running(&p, "c") {
            Ok(())
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    node.remove_manifest("slow.json");
    eventually("the pod gone", DEADLINE, || async {
        match node.pod("slow").await {
            Err(e) if e.contains("is not listed") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    remove_images(&node.cri, "slow/busybox").await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_pull_holds_back_no_other_pod_and_its_pod_is_removed_at_once() {
    if !require_runtime("a hung pull") {
        return;
    }
    let node = Node::start("hung-pull", NodeOptions::default()).await;
    let registry = Registry::start("hung/busybox", "v1", Image::busybox(&nonce()), "", "").await;
    remove_images(&node.cri, "hung/busybox").await;
    registry.delay_blobs(Duration::from_secs(3600));
    node.write_manifest("hung.json", &static_pod("hung", &registry.image_ref()));
    eventually("the pull under way, the pod listed", DEADLINE, || async {
        let listed = node.pod("hung").await.is_ok();
        if listed && registry.blobs_asked() > 0 {
            Ok(())
        } else {
            Err("no blob asked for yet".to_string())
        }
    })
    .await;
    // Another pod starts meanwhile: the hung pull holds back only its own pod.
    node.write_manifest(
        "beside.json",
        &static_pod("beside", "busybox:1.36").replace("\"Always\"", "\"IfNotPresent\""),
    );
    eventually("a pod beside the hung pull running", DEADLINE, || async {
        let p = node.pod("beside").await?;
        nodeagent_tests::is_running(&p, "c")
            .then_some(())
            .ok_or_else(|| p["status"].to_string())
    })
    .await;
    node.remove_manifest("beside.json");
    // The pod goes although its pull never ends: the pull is cancelled with it (before,
    // its worker waited out runtimeRequestTimeout, 2 minutes).
    node.remove_manifest("hung.json");
    eventually("the pod gone", Duration::from_secs(30), || async {
        match node.pod("hung").await {
            Err(e) if e.contains("is not listed") => Ok(()),
            Err(e) => Err(e),
            Ok(p) => Err(p["status"].to_string()),
        }
    })
    .await;
    eventually("its sandbox removed", DEADLINE, || async {
        let left = node.sandboxes().await.len();
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} sandboxes"))
        }
    })
    .await;
    remove_images(&node.cri, "hung/busybox").await;
    node.stop().await;
}
