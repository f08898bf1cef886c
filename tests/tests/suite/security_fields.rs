//! Security settings a user writes in the KubeletConfiguration or the pod are honoured, or
//! refused in upstream's words, never accepted and then ignored:
//! - `seccompDefault`: a pod that sets no profile runs RuntimeDefault (seen in the
//!   container's /proc/1/status), one that asks for Unconfined stays so;
//! - `supplementalGroupsPolicy: Strict` on a runtime whose CRI Status does not list the
//!   feature (containerd 1.6) is refused with upstream's `SupplementalGroupsPolicyNotSupported`;
//! - `enableDebuggingHandlers: false`: `/configz` is gone and exec, logs and the rest answer
//!   405 "Debug endpoints are disabled." (upstream `InstallDebuggingDisabledHandlers`);
//!   `enableSystemLogHandler: false`: `/logs/` answers 405 "logs endpoint is disabled.";
//! - `tlsMinVersion: VersionTLS13` refuses a TLS 1.2 client; `tlsCipherSuites` refuses a
//!   TLS 1.2 client offering only another suite.

use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::sync::Arc;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn sleeper(name: &str, pod_security: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext: {pod_security}\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n"
    )
}

/// The `Seccomp:` mode of the container's PID 1 (0 off, 2 filter).
async fn seccomp_mode(node: &Node, pod: &str) -> String {
    let id = node.running_container(pod, "c", DEADLINE).await;
    let status = node.exec(&id, &["cat", "/proc/1/status"]).await.unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_default_applies_and_strict_supplemental_groups_are_refused_where_unsupported() {
    if !require_runtime("seccompDefault") {
        return;
    }
    let node = Node::start(
        "seccomp-default",
        NodeOptions {
            extra_config: "seccompDefault: true\n".into(),
            ..Default::default()
        },
    )
    .await;
    node.write_manifest("plain.yaml", &sleeper("plain", "{}"));
    node.write_manifest(
        "unconfined.yaml",
        &sleeper("unconfined", "{seccompProfile: {type: Unconfined}}"),
    );
    node.write_manifest(
        "strict.yaml",
        &sleeper(
            "strict",
            "{supplementalGroupsPolicy: Strict, runAsUser: 1000, supplementalGroups: [4000]}",
        ),
    );
    // upstream: with SeccompDefault, no profile means RuntimeDefault (a filter, mode 2).
    assert_eq!(seccomp_mode(&node, "plain").await, "2");
    assert_eq!(seccomp_mode(&node, "unconfined").await, "0");

    let mut runtime = node.cri.runtime.clone();
    let features = runtime
        .status(nodeagent_proto::cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner()
        .features
        .unwrap_or_default();
    if features.supplemental_groups_policy {
        // A runtime that can: the groups are exactly the pod's (no /etc/group merge).
        let id = node.running_container("strict", "c", DEADLINE).await;
        let groups = node.exec(&id, &["id", "-G"]).await.unwrap();
        assert_eq!(groups.trim(), "0 4000");
    } else {
        let pod = eventually("the Strict pod refused", DEADLINE, || async {
            let p = node.pod("strict").await?;
            (p["status"]["phase"] == "Failed")
                .then_some(p.clone())
                .ok_or_else(|| p["status"].to_string())
        })
        .await;
        assert_eq!(
            pod["status"]["reason"],
            "SupplementalGroupsPolicyNotSupported"
        );
        assert_eq!(
            pod["status"]["message"],
            "Pod was rejected: SupplementalGroupsPolicy=Strict is not supported in this node"
        );
        assert_eq!(node.container_id("strict", "c").await, None);
    }
    node.stop().await;
}

/// A TLS handshake with the node's port 10250 by a client that offers only `versions` and,
/// if given, only `suite` for TLS 1.2.
async fn handshake(
    node: &Node,
    versions: &[&'static rustls::SupportedProtocolVersion],
    suite: Option<&str>,
) -> Result<(), String> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suite) = suite {
        provider
            .cipher_suites
            .retain(|s| format!("{:?}", s.suite()) == suite);
        assert_eq!(provider.cipher_suites.len(), 1, "{suite}");
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&node.api.server_cert).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", node.port))
        .await
        .map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn wait_api(node: &Node) {
    eventually("/pods on 10250", DEADLINE, || async {
        let r = node.api.get("/pods").await?;
        (r.status == 200).then_some(()).ok_or(r.text())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_debugging_handlers_and_tls_min_version_are_honoured() {
    if !require_runtime("enableDebuggingHandlers") {
        return;
    }
    let node = Node::start(
        "debug-off",
        NodeOptions {
            extra_config: "enableDebuggingHandlers: false\ntlsMinVersion: VersionTLS13\n".into(),
            ..Default::default()
        },
    )
    .await;
    wait_api(&node).await;
    let configz = node.api.get("/configz").await.unwrap();
    assert_eq!(configz.status, 404, "{}", configz.text());
    for path in [
        "/exec/default/p/c?command=id",
        "/containerLogs/default/p/c",
        "/runningpods/",
        "/logs/",
        "/portForward/default/p",
        "/debug/pprof/",
    ] {
        let r = node.api.get(path).await.unwrap();
        assert_eq!(
            (r.status, r.text().trim()),
            (405, "Debug endpoints are disabled."),
            "{path}"
        );
    }
    // TLS 1.3 works (every request above); a TLS 1.2-only client is refused.
    assert!(
        handshake(&node, &[&rustls::version::TLS13], None)
            .await
            .is_ok()
    );
    let tls12 = handshake(&node, &[&rustls::version::TLS12], None).await;
    assert!(tls12.is_err(), "a TLS 1.2 client got in");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_system_log_handler_and_tls_cipher_suites_are_honoured() {
    if !require_runtime("enableSystemLogHandler") {
        return;
    }
    let allowed = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384";
    let other = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256";
    let node = Node::start(
        "syslog-off",
        NodeOptions {
            extra_config: format!("enableSystemLogHandler: false\ntlsCipherSuites: [{allowed}]\n"),
            ..Default::default()
        },
    )
    .await;
    wait_api(&node).await;
    let logs = node.api.get("/logs/").await.unwrap();
    assert_eq!(
        (logs.status, logs.text().trim()),
        (405, "logs endpoint is disabled.")
    );
    assert_eq!(node.api.get("/configz").await.unwrap().status, 200);
    let tls12 = [&rustls::version::TLS12];
    assert!(handshake(&node, &tls12, Some(allowed)).await.is_ok());
    assert!(
        handshake(&node, &tls12, Some(other)).await.is_err(),
        "a TLS 1.2 client offering only {other} got in"
    );
    node.stop().await;
}
