//! The image GC against the real containerd: above `imageGCHighThresholdPercent` unused
//! images are removed, never one a container uses, the sandbox (pause) image, or one younger
//! than `imageMinimumGCAge`; when not enough can be freed the node gets upstream's
//! `FreeDiskSpaceFailed` event; the image records survive a pod-sync restart. Needs root and
//! containerd.
//!
//! The thresholds (1 % / 0 %) make every unused image of the shared containerd a candidate:
//! busybox is kept by the harness's holder pod (made over CRI before the node starts, as
//! for every node that may collect images) and then by the keeper pod, the pause image by
//! its own protection; the test checks both, and a failing run puts the runtime's images
//! back (`RepairOnFailure`) so that the tests after it can run.

use k8s_openapi::api::core::v1::Event;
use nodeagent_config::Service;
use nodeagent_proto::cri::{ImageSpec, PullImageRequest};
use nodeagent_tests::registry::{Image, Registry, image_status, nonce, remove_images};
use nodeagent_tests::{BUSYBOX, Node, NodeOptions, eventually, eventually_event, require_runtime};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);
const PAUSE: &str = "registry.k8s.io/pause:3.9";

async fn present(node: &Node, image: &str) -> bool {
    image_status(&node.cri, image).await.is_some()
}

async fn pull(node: &Node, image: &str) {
    let mut images = node.cri.image.clone();
    images
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("PullImage");
}

/// The runtime's own images must survive.
async fn assert_runtime_images_kept(node: &Node) {
    let mut missing = Vec::new();
    for image in [PAUSE, BUSYBOX] {
        if !present(node, image).await {
            missing.push(image);
        }
    }
    assert!(missing.is_empty(), "the image GC removed {missing:?}");
}

/// On a failure (whatever failed), imports the runtime's images again: if the GC took
/// one, every test after this one would fail on it.
struct RepairOnFailure;

impl Drop for RepairOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::process::Command::new("bash")
                .arg("deploy/runtime/setup.sh")
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .env("NODEAGENT_FORCE_IMAGES", "1")
                .status();
        }
    }
}

fn first_detected(node: &Node, image_id: &str) -> Option<u64> {
    let text = std::fs::read_to_string(node.path("root/pod-sync/images.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v[image_id]["first_detected"].as_u64()
}

async fn image_id(node: &Node, image: &str) -> String {
    image_status(&node.cri, image).await.expect("present").id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_are_collected_and_used_ones_never() {
    if !require_runtime("image GC") {
        return;
    }
    let _repair = RepairOnFailure;
    let unused_a = Registry::start("gc/unused-a", "v1", Image::busybox(&nonce()), "", "").await;
    let unused_b = Registry::start("gc/unused-b", "v1", Image::busybox(&nonce()), "", "").await;
    let used = Registry::start("gc/used", "v1", Image::busybox(&nonce()), "", "").await;
    let options = NodeOptions {
        no_services: true,
        extra_config: "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\n\
                       imageMinimumGCAge: 20s\n"
            .into(),
        service_args: vec![(Service::PodSync, vec!["--image-gc-period=2s".into()])],
        ..Default::default()
    };
    let (server, mut node) = Node::start_with_api_server("imagegc", options).await;
    // A pod that uses busybox from the start (before the first pass can act).
    node.write_manifest(
        "keeper.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: keeper\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n",
    );
    for s in Service::ALL {
        node.spawn(s);
    }
    eventually("the keeper running", DEADLINE, || async {
        node.container_id("keeper", "main")
            .await
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    pull(&node, &unused_a.image_ref()).await;
    pull(&node, &unused_b.image_ref()).await;
    node.write_manifest(
        "user.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: user\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n",
            used.image_ref()
        ),
    );
    eventually("the user pod running", DEADLINE, || async {
        node.container_id("user", "main")
            .await
            .ok_or_else(|| "not yet".to_string())
    })
    .await;

    eventually("the unused images collected", DEADLINE, || async {
        let a = present(&node, &unused_a.image_ref()).await;
        let b = present(&node, &unused_b.image_ref()).await;
        if !a && !b {
            Ok(())
        } else {
            Err(format!("unused-a present: {a}, unused-b present: {b}"))
        }
    })
    .await;
    assert_runtime_images_kept(&node).await;
    assert!(
        present(&node, &used.image_ref()).await,
        "an image in use was collected"
    );

    // Not everything could be freed (the thresholds ask for the whole disk).
    let name = node.name.clone();
    let event: Event = eventually_event(
        &server.client(),
        "default",
        "the FreeDiskSpaceFailed event",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FreeDiskSpaceFailed")
                && e.involved_object.name.as_deref() == Some(name.as_str())
        },
    )
    .await;
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("Failed to garbage collect required amount of images. Attempted to free "),
        "{event:?}"
    );

    // The records survive a restart: busybox keeps the time it was first seen.
    let busybox_id = image_id(&node, BUSYBOX).await;
    let seen = eventually("busybox recorded", DEADLINE, || async {
        first_detected(&node, &busybox_id).ok_or_else(|| "no record".to_string())
    })
    .await;
    node.signal(Service::PodSync, nix::sys::signal::Signal::SIGKILL)
        .await;
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    let log_before = node.log(Service::PodSync).len();
    eventually("a GC pass after the restart", DEADLINE, || async {
        // The pass rewrites the records; the keeper's image is still recorded as before.
        let log = node.log(Service::PodSync);
        if log.len() > log_before && first_detected(&node, &busybox_id) == Some(seen) {
            Ok(())
        } else {
            Err(format!(
                "first_detected {:?}",
                first_detected(&node, &busybox_id)
            ))
        }
    })
    .await;
    assert_eq!(first_detected(&node, &busybox_id), Some(seen));

    // Once its pod is gone, the used image is collected too.
    node.remove_manifest("user.yaml");
    eventually("the formerly used image collected", DEADLINE, || async {
        if present(&node, &used.image_ref()).await {
            Err("still present".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    assert_runtime_images_kept(&node).await;
    let cri = node.cri.clone();
    node.stop().await;
    for repo in ["gc/unused-a", "gc/unused-b", "gc/used"] {
        remove_images(&cri, repo).await;
    }
}
