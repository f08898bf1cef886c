//! Every binary: answers the gRPC health check, exits cleanly on SIGTERM, and refuses a
//! bad configuration with a readable message.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, binary, require_runtime};
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_answers_health_and_stops_cleanly_on_sigterm() {
    if !require_runtime("every_service_answers_health...") {
        return;
    }
    let mut node = Node::start("health", NodeOptions::default()).await;
    for service in Service::ALL {
        node.wait_serving(service).await;
    }
    for service in Service::ALL {
        let status = node.signal(service, Signal::SIGTERM).await;
        assert!(
            status.success(),
            "{} exited with {status:?}; log:\n{}",
            service.name(),
            node.log(service)
        );
        assert!(
            node.log(service).contains("stopped"),
            "{}",
            node.log(service)
        );
        // The socket is gone with it.
        if let nodeagent_config::Address::Unix(p) = node.socket(service) {
            assert!(!p.exists(), "{} left {}", service.name(), p.display());
        }
    }
    node.stop().await;
}

#[test]
fn a_bad_configuration_is_refused_with_a_readable_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "kind: KubeletConfiguration\napiVersion: v1\n",
            "apiVersion: unsupported value",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: often\n",
            "invalid duration \"often\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: magic\n",
            "cgroupDriver",
        ),
        ("{{{", "failed to parse kubelet config file"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.yaml"));
        std::fs::write(&path, text).unwrap();
        for service in Service::ALL {
            let out = Command::new(binary(service))
                .args([
                    "--config",
                    path.to_str().unwrap(),
                    "--socket-dir",
                    dir.path().to_str().unwrap(),
                ])
                .output()
                .expect("run binary");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{}: {stderr}", service.name());
            assert!(
                stderr.contains(want),
                "{} case {i}: {stderr}",
                service.name()
            );
            assert!(
                stderr.contains(&format!("nodeagent-{}", service.name())),
                "{stderr}"
            );
        }
    }
    let out = Command::new(binary(Service::Pleg))
        .args(["--config", "/nonexistent/kubelet.yaml"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("failed to read kubelet config file \"/nonexistent/kubelet.yaml\"")
    );
}
