//! Raw block claims (issue 32): a PersistentVolume with `volumeMode: Block` that a
//! container uses through `volumeDevices`, against the real containerd and the test CSI
//! driver (a file on a loop device, as csi-driver-host-path makes a block volume). Judged
//! by upstream's words and paths:
//! - `csi_block.go`'s layout under `plugins/kubernetes.io/csi/volumeDevices`: the staging
//!   path `staging/<pv>`, the publish target `publish/<pv>/<pod uid>`, the global map file
//!   `<pv>/dev/<pod uid>`, `<pv>/data/vol_data.json` with its five keys, and the pod's link
//!   `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`; the Block access type in
//!   `NodeStageVolume` and `NodePublishVolume`;
//! - `makeBlockVolumes`: the container sees a block device at its `devicePath`;
//! - `createVolumeSpec`'s mode mismatch (`volume data has volumeMode Block, but is
//!   specified in volumeMounts`) in the FailedMount text, as `kubectl describe` shows it;
//! - the operation generator's `FailedMapVolume` event (`MapVolume.MapPodDevice failed for
//!   volume "<pv>" : ` and csi_block.go's `blockMapper.publishVolumeForBlock failed: ` before
//!   the driver's error) and its `map_volume` operation in
//!   `storage_operation_duration_seconds`.
//!
//! Attacked: the data written to the device outlives the pod that wrote it; the volume
//! service SIGKILLed while a pod uses the device (nothing staged, published or unpublished
//! again, the device still answers, the container restarts onto it); a failing publish
//! (the pod waits, the running pod is untouched, and it starts once the driver answers);
//! nothing is left mounted or attached (loop devices) once the last pod goes.

use super::claims::{
    bind_to, kubectl_describe, mounts, new_claim, operation_counted, persistent_driver, restarted,
    start_with_driver,
};
use super::*;

/// A pod whose container `c` has the claim `claim` as the block device /dev/xvda (or, with
/// `as_mount`, mounted at /data, which a Block claim refuses).
fn block_pod(name: &str, node: &Node, claim: &str, as_mount: bool) -> Pod {
    let usage = if as_mount {
        json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]})
    } else {
        json!({"volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]})
    };
    let mut container = json!({"name": "c", "image": "busybox:1.36",
        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]});
    for (k, v) in usage.as_object().unwrap() {
        container[k] = v.clone();
    }
    api_pod(
        name,
        &node.name,
        json!({"spec": {
            "containers": [container],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        }}),
    )
}

/// What the container reads at the start of the device and at 4 KiB.
async fn read_device(node: &Node, pod: &str, bytes: usize) -> Result<(String, String), String> {
    let id = node
        .container_id(pod, "c")
        .await
        .ok_or_else(|| format!("no container of {pod}"))?;
    let kind = node
        .exec(&id, &["sh", "-c", "test -b /dev/xvda && echo block"])
        .await?;
    if kind.trim() != "block" {
        return Err(format!("/dev/xvda is not a block device: {kind:?}"));
    }
    let head = node
        .exec(&id, &["sh", "-c", &format!("head -c {bytes} /dev/xvda")])
        .await?;
    let at_4k = node
        .exec(
            &id,
            &[
                "sh",
                "-c",
                &format!("dd if=/dev/xvda bs=512 skip=8 count=1 2>/dev/null | head -c {bytes}"),
            ],
        )
        .await?;
    Ok((head, at_4k.trim_end_matches('\0').to_string()))
}

/// The loop devices backed by the driver's file of the volume `handle` (which must exist).
fn loops(driver: &Driver, handle: &str) -> Vec<String> {
    let file = driver
        .state_dir
        .join("volumes")
        .join(format!("{handle}.img"));
    assert!(file.exists(), "{file:?}");
    let out = std::process::Command::new("losetup")
        .arg("-j")
        .arg(&file)
        .output()
        .expect("losetup runs");
    assert!(out.status.success(), "losetup -j {file:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Whether `kubectl describe` lists a Warning event of `reason` whose message is `want`.
fn describes_warning(described: &str, reason: &str, want: &str) -> bool {
    described.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.first() == Some(&"Warning")
            && words.get(1) == Some(&reason)
            && l.trim_end().ends_with(want)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_claim_is_a_device_whose_data_outlives_its_pods() {
    if !require_runtime("csi") {
        return;
    }
    let (server, mut node, pods, mut driver) =
        start_with_driver("csi-block", persistent_driver(false), "", &["--stage"]).await;
    let client = server.client();
    let pv = format!("pv-{}", node.name);
    let handle = format!("blk-{}", node.name);
    new_claim(&client, "disk").await;
    bind_to(
        &client,
        "disk",
        &pv,
        json!({"volumeMode": "Block", "csi": {"driver": DRIVER, "volumeHandle": handle,
            "volumeAttributes": {"content": "made for disk"}}}),
    )
    .await;
    let base = node.path("root/plugins/kubernetes.io/csi/volumeDevices");
    let root = node.path("root");
    let rel = |p: &std::path::Path| p.strip_prefix(&root).unwrap().display().to_string();
    eprintln!("mounts before any pod: {:?}", mounts(&node));

    // The writer: the device is the driver's volume (its content at the start); it writes
    // at 4 KiB.
    let writer = node.pod_name("writer");
    pods.create(
        &PostParams::default(),
        &block_pod(&writer, &node, "disk", false),
    )
    .await
    .unwrap();
    eventually("the writer Ready", DEADLINE, || ready(&pods, &writer)).await;
    let (head, _) = eventually("the writer's device", DEADLINE, || {
        read_device(&node, "writer", 13)
    })
    .await;
    assert_eq!(head, "made for disk");
    let id = node.container_id("writer", "c").await.unwrap();
    node.exec(
        &id,
        &[
            "sh",
            "-c",
            "printf written-by-writer | dd of=/dev/xvda bs=512 seek=8 conv=notrunc,fsync 2>/dev/null",
        ],
    )
    .await
    .unwrap();
    let writer_uid = uid_of(&pods, &writer).await;
    let staging = base.join("staging").join(&pv);
    let publish = base.join("publish").join(&pv).join(&writer_uid);
    let global = base.join(&pv).join("dev").join(&writer_uid);
    let link = node.path(&format!(
        "root/pods/{writer_uid}/volumeDevices/kubernetes.io~csi/{pv}"
    ));
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        publish,
        "the pod's link"
    );
    let with_writer = mounts(&node);
    eprintln!("mounts with the writer: {with_writer:?}");
    assert!(with_writer.contains(&rel(&publish)), "{with_writer:?}");
    assert!(with_writer.contains(&rel(&global)), "{with_writer:?}");
    let stages = driver.calls("NodeStageVolume");
    assert_eq!(stages.len(), 1, "{stages:?}");
    assert_eq!(stages[0]["block"], true);
    assert_eq!(
        stages[0]["staging_target_path"],
        staging.display().to_string()
    );
    let publishes = driver.calls("NodePublishVolume");
    assert_eq!(publishes.len(), 1, "{publishes:?}");
    assert_eq!(publishes[0]["fs_type"], "block", "the Block access type");
    assert_eq!(publishes[0]["target_path"], publish.display().to_string());
    assert_eq!(
        publishes[0]["staging_target_path"],
        staging.display().to_string()
    );
    let record: Value =
        serde_json::from_slice(&std::fs::read(base.join(&pv).join("data/vol_data.json")).unwrap())
            .unwrap();
    assert_eq!(loops(&driver, &handle).len(), 1, "one loop device");
    assert_eq!(
        record,
        json!({"attachmentID": format!("csi-{}", super::claims::sha256_hex(&format!("{handle}{DRIVER}{}", node.name))),
               "driverName": DRIVER, "nodeName": node.name, "specVolID": pv, "volumeHandle": handle})
    );
    let plugin = format!("kubernetes.io/csi:{DRIVER}");
    eventually("the map counted", DEADLINE, || {
        operation_counted(&node, &plugin, "map_volume", "success")
    })
    .await;

    // The volume service SIGKILLed under it: nothing staged, published or unpublished
    // again; the device still answers, and the container restarts onto it.
    let calls_before = driver.log_lines("calls.log").len();
    node.signal(Service::Volume, Signal::SIGKILL).await;
    node.spawn(Service::Volume);
    node.wait_serving(Service::Volume).await;
    consistently(
        "the writer Ready, its device kept",
        Duration::from_secs(8),
        Duration::from_millis(300),
        || async {
            ready(&pods, &writer).await?;
            let changing = driver.changing_calls_since(calls_before);
            if !changing.is_empty() {
                return Err(format!("calls after the restart: {changing:?}"));
            }
            let now = mounts(&node);
            (now == with_writer)
                .then_some(())
                .ok_or_else(|| format!("{now:?}"))
        },
    )
    .await;
    let _ = node.exec(&id, &["kill", "1"]).await;
    eventually("the writer restarted and Ready", DEADLINE, || {
        restarted(&pods, &writer, 1)
    })
    .await;
    let (_, at_4k) = eventually("the restarted writer's device", DEADLINE, || {
        read_device(&node, "writer", 17)
    })
    .await;
    assert_eq!(at_4k, "written-by-writer");

    // The writer goes: unpublished, unmapped, unstaged (no pod left), the loop device
    // detached, the directories gone.
    pods.delete(&writer, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the block volume unstaged", DEADLINE, || async {
        let now = mounts(&node);
        let unstages = driver.calls("NodeUnstageVolume");
        (now.is_empty() && unstages.len() == 1 && !base.join(&pv).exists())
            .then_some(())
            .ok_or_else(|| format!("{now:?} {unstages:?}"))
    })
    .await;
    let unpublish = driver.calls("NodeUnpublishVolume");
    assert_eq!(unpublish.len(), 1, "{unpublish:?}");
    assert_eq!(unpublish[0]["target_path"], publish.display().to_string());
    assert_eq!(
        driver.calls("NodeUnstageVolume")[0]["staging_target_path"],
        staging.display().to_string()
    );
    assert!(
        !link.exists() && link.symlink_metadata().is_err(),
        "the link gone"
    );
    assert!(!staging.exists() && !publish.exists());
    assert_eq!(
        loops(&driver, &handle),
        Vec::<String>::new(),
        "loop detached"
    );
    eprintln!("mounts after the writer: {:?}", mounts(&node));

    // A reader on the claim: the writer's data is on the device.
    let reader = node.pod_name("reader");
    pods.create(
        &PostParams::default(),
        &block_pod(&reader, &node, "disk", false),
    )
    .await
    .unwrap();
    eventually("the reader Ready", DEADLINE, || ready(&pods, &reader)).await;
    let (_, at_4k) = eventually("the reader's device", DEADLINE, || {
        read_device(&node, "reader", 17)
    })
    .await;
    assert_eq!(at_4k, "written-by-writer", "the data outlived its pod");

    // The claim mounted as a filesystem: refused in upstream's words, the reader untouched.
    let mounter = node.pod_name("mounter");
    pods.create(
        &PostParams::default(),
        &block_pod(&mounter, &node, "disk", true),
    )
    .await
    .unwrap();
    let want = "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: volume data has volumeMode Block, but is specified in volumeMounts";
    eventually("the mounter's FailedMount", DEADLINE, || async {
        let described = kubectl_describe(&server, &node, &mounter).await;
        describes_warning(&described, "FailedMount", want)
            .then_some(())
            .ok_or(described)
    })
    .await;

    // A publish that fails: the pod waits with upstream's FailedMapVolume, the reader is
    // untouched, and the pod starts once the driver answers.
    driver.inject("fail-publish", Some("no device today"));
    let late = node.pod_name("late");
    pods.create(
        &PostParams::default(),
        &block_pod(&late, &node, "disk", false),
    )
    .await
    .unwrap();
    let want = format!(
        "MapVolume.MapPodDevice failed for volume {pv:?} : kubernetes.io/csi: blockMapper.publishVolumeForBlock failed: rpc error: code = Internal desc = no device today"
    );
    eventually("the late pod's FailedMapVolume", DEADLINE, || async {
        let described = kubectl_describe(&server, &node, &late).await;
        describes_warning(&described, "FailedMapVolume", &want)
            .then_some(())
            .ok_or(described)
    })
    .await;
    assert!(ready(&pods, &mounter).await.is_err(), "the mounter waits");
    ready(&pods, &reader).await.unwrap();
    driver.inject("fail-publish", None);
    eventually("the late pod Ready", DEADLINE, || ready(&pods, &late)).await;
    let (_, at_4k) = read_device(&node, "late", 17).await.unwrap();
    assert_eq!(at_4k, "written-by-writer");

    // All go: nothing mounted, nothing attached.
    for name in [&reader, &mounter, &late] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("everything unmapped and unstaged", DEADLINE, || async {
        let now = mounts(&node);
        (now.is_empty() && !base.join(&pv).exists() && loops(&driver, &handle).is_empty())
            .then_some(())
            .ok_or_else(|| format!("{now:?} {:?}", loops(&driver, &handle)))
    })
    .await;
    driver.stop();
    node.stop().await;
}
