//! Hostile files in the static pod directory: a FIFO and a 100 MiB sparse file get
//! nothing. Before, opening the FIFO blocked config-source's scan for ever (on an async
//! worker) while its health still said ok, so no later manifest was ever read.

use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, http_get, require_runtime};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn sleeper(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n"
    )
}

/// The CRI container id of pod `name`'s container, once it runs.
async fn running_container(node: &Node, name: &str) -> String {
    let full = node.pod_name(name);
    eventually(&format!("{full} running in CRI"), DEADLINE, || async {
        let running = nodeagent_proto::cri::ContainerState::ContainerRunning as i32;
        node.containers()
            .await
            .into_iter()
            .find(|c| c.labels.get("io.kubernetes.pod.name") == Some(&full) && c.state == running)
            .map(|c| c.id)
            .ok_or_else(|| "not running yet".to_string())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_and_a_huge_sparse_file_in_the_manifest_dir_hang_nothing() {
    if !require_runtime("a_fifo_and_a_huge_sparse_file...") {
        return;
    }
    let node = Node::start("fifo", NodeOptions::default()).await;
    node.write_manifest("one.yaml", &sleeper("one"));
    let one = running_container(&node, "one").await;

    let fifo = node.path("manifests/pipe.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let sparse = node.path("manifests/huge.yaml");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    // config-source is still reading: a manifest added afterwards starts its pod.
    node.write_manifest("two.yaml", &sleeper("two"));
    running_container(&node, "two").await;

    let fifo_shown = fifo.display().to_string();
    let sparse_shown = sparse.display().to_string();
    eventually("both files reported", DEADLINE, || async {
        let log = node.log(Service::ConfigSource);
        let fifo_line = log.lines().any(|l| {
            l.contains(&fifo_shown) && l.contains("not a regular file but a FIFO; skipped")
        });
        let sparse_line = log
            .lines()
            .any(|l| l.contains(&sparse_shown) && l.contains("104857600 bytes; the limit is"));
        if fifo_line && sparse_line {
            Ok(())
        } else {
            Err(format!("fifo {fifo_line} sparse {sparse_line}"))
        }
    })
    .await;

    // Healthy, as it truly is: gRPC health and /healthz.
    node.wait_serving(Service::ConfigSource).await;
    let (code, body) = http_get(node.healthz_port, "/healthz").await.unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
    // The first pod was never disturbed.
    assert_eq!(running_container(&node, "one").await, one);
    node.stop().await;
}
