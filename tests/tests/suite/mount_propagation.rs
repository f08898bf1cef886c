//! Mount propagation as the CRI enum defines it (kubernetes/cri-api `MountPropagation`:
//! PRIVATE 0, HOST_TO_CONTAINER 1 = rslave, BIDIRECTIONAL 2 = rshared), attacked from a
//! container and judged from the host's own mountinfo:
//! - an unprivileged container with `HostToContainer` that mounts under its hostPath does
//!   not put that mount on the host (it did when the enum was swapped: the container got
//!   rshared), while a mount the host makes later does reach it;
//! - `Bidirectional` in an unprivileged container is refused with upstream's validation
//!   error (`validateMountPropagation`), static pods included, and nothing runs;
//! - a privileged container's `Bidirectional` mount does reach the host, as upstream
//!   documents.

use nix::mount::{MsFlags, mount};
use nodeagent_tests::{Node, NodeOptions, eventually, mount_points_under, require_runtime};
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

/// A static pod whose container `c` mounts a tmpfs at `/h/<inner>` (the hostPath `dir`,
/// with `mode` propagation), then sleeps.
fn mounter(name: &str, dir: &Path, mode: &str, privileged: bool, inner: &str) -> String {
    let security = if privileged {
        "{privileged: true}".to_string()
    } else {
        // Enough to call mount(2), and still not privileged.
        "{capabilities: {add: [SYS_ADMIN]}}".to_string()
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    securityContext: {security}\n    command: [\"sh\", \"-c\", \"mkdir -p /h/{inner} && mount -t tmpfs tmpfs /h/{inner} && touch /h/{inner}/made; sleep 3600\"]\n    volumeMounts:\n    - name: h\n      mountPath: /h\n      mountPropagation: {mode}\n  volumes:\n  - name: h\n    hostPath: {{path: {dir}, type: Directory}}\n",
        dir = dir.display()
    )
}

/// The container's own mount table (its /proc/self/mountinfo), through CRI exec.
async fn container_mounts(node: &Node, pod: &str) -> Result<String, String> {
    let id = node
        .container_id(pod, "c")
        .await
        .ok_or("no container yet")?;
    node.exec(&id, &["cat", "/proc/self/mountinfo"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_to_container_never_reaches_the_host_and_bidirectional_needs_privilege() {
    if !require_runtime("mount propagation") {
        return;
    }
    let node = Node::start("propagation", NodeOptions::default()).await;
    // The hostPath is a shared mount, as a node's /var/lib/kubelet is (upstream makes its
    // root dir rshared): the runtime needs that for rslave and rshared.
    let shared = node.path("shared");
    std::fs::create_dir_all(&shared).unwrap();
    mount(
        Some(&shared),
        &shared,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("bind the shared dir");
    mount(
        None::<&str>,
        &shared,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .expect("make it rshared");

    // 1. HostToContainer, unprivileged (with SYS_ADMIN): the container's mount stays its own.
    node.write_manifest(
        "slave.yaml",
        &mounter("slave", &shared, "HostToContainer", false, "from-slave"),
    );
    eventually("the container's own tmpfs mounted", DEADLINE, || async {
        let mounts = container_mounts(&node, "slave").await?;
        mounts
            .lines()
            .any(|l| l.contains(" /h/from-slave ") && l.contains(" - tmpfs "))
            .then_some(())
            .ok_or(mounts)
    })
    .await;
    // Propagation happens inside mount(2): once the container has the mount, the host would
    // already have it too.
    let inner = shared.join("from-slave");
    assert!(
        !mount_points_under(&shared).contains(&inner),
        "a HostToContainer container's mount reached the host: {:?}",
        mount_points_under(&shared)
    );
    assert!(
        !inner.join("made").exists(),
        "the container wrote through its own tmpfs onto the host"
    );
    // And the host's mounts do reach it (rslave, not private).
    let from_host = shared.join("from-host");
    std::fs::create_dir_all(&from_host).unwrap();
    mount(
        Some("tmpfs"),
        &from_host,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .expect("mount on the host");
    eventually(
        "the host's mount seen in the container",
        DEADLINE,
        || async {
            let mounts = container_mounts(&node, "slave").await?;
            mounts
                .lines()
                .any(|l| l.contains(" /h/from-host "))
                .then_some(())
                .ok_or(mounts)
        },
    )
    .await;

    // 2. Bidirectional, unprivileged: refused at the source with upstream's words.
    node.write_manifest(
        "bidi.yaml",
        &mounter("bidi", &shared, "Bidirectional", false, "from-bidi"),
    );
    let line = node.refused_manifest("bidi.yaml", DEADLINE).await;
    assert!(
        line.contains(
            "spec.containers[0].volumeMounts[0].mountPropagation: Forbidden: Bidirectional mount propagation is available only to privileged containers"
        ),
        "{line}"
    );

    // 3. Bidirectional, privileged: its mount reaches the host, as documented upstream.
    node.write_manifest(
        "shared.yaml",
        &mounter("shared", &shared, "Bidirectional", true, "from-privileged"),
    );
    let privileged = shared.join("from-privileged");
    eventually(
        "the privileged container's mount on the host",
        DEADLINE,
        || async {
            let points = mount_points_under(&shared);
            points
                .contains(&privileged)
                .then_some(())
                .ok_or(format!("{points:?}"))
        },
    )
    .await;
    // The refused pod never ran, and the first one is untouched.
    assert_eq!(node.container_id("bidi", "c").await, None);
    assert!(node.pod("bidi").await.is_err(), "the refused pod is listed");
    assert!(!shared.join("from-bidi").exists());
    node.stop().await;
}
