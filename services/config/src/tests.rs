use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: KubeletFlags,
}

fn flags(args: &[&str]) -> KubeletFlags {
    let mut all = vec!["svc", "--hostname-override", "Node-1"];
    all.extend_from_slice(args);
    Cli::parse_from(all).flags
}

#[test]
fn defaults_match_upstream() {
    let c = Config::load(&flags(&[])).unwrap();
    assert_eq!(c.kubelet.port, 10250);
    assert_eq!(c.kubelet.read_only_port, 0);
    assert_eq!(c.kubelet.healthz_port, 10248);
    assert_eq!(c.kubelet.sync_frequency, Duration::from_secs(60));
    assert_eq!(c.kubelet.file_check_frequency, Duration::from_secs(20));
    assert!(c.kubelet.cgroups_per_qos);
    assert_eq!(c.node_name, "node-1");
    assert_eq!(
        c.endpoint(Service::Pleg).to_string(),
        "unix:///run/nodeagent/pleg.sock"
    );
}

#[test]
fn file_then_flags_override() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         staticPodPath: /etc/kubernetes/manifests\nreadOnlyPort: 10255\n\
         fileCheckFrequency: 5s\ntopologyManagerPolicy: none\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let c = Config::load(&flags(&["--config", p, "--pod-manifest-path", "/m"])).unwrap();
    assert_eq!(c.kubelet.static_pod_path.as_deref(), Some(Path::new("/m")));
    assert_eq!(c.kubelet.read_only_port, 10255);
    assert_eq!(c.kubelet.file_check_frequency, Duration::from_secs(5));
    assert_eq!(c.ignored_fields, vec!["topologyManagerPolicy".to_string()]);
}

#[test]
fn json_config_is_accepted() {
    let (c, _) = parse(r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","port":1234}"#).unwrap();
    assert_eq!(c.port, 1234);
}

#[test]
fn invalid_configs_are_refused_readably() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("kind: Pod\napiVersion: v1\n", "kind: unsupported value"),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: soon\n",
            "invalid duration",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: 99999\n",
            "port",
        ),
        ("- a\n- b\n", "not a mapping"),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: tcp://x\n",
            "containerRuntimeEndpoint",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.yaml"));
        std::fs::write(&path, text).unwrap();
        let err = Config::load(&flags(&["--config", path.to_str().unwrap()])).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(want), "case {i}: {msg}");
    }
    let err = Config::load(&flags(&["--config", "/nonexistent/c.yaml"])).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/c.yaml"), "{err}");
}

#[test]
fn service_endpoint_overrides() {
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "s3cret\n").unwrap();
    let secret_file = secret.path().to_str().unwrap();
    let c = Config::load(&flags(&[
        "--service-endpoint",
        "probe=vsock://3:1024",
        "--vsock-allowed-cids",
        "3,4",
        "--vsock-secret-file",
        secret_file,
    ]))
    .unwrap();
    assert_eq!(
        c.endpoint(Service::Probe),
        &Address::Vsock { cid: 3, port: 1024 }
    );
    assert!(Config::load(&flags(&["--service-endpoint", "nope=unix:///x"])).is_err());
    assert!(Config::load(&flags(&["--service-endpoint", "probe"])).is_err());
}

/// The example configuration that `deploy/up.sh` installs may serve the unauthenticated
/// read-only API only on loopback: it shows full pod specs, env values included.
#[test]
fn example_config_keeps_the_read_only_port_on_loopback() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/config/kubelet-config.yaml"
    );
    let c = Config::load(&flags(&["--config", example])).unwrap();
    if c.kubelet.read_only_port != 0 {
        let ip: std::net::IpAddr = c.kubelet.address.parse().unwrap();
        assert!(
            ip.is_loopback(),
            "read-only port {} on {ip}",
            c.kubelet.read_only_port
        );
    }
    assert!(c.ignored_fields.is_empty(), "{:?}", c.ignored_fields);
}
