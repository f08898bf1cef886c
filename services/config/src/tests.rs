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
    assert_eq!(c.kubelet.enforce_node_allocatable, vec!["pods".to_string()]);
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
         fileCheckFrequency: 5s\ntopologyManagerPolicy: none\n\
         featureGates: {MemoryQoS: true, SidecarContainers: true}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let c = Config::load(&flags(&["--config", p, "--pod-manifest-path", "/m"])).unwrap();
    assert_eq!(c.kubelet.static_pod_path.as_deref(), Some(Path::new("/m")));
    assert_eq!(c.kubelet.read_only_port, 10255);
    assert_eq!(c.kubelet.file_check_frequency, Duration::from_secs(5));
    // The one gate acted on is not named; any other is, as a field.
    assert!(c.kubelet.memory_qos());
    assert_eq!(
        c.ignored_fields,
        vec![
            "topologyManagerPolicy".to_string(),
            "featureGates.SidecarContainers".to_string()
        ]
    );
}

/// component-base's `LoggingConfiguration` in the file (`logging.format`,
/// `logging.verbosity`, defaults text and 0), and upstream's `--logging-format` and `-v`
/// over it; `flushFrequency` and `options` are named as ignored, nested (every line is
/// written unbuffered).
#[test]
fn logging_comes_from_the_file_and_the_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let p = path.to_str().unwrap();
    let c = Config::load(&flags(&[])).unwrap();
    assert_eq!((c.logging_format.as_str(), c.verbosity), ("text", 0));
    std::fs::write(
        &path,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         logging:\n  format: json\n  verbosity: 4\n  flushFrequency: 5s\n",
    )
    .unwrap();
    let c = Config::load(&flags(&["--config", p])).unwrap();
    assert_eq!((c.logging_format.as_str(), c.verbosity), ("json", 4));
    assert_eq!(c.ignored_fields, vec!["logging.flushFrequency".to_string()]);
    let c = Config::load(&flags(&["--config", p, "--logging-format=text", "-v=2"])).unwrap();
    assert_eq!((c.logging_format.as_str(), c.verbosity), ("text", 2));
    std::fs::write(
        &path,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         logging:\n  format: xml\n",
    )
    .unwrap();
    let e = Config::load(&flags(&["--config", p]))
        .unwrap_err()
        .to_string();
    assert!(e.contains(r#"logging.format "xml""#), "{e}");
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
        // Upstream's rows (pkg/kubelet/apis/config/validation/validation_test.go,
        // "invalid EnforceNodeAllocatable" and the "none" one), their words.
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nenforceNodeAllocatable: [invalid-enforce-node-allocatable]\n",
            "invalid configuration: option \"invalid-enforce-node-allocatable\" specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are \"pods\", \"system-reserved\", \"kube-reserved\", or \"none\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nenforceNodeAllocatable: [none, pods]\n",
            "may not contain additional enforcements when \"none\" is specified",
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

/// The shipped configuration (`deploy/install.sh` and `deploy/up.sh` install it): the
/// read-only port off, no anonymous access, and no bearer tokens under AlwaysAllow, so
/// that adding `--kubeconfig` never lets a pod's service account token exec into pods.
#[test]
fn the_shipped_config_is_safe_with_or_without_an_api_server() {
    let shipped = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/config/kubelet-config.yaml"
    );
    let c = Config::load(&flags(&["--config", shipped])).unwrap();
    assert_eq!(c.kubelet.read_only_port, 0);
    assert!(!c.kubelet.authentication.anonymous.enabled);
    assert!(c.kubelet.authorization.mode == "Webhook" || !c.kubelet.authentication.webhook.enabled);
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    let with_api = Config::load(&flags(&[
        "--config",
        shipped,
        "--kubeconfig",
        kubeconfig.path().to_str().unwrap(),
    ]));
    assert!(with_api.is_ok(), "{:?}", with_api.err());
}

/// AlwaysAllow plus webhook authentication on a node with an API server is refused unless
/// asked for by name; standalone (no token can be reviewed) it stands.
#[test]
fn always_allow_with_token_authentication_is_refused_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         authorization:\n  mode: AlwaysAllow\n",
    )
    .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (c, k) = (config.to_str().unwrap(), kubeconfig.to_str().unwrap());
    assert!(Config::load(&flags(&["--config", c])).is_ok());
    let err = Config::load(&flags(&["--config", c, "--kubeconfig", k]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("any pod's service account token")
            && err.contains("authorization.mode: Webhook"),
        "{err}"
    );
    for extra in [
        &["--insecure-always-allow-tokens"][..],
        &["--authorization-mode", "Webhook"][..],
    ] {
        let mut args = vec!["--config", c, "--kubeconfig", k];
        args.extend_from_slice(extra);
        assert!(Config::load(&flags(&args)).is_ok(), "{extra:?}");
    }
}

/// A header value with CR/LF would add headers (or a whole request) to every fetch of the
/// static pod URL: refused at start, as are names that are not HTTP tokens and URLs that
/// are neither http:// nor https://; the query string (a token, often) is never repeated.
#[test]
fn static_pod_url_headers_cannot_smuggle_lines() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "staticPodURL: http://x/pods\nstaticPodURLHeader:\n  X-A: [\"v\\r\\nX-Injected: 1\"]\n",
            Some("staticPodURLHeader[X-A]: a value may not contain CR, LF or NUL"),
        ),
        (
            "staticPodURL: http://x/pods\nstaticPodURLHeader:\n  \"X A\": [v]\n",
            Some("invalid header name \"X A\""),
        ),
        (
            "staticPodURL: file:///etc/pods?token=s3cret\n",
            Some("staticPodURL: unsupported value \"file:///etc/pods\""),
        ),
        (
            "staticPodURL: https://x/pods?token=s3cret\nstaticPodURLHeader:\n  X-A: [v]\n",
            None,
        ),
    ];
    for (i, (extra, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{extra}"
            ),
        )
        .unwrap();
        let got = Config::load(&flags(&["--config", path.to_str().unwrap()]));
        match want {
            Some(want) => {
                let err = got.unwrap_err().to_string();
                assert!(err.contains(want), "case {i}: {err}");
                assert!(!err.contains("s3cret"), "case {i}: {err}");
            }
            None => assert!(got.is_ok(), "case {i}: {:?}", got.err()),
        }
    }
}

/// Upstream flags on the command line win over the file, as upstream's flag precedence;
/// a bad value names the flag as pflag does; ones we do not act on are listed.
#[test]
fn upstream_flags_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 50\n\
         authentication:\n  webhook:\n    enabled: true\n    audience: x\n",
    )
    .unwrap();
    let mut f = flags(&["--config", path.to_str().unwrap()]);
    f.upstream = UpstreamFlags {
        fields: vec![
            ("max-pods".into(), "maxPods".into(), "20".into()),
            (
                "cluster-dns".into(),
                "clusterDNS".into(),
                "10.96.0.10".into(),
            ),
            (
                "topology-manager-policy".into(),
                "topologyManagerPolicy".into(),
                "none".into(),
            ),
        ],
        ignored: vec!["vmodule".into()],
    };
    let c = Config::load(&f).unwrap();
    assert_eq!(c.kubelet.max_pods, 20);
    assert_eq!(c.kubelet.cluster_dns, vec!["10.96.0.10".to_string()]);
    assert!(c.kubelet.authentication.webhook.enabled);
    assert_eq!(
        c.ignored_flags,
        vec!["topology-manager-policy".to_string(), "vmodule".to_string()]
    );
    assert_eq!(
        c.ignored_fields,
        vec!["authentication.webhook.audience".to_string()]
    );
    f.upstream.fields[0].2 = "lots".into();
    let err = Config::load(&f).unwrap_err().to_string();
    assert!(
        err.contains("invalid argument \"lots\" for \"--max-pods\" flag"),
        "{err}"
    );
}

/// `--node-labels`, `--node-ip` and `--cloud-provider` as upstream's flag validation
/// (cmd/kubelet/app/options/options.go `ValidateKubeletFlags`, `ParseNodeIPArgument`).
#[test]
fn node_flags_are_checked_as_upstream() {
    let c = Config::load(&flags(&[
        "--node-labels",
        "zone=a,node.kubernetes.io/pool=x,kubernetes.io/arch=amd64",
        "--node-ip",
        "10.0.0.5,fd00::5",
        "--cloud-provider=external",
    ]))
    .unwrap();
    assert_eq!(c.node_labels.len(), 3);
    assert_eq!(c.node_ips.len(), 2);
    assert!(c.external_cloud_provider);
    assert!(
        Config::load(&flags(&["--node-ip", "0.0.0.0"]))
            .unwrap()
            .node_ips
            .is_empty()
    );
    for (args, want) in [
        (
            &["--node-labels", "node-role.kubernetes.io/control-plane="][..],
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [\"node-role.kubernetes.io/control-plane\"]",
        ),
        (&["--node-labels", "novalue"][..], "want key=value"),
        (
            &["--node-ip", "10.0.0.1,10.0.0.2"][..],
            "one IPv4 and one IPv6",
        ),
        (&["--node-ip", "eth0"][..], "could not parse"),
        (&["--cloud-provider", "aws"][..], "only \"external\""),
    ] {
        let err = Config::load(&flags(args)).unwrap_err().to_string();
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// The `/var/lib/kubelet/config.yaml` kubeadm writes (deploy/examples/kubeadm/config.yaml),
/// verbatim as captured from a kubeadm node (its componentconfigs/kubelet.go defaults, every duration it leaves alone as `0s`):
/// upstream's defaulting (pkg/kubelet/apis/config/v1beta1/defaults.go) turns each zero
/// into the default, so the file loads, `cgroupDriver: systemd` included.
#[test]
fn kubeadms_config_yaml_loads_with_upstreams_defaults() {
    let kubeadm = include_str!("../../../deploy/examples/kubeadm/config.yaml");
    let (c, ignored) = parse(kubeadm).unwrap();
    assert_eq!(c.sync_frequency, Duration::from_secs(60));
    assert_eq!(c.file_check_frequency, Duration::from_secs(20));
    assert_eq!(c.http_check_frequency, Duration::from_secs(20));
    assert_eq!(c.runtime_request_timeout, Duration::from_secs(120));
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(
        c.streaming_connection_idle_timeout,
        Duration::from_secs(4 * 3600)
    );
    assert_eq!(c.volume_stats_agg_period, Duration::from_secs(60));
    assert_eq!(
        c.eviction_pressure_transition_period,
        Duration::from_secs(300)
    );
    assert_eq!(c.image_minimum_gc_age, Duration::from_secs(120));
    assert_eq!(c.authentication.webhook.cache_ttl, Duration::from_secs(120));
    assert_eq!(
        c.authorization.webhook.cache_authorized_ttl,
        Duration::from_secs(300)
    );
    assert_eq!(
        c.authorization.webhook.cache_unauthorized_ttl,
        Duration::from_secs(30)
    );
    assert_eq!(c.shutdown_grace_period, Duration::ZERO);
    assert_eq!(c.port, 10250);
    assert_eq!(c.healthz_port, 10248);
    assert_eq!(c.cluster_dns, vec!["10.96.0.10".to_string()]);
    // kubeadm's `cpuManagerReconcilePeriod: 0s` is upstream's default, 10 s.
    assert_eq!(c.cpu_manager_reconcile_period, Duration::from_secs(10));
    assert_eq!(c.cpu_manager_policy, "none");
    assert_eq!(
        ignored,
        vec!["logging.flushFrequency", "logging.options", "memorySwap"]
    );
    // kubeadm's file as it is, systemd cgroup driver included (issue 30), validates.
    c.validate().unwrap();
    assert_eq!(c.cgroup_driver(), crate::cgroup_name::CgroupDriver::Systemd);
    let cgroupfs = kubeadm.replace("cgroupDriver: systemd", "cgroupDriver: cgroupfs");
    let c = parse(&cgroupfs).unwrap().0;
    c.validate().unwrap();
    assert_eq!(
        c.cgroup_driver(),
        crate::cgroup_name::CgroupDriver::Cgroupfs
    );
    let bad = kubeadm.replace("cgroupDriver: systemd", "cgroupDriver: openrc");
    assert_eq!(
        parse(&bad).unwrap().0.validate().unwrap_err(),
        "invalid configuration: cgroupDriver (\"openrc\") must be \"cgroupfs\" or \"systemd\""
    );
}

/// `/configz` shows what is in effect: evictionHard as upstream's defaulting fills it
/// (DefaultEvictionHard), never `null`, and an unset optional field is left out
/// (upstream's `omitempty`), not shown as `null`.
#[test]
fn the_effective_document_has_no_null() {
    let c = Config::load(&flags(&[])).unwrap();
    let doc = c.kubelet.effective_document();
    assert_eq!(
        doc["evictionHard"],
        serde_json::json!({"memory.available": "100Mi", "nodefs.available": "10%",
            "nodefs.inodesFree": "5%", "imagefs.available": "15%", "imagefs.inodesFree": "5%"})
    );
    fn no_null(path: &str, v: &serde_json::Value) {
        match v {
            serde_json::Value::Null => panic!("{path} is null"),
            serde_json::Value::Object(m) => m
                .iter()
                .for_each(|(k, v)| no_null(&format!("{path}.{k}"), v)),
            _ => {}
        }
    }
    no_null("kubeletconfig", &doc);
    assert!(doc.get("staticPodPath").is_none());
    let (c, _) = parse(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: {}\n",
    )
    .unwrap();
    assert_eq!(
        c.effective_document()["evictionHard"],
        serde_json::json!({})
    );
}

/// `--config-dir` as upstream's "Kubelet Configuration Directory Merging" reference page
/// (kubernetes.io/docs/reference/node/kubelet-config-directory-merging) shows it: its
/// structure-field and list examples as written, a map merged key by key, files in
/// alphanumeric order with only `*.conf` read, flags over everything.
#[test]
fn a_config_dir_merges_as_upstreams_reference_page_shows() {
    let dir = tempfile::tempdir().unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let main = dir.path().join("config.yaml");
    std::fs::write(
        &main,
        format!(
            "{head}port: 20250\nauthorization:\n  mode: Webhook\n  webhook:\n    \
             cacheAuthorizedTTL: \"5m\"\n    cacheUnauthorizedTTL: \"30s\"\n\
             serializeImagePulls: false\naddress: \"192.168.0.1\"\n\
             clusterDNS:\n  - \"192.168.0.9\"\n  - \"192.168.0.8\"\n\
             evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\n\
             readOnlyPort: 10255\n"
        ),
    )
    .unwrap();
    let drop_ins = dir.path().join("kubelet.conf.d");
    std::fs::create_dir(&drop_ins).unwrap();
    let write = |name: &str, body: &str| std::fs::write(drop_ins.join(name), body).unwrap();
    // The page's structure-field example.
    write(
        "10-authz.conf",
        &format!(
            "{head}authorization:\n  mode: AlwaysAllow\n  webhook:\n    \
             cacheAuthorizedTTL: \"8m\"\n    cacheUnauthorizedTTL: \"45s\"\n\
             address: \"192.168.0.8\"\n"
        ),
    );
    // The page's list example: the whole list is replaced.
    write(
        "20-dns.conf",
        &format!(
            "{head}clusterDNS:\n  - \"192.168.0.2\"\n  - \"192.168.0.3\"\n  - \"192.168.0.5\"\n"
        ),
    );
    // A map: its keys merge; a later file wins over an earlier one.
    write(
        "30-eviction.conf",
        &format!("{head}evictionHard:\n  memory.available: 200Mi\n"),
    );
    write("40-port.conf", &format!("{head}port: 20251\n"));
    write("50-port.conf", &format!("{head}port: 20252\n"));
    // Not a drop-in: only `*.conf` files are read.
    write("60-port.yaml", &format!("{head}port: 1\n"));
    write("README", "not a document");
    let load = |extra: &[&str]| {
        let mut args = vec![
            "--config",
            main.to_str().unwrap(),
            "--config-dir",
            drop_ins.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Config::load(&flags(&args))
    };
    let c = load(&[]).unwrap().kubelet;
    assert_eq!(c.port, 20252, "the last file in alphanumeric order wins");
    assert!(!c.serialize_image_pulls, "a field no drop-in sets stays");
    assert_eq!(c.authorization.mode, "AlwaysAllow");
    assert_eq!(
        c.authorization.webhook.cache_authorized_ttl,
        Duration::from_secs(480)
    );
    assert_eq!(
        c.authorization.webhook.cache_unauthorized_ttl,
        Duration::from_secs(45)
    );
    assert_eq!(c.address, "192.168.0.8");
    assert_eq!(c.cluster_dns, ["192.168.0.2", "192.168.0.3", "192.168.0.5"]);
    let hard = c.eviction_hard.clone().unwrap();
    assert_eq!(hard["memory.available"], "200Mi");
    assert_eq!(hard["nodefs.available"], "10%");
    assert_eq!(c.read_only_port, 10255);
    // Flags override the drop-ins, as they override the file.
    let c = load(&["--read-only-port", "0", "--port", "10250"])
        .unwrap()
        .kubelet;
    assert_eq!((c.read_only_port, c.port), (0, 10250));

    // A drop-in that is not a whole document stops the load and is named (upstream fails
    // on it too, kubernetes #124796).
    write("70-bare.conf", "port: 3\n");
    let err = load(&[]).unwrap_err().to_string();
    assert!(
        err.contains("70-bare.conf") && err.contains("apiVersion"),
        "{err}"
    );
    std::fs::remove_file(drop_ins.join("70-bare.conf")).unwrap();
    // A directory that is not there stops it too.
    let err = Config::load(&flags(&["--config-dir", "/nonexistent/kubelet.conf.d"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/kubelet.conf.d"), "{err}");
}

/// `--vmodule` as klog's `moduleSpec.Set` reads it: `pattern=N` pairs, an empty value for
/// none; a missing `=`, an empty pattern or a level that is not a number is klog's
/// "syntax error: expect comma-separated list of filename=N". The flag wins over the
/// config file's `logging.vmodule` (component-base's VModuleConfiguration).
#[test]
fn vmodule_is_read_as_klog_reads_it() {
    assert_eq!(
        crate::parse_vmodule("runtime_calls=4,sync/*=6").unwrap(),
        vec![("runtime_calls".to_string(), 4), ("sync/*".to_string(), 6)]
    );
    assert_eq!(crate::parse_vmodule("").unwrap(), vec![]);
    for bad in ["sync", "=4", "sync=x", "sync=-1"] {
        let err = crate::parse_vmodule(bad).unwrap_err();
        assert!(
            err.contains("syntax error: expect comma-separated list of filename=N"),
            "{bad}: {err}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "logging:\n  vmodule:\n  - filePattern: probe*\n    verbosity: 5\n",
    )
    .unwrap();
    let c = Config::load(&flags(&["--config", path.to_str().unwrap()])).unwrap();
    assert_eq!(c.vmodule, vec![("probe*".to_string(), 5)]);
    assert!(c.ignored_fields.is_empty(), "{:?}", c.ignored_fields);
    let c = Config::load(&flags(&[
        "--config",
        path.to_str().unwrap(),
        "--vmodule=runtime_calls=4",
    ]))
    .unwrap();
    assert_eq!(c.vmodule, vec![("runtime_calls".to_string(), 4)]);
    assert!(Config::load(&flags(&["--vmodule=oops"])).is_err());
}

/// The CPU manager's fields under upstream's flags (`--cpu-manager-policy`,
/// `--reserved-cpus`, `--cpu-manager-policy-options`): `--reserved-cpus` replaces the cpu
/// of kubeReserved and systemReserved with its size (upstream's `server.go`), and what
/// upstream's validation refuses is refused in its words.
#[test]
fn cpu_manager_fields_and_flags_as_upstreams() {
    let load = |fields: &[(&str, &str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             kubeReserved: {cpu: 500m, memory: 1Gi}\nsystemReserved: {cpu: 250m}\n",
        )
        .unwrap();
        let mut f = flags(&["--config", path.to_str().unwrap()]);
        f.upstream = UpstreamFlags {
            fields: fields
                .iter()
                .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
                .collect(),
            ..Default::default()
        };
        Config::load(&f).map_err(|e| e.to_string())
    };
    let c = load(&[]).unwrap();
    assert_eq!(c.kubelet.cpu_manager_policy, "none");
    assert_eq!(
        c.kubelet.cpu_manager_reconcile_period,
        Duration::from_secs(10)
    );
    assert_eq!(c.kubelet.reserved_cpu_millis(), 750);
    let c = load(&[
        ("cpu-manager-policy", "cpuManagerPolicy", "static"),
        ("reserved-cpus", "reservedSystemCPUs", "0,1"),
        (
            "cpu-manager-reconcile-period",
            "cpuManagerReconcilePeriod",
            "5s",
        ),
    ])
    .unwrap();
    assert_eq!(c.kubelet.cpu_manager_policy, "static");
    assert_eq!(
        c.kubelet.cpu_manager_reconcile_period,
        Duration::from_secs(5)
    );
    assert_eq!(c.kubelet.kube_reserved.get("cpu"), None);
    assert_eq!(c.kubelet.kube_reserved["memory"], "1Gi");
    assert_eq!(c.kubelet.system_reserved["cpu"], "2");
    assert_eq!(c.kubelet.reserved_cpu_millis(), 2000);
    assert!(!c.kubelet.cpu_manager_full_pcpus_only());
    // The one policy option implemented, by flag and by field; Go's ParseBool spellings.
    for value in ["true", "1", "T"] {
        let c = load(&[(
            "cpu-manager-policy-options",
            "cpuManagerPolicyOptions",
            &format!("full-pcpus-only={value}"),
        )])
        .unwrap();
        assert!(c.kubelet.cpu_manager_full_pcpus_only(), "{value}");
        assert!(!c.kubelet.cpu_manager_strict_cpu_reservation(), "{value}");
    }
    let c = load(&[(
        "cpu-manager-policy-options",
        "cpuManagerPolicyOptions",
        "strict-cpu-reservation=true",
    )])
    .unwrap();
    assert!(c.kubelet.cpu_manager_strict_cpu_reservation());
    for (fields, want) in [
        (
            vec![("reserved-cpus", "reservedSystemCPUs", "0-")],
            "invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus) 0-, error: strconv.Atoi: parsing \"\": invalid syntax",
        ),
        (
            vec![("cpu-manager-policy", "cpuManagerPolicy", "Static")],
            "unknown policy: \"Static\"",
        ),
        (
            vec![(
                "cpu-manager-policy-options",
                "cpuManagerPolicyOptions",
                "distribute-cpus-across-numa=true",
            )],
            "unsupported cpumanager option: \"distribute-cpus-across-numa\" (true)",
        ),
        (
            vec![(
                "cpu-manager-policy-options",
                "cpuManagerPolicyOptions",
                "full-pcpus-only=maybe",
            )],
            "bad value for option \"full-pcpus-only\": strconv.ParseBool: parsing \"maybe\": invalid syntax",
        ),
        (
            vec![(
                "cpu-manager-policy-options",
                "cpuManagerPolicyOptions",
                "strict-cpu-reservation=yes",
            )],
            "bad value for option \"strict-cpu-reservation\": strconv.ParseBool: parsing \"yes\": invalid syntax",
        ),
    ] {
        let err = load(&fields).unwrap_err();
        assert!(err.contains(want), "{fields:?}: {err}");
    }
}

/// `systemReservedCgroup` and `kubeReservedCgroup` with `enforceNodeAllocatable`, as
/// upstream's validation words them.
#[test]
fn reserved_cgroups_are_required_where_enforced() {
    let check = |yaml: &str| {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}"
        );
        parse(&text).unwrap().0.validate()
    };
    assert_eq!(
        check("enforceNodeAllocatable: [pods, system-reserved]\n").unwrap_err(),
        "invalid configuration: systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)"
    );
    assert_eq!(
        check("enforceNodeAllocatable: [kube-reserved]\n").unwrap_err(),
        "invalid configuration: kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)"
    );
    check("enforceNodeAllocatable: [pods, system-reserved]\nsystemReservedCgroup: /system.slice\n")
        .unwrap();
    assert_eq!(
        check("systemReservedCgroup: /system.slice\nreservedSystemCPUs: \"0\"\n").unwrap_err(),
        "invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)"
    );
}
