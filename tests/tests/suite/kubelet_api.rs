//! The kubelet API on its TLS port: who gets in, and the plain endpoints.
//! Needs root and the containerd that `deploy/runtime/setup.sh` starts.

use nodeagent_tests::kubelet_client::Credentials;
use nodeagent_tests::pki::TestCa;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn secure_port_authenticates_with_client_certificates() {
    if !require_runtime("secure port") {
        return;
    }
    let node = Node::start("secure_port_x509", NodeOptions::default()).await;
    let healthz = eventually(
        "/healthz on the secure port",
        Duration::from_secs(30),
        || async {
            let r = node.api.get("/healthz").await?;
            (r.status == 200)
                .then_some(r)
                .ok_or_else(|| "not yet 200".to_string())
        },
    )
    .await;
    assert_eq!(healthz.text(), "ok");

    // No credentials: 401, as upstream.
    let anonymous = node.api.with(Credentials::None).get("/pods").await.unwrap();
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());
    // A certificate from another CA: 401, not a failed handshake.
    let stranger = TestCa::new("another-ca").issue_client("test-admin", &["system:masters"]);
    let foreign = node
        .api
        .with(Credentials::Cert(stranger))
        .get("/pods")
        .await
        .unwrap();
    assert_eq!(foreign.status, 401, "{}", foreign.text());

    let pods = node.api.get("/pods").await.unwrap();
    assert_eq!(pods.status, 200, "{}", pods.text());
    let list: serde_json::Value = serde_json::from_slice(&pods.body).unwrap();
    assert_eq!(list["kind"], "PodList");

    let configz = node.api.get("/configz").await.unwrap();
    assert_eq!(configz.status, 200);
    let config: serde_json::Value = serde_json::from_slice(&configz.body).unwrap();
    assert_eq!(config["kubeletconfig"]["port"], node.port);
    assert_eq!(config["kubeletconfig"]["readOnlyPort"], node.read_only_port);

    // The self-signed pair is kept in --cert-dir with a private key no one else reads.
    let key = node.path("cert-dir/kubelet.key");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "{} is mode {mode:o}", key.display());
}
