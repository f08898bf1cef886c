//! The node's API through restarts, as a monitoring client polling `/pods` sees it. The
//! chaos suite's CI run of stop 38 failed here: after a cycle that killed http-server and
//! pod-sync together, the restarted http-server instance answered `/pods` with 503 until
//! pod-sync was back (it had no list of its own to serve yet) while the other instance
//! sharing the port answered 200, and a poll landing on it failed. Upstream's kubelet is one
//! process whose restart refuses connections for seconds; our promise (README: any one
//! process restarts with every pod's status view intact) is that a poll is answered.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_asked_of_an_http_server_started_while_pod_sync_is_away_waits_for_its_list() {
    if !require_runtime("/pods while http-server and pod-sync restart together") {
        return;
    }
    let mut node = Node::start("api-restart", NodeOptions::default()).await;
    node.write_manifest(
        "web.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n",
    );
    let id = node
        .running_container("web", "c", Duration::from_secs(90))
        .await;

    // Both go down at once; http-server comes back first, pod-sync only once a request is
    // on its way to the new http-server (written to the socket, so it is the server's).
    node.signal(Service::HttpServer, Signal::SIGKILL).await;
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.spawn(Service::HttpServer);
    let port = node.read_only_port;
    let mut stream = eventually(
        "the restarted http-server's read-only port",
        Duration::from_secs(30),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    stream
        .write_all(b"GET /pods HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let answer = tokio::spawn(async move {
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.map(|_| raw)
    });
    node.spawn(Service::PodSync);
    let raw = tokio::time::timeout(Duration::from_secs(60), answer)
        .await
        .expect("/pods answered within 60 s")
        .unwrap()
        .expect("read /pods");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}\n{body}");
    // The pod as users see it: listed, Running, Ready, the same container.
    let list: Value = serde_json::from_str(body).expect("a PodList");
    let name = node.pod_name("web");
    let pod = list["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|p| p["metadata"]["name"] == name.as_str())
        })
        .unwrap_or_else(|| panic!("{name} not in {body}"));
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let ready = pod["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"].clone());
    assert_eq!(ready, Some("True".into()), "{pod}");
    let status = &pod["status"]["containerStatuses"][0];
    assert_eq!(
        status["containerID"].as_str(),
        Some(format!("containerd://{id}").as_str()),
        "{pod}"
    );
    node.stop().await;
}
