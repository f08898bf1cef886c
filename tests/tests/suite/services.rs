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
    // pleg logs as component-base's JSON (upstream's --logging-format=json), the others
    // klog's text, upstream's default: their lines are checked below.
    let mut node = Node::start(
        "health",
        NodeOptions {
            service_args: vec![(Service::Pleg, vec!["--logging-format=json".into()])],
            ..NodeOptions::default()
        },
    )
    .await;
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
        let logger = format!("nodeagent-{}", service.name());
        for line in node.log(service).lines() {
            if service == Service::Pleg {
                json_line(line, &logger);
            } else {
                klog_line(line, &logger);
            }
        }
    }
    node.stop().await;
}

/// A line as klog writes it: its header (klog's `TestHeader`:
/// `I0102 15:04:05.067890    1234 klog_test.go:%d] `, which test/output.go matches with
/// `^(.).... ..:..:......... ....... file`), the quoted message, and the service as
/// `logger`; or a continuation of a multi-line value (`\t` lines closed by ` >`).
fn klog_line(line: &str, logger: &str) {
    if line.starts_with('\t') || line == " >" {
        return;
    }
    let b = line.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    let header = b.len() > 31
        && matches!(b[0], b'I' | b'W' | b'E' | b'F')
        && digits(1..5)
        && b[5] == b' '
        && digits(6..8)
        && b[8] == b':'
        && digits(9..11)
        && b[11] == b':'
        && digits(12..14)
        && b[14] == b'.'
        && digits(15..21)
        && b[21] == b' '
        && line[22..29].trim_start().parse::<u32>().is_ok()
        && b[29] == b' ';
    let rest = &line[30.min(line.len())..];
    let file_and_line = rest.split("] ").next().unwrap_or_default();
    assert!(
        header
            && file_and_line.ends_with(|c: char| c.is_ascii_digit())
            && file_and_line.contains(".rs:")
            && rest.contains("] \"")
            && line.contains(&format!(" logger=\"{logger}\"")),
        "not a klog line of {logger}: {line:?}"
    );
}

/// A line as component-base's JSON format writes it (logs/json/json_test.go:
/// `{"ts":%f,"caller":"json/json_test.go:%d","msg":"test","v":0,...}`), and the service
/// as `logger`.
fn json_line(line: &str, logger: &str) {
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
    // In this order, as zap's encoder writes them.
    let at = |key: &str| line.find(&format!("\"{key}\":")).unwrap_or(usize::MAX);
    assert!(
        line.starts_with("{\"ts\":") && at("logger") < at("caller") && at("caller") < at("msg"),
        "{line}"
    );
    assert!(
        v["ts"].as_f64().is_some_and(|ts| ts > 1.6e12),
        "ts in milliseconds: {line}"
    );
    assert_eq!(v["logger"], logger, "{line}");
    assert!(v["caller"].as_str().unwrap().contains(".rs:"), "{line}");
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

/// The command line a kubeadm node gives the kubelet, every service takes: kubeadm's
/// drop-in `10-kubeadm.conf` (kubernetes/release, as installed by the kubeadm package)
/// runs `kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS
/// $KUBELET_EXTRA_ARGS`, `kubeadm-flags.env` (cmd/kubeadm/app/phases/kubelet/flags.go)
/// holds the runtime endpoint, the sandbox image up to 1.34 and the taints, and an
/// operator's `/etc/default/kubelet` adds more of upstream's flags, pflag style. Upstream
/// flags we do not act on are named in one warning; `--version` carries the commit and
/// exits 0; a name upstream does not have still exits 2, naming it.
#[test]
fn every_service_takes_a_kubeadm_nodes_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    // What kubeadm writes to /var/lib/kubelet/config.yaml (cmd/kubeadm/app/componentconfigs/
    // kubelet.go defaults), but for the paths and cgroupDriver (systemd needs systemd as the
    // init system, which this machine has not: deploy/systemd/test-in-container.sh runs
    // kubeadm's file whole) and fields a test must keep on this machine.
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    cacheTTL: 0s\n    enabled: false\n\
         authorization:\n  mode: AlwaysAllow\n\
         clusterDNS:\n- 10.96.0.10\nclusterDomain: cluster.local\n\
         healthzBindAddress: 127.0.0.1\nhealthzPort: 0\n\
         cpuManagerReconcilePeriod: 0s\nmemorySwap: {}\nlogging:\n  flushFrequency: 0\n  verbosity: 0\n",
    )
    .unwrap();
    let sockets = dir.path().join("sockets");
    std::fs::create_dir_all(&sockets).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for service in Service::ALL {
        let mut child = Command::new(binary(service))
            .args([
                &format!("--config={}", config.display()),
                "--container-runtime-endpoint=unix:///nonexistent/containerd.sock",
                "--pod-infra-container-image=registry.k8s.io/pause:3.10",
                "--register-with-taints=node-role.kubernetes.io/control-plane:NoSchedule",
                "--max_pods",
                "20",
                "--fail-swap-on=false",
                "--rotate-certificates",
                "--vmodule=sync=4",
                "--runtime-cgroups=/system.slice/containerd.service",
                "-v=1",
                "--hostname-override=kubeadm-node",
                &format!("--port={}", nodeagent_tests::free_port()),
                "--socket-dir",
                sockets.to_str().unwrap(),
                "--root-dir",
                dir.path().join("root").to_str().unwrap(),
                "--cert-dir",
                dir.path().join("pki").to_str().unwrap(),
            ])
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run binary");
        // The start-up lines (logs go to stderr, as klog's) come within the first moments;
        // then the service is stopped.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let lines: Vec<String> = std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .take_while(|l| !l.contains("starting"))
                .collect();
            tx.send(lines).ok();
        });
        // The start-up line, or the end of stderr (the process exited), within 20 s.
        let lines = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{}: no start-up line within 20 s", service.name()));
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{} exited with {status}: {lines:?}", service.name());
        }
        // Serving: its SIGTERM handler is in place (it is set up after the start-up line).
        let socket =
            nodeagent_config::Address::Unix(sockets.join(format!("{}.sock", service.name())));
        runtime.block_on(nodeagent_tests::wait_serving(&socket, service.name()));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGTERM,
        )
        .ok();
        let status = child.wait().unwrap();
        let warning = lines
            .iter()
            .find(|l| l.contains("upstream kubelet flags accepted but not acted on"))
            .unwrap_or_else(|| panic!("{}: no warning in {lines:?}", service.name()));
        assert!(
            // --vmodule is acted on (klog's per-file verbosity), so it is not named.
            warning.contains(r#"flags=["pod-infra-container-image","runtime-cgroups"]"#),
            "{}: {warning}",
            service.name()
        );
        let fields = lines
            .iter()
            .find(|l| l.contains("KubeletConfiguration fields accepted but not acted on"))
            .unwrap_or_else(|| panic!("{}: {lines:?}", service.name()));
        assert!(
            fields.contains(r#"fields=["logging.flushFrequency","memorySwap"]"#),
            "{}: {fields}",
            service.name()
        );
        assert!(status.success(), "{}: {status}", service.name());
    }

    for service in Service::ALL {
        let out = Command::new(binary(service))
            .arg("--version")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: {text}", service.name());
        assert!(
            text.starts_with(&format!("nodeagent-{} ", service.name()))
                && text.contains("(commit "),
            "{text}"
        );
        let out = Command::new(binary(service))
            .args([
                "--socket-dir",
                sockets.to_str().unwrap(),
                "--no-such-flag=1",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", service.name());
        assert!(String::from_utf8_lossy(&out.stderr).contains("'--no-such-flag'"));
    }
}

/// `nodeagent status` (issue 31): an operator's one command. With the node up it lists
/// the seven services serving, each with the build it runs, the node's Ready condition
/// and the pods by phase, and exits 0; it lists the Warning events the services recorded
/// lately (a pod's image that may not be pulled, a failing liveness probe), with no API
/// server to hold them; with a service killed it exits 1 and names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodeagent_status_reports_services_node_and_pods_and_fails_when_one_is_down() {
    if !require_runtime("nodeagent status") {
        return;
    }
    let mut node = Node::start("status", NodeOptions::default()).await;
    for service in Service::ALL {
        node.wait_serving(service).await;
    }
    node.write_manifest(
        "web.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n",
    );
    node.running_container("web", "c", std::time::Duration::from_secs(90))
        .await;
    let multi_call = binary(Service::Pleg).with_file_name("nodeagent");
    let args = node.args();
    let status = || {
        let out = Command::new(&multi_call)
            .arg("status")
            .args(&args)
            .output()
            .expect("run nodeagent status");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let healthy = nodeagent_tests::eventually(
        "nodeagent status healthy, the pod Running",
        std::time::Duration::from_secs(60),
        || async {
            match status() {
                (Some(0), text) if text.contains("pods: 1 (Running 1)") => Ok(text),
                (code, text) => Err(format!("exit {code:?}:\n{text}")),
            }
        },
    )
    .await;
    for service in Service::ALL {
        let line = healthy
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{} ", service.name())))
            .unwrap_or_else(|| panic!("no line for {}:\n{healthy}", service.name()));
        assert!(
            line.contains(" serving ") && line.contains("(commit "),
            "{line}\n{healthy}"
        );
    }
    assert!(
        healthy
            .lines()
            .any(|l| l.trim_start().starts_with("Ready") && l.contains(" True ")),
        "{healthy}"
    );
    assert!(healthy.ends_with("\nhealthy\n"), "{healthy}");

    // Recent warnings, on this standalone node (no API server takes the events): an image
    // that may not be pulled (pod-sync's Failed, upstream's ErrImageNeverPull words) and a
    // failing liveness probe (probe's Unhealthy), each with its service and container.
    node.write_manifest(
        "never.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: never\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: example.invalid/absent:1\n    imagePullPolicy: Never\n",
    );
    node.write_manifest(
        "sick.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sick\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n    livenessProbe:\n      exec: {command: [\"false\"]}\n      periodSeconds: 1\n      failureThreshold: 1000\n",
    );
    let never = node.pod_name("never");
    let sick = node.pod_name("sick");
    let warned = nodeagent_tests::eventually(
        "nodeagent status lists both pods' warnings",
        std::time::Duration::from_secs(60),
        || async {
            let (code, text) = status();
            let section = text
                .split("recent warnings (UTC, newest last):\n")
                .nth(1)
                .unwrap_or_default();
            let failed = section.lines().any(|l| {
                l.contains(" pod-sync ")
                    && l.contains(&format!("/{never} app: Failed: Error: ErrImageNeverPull"))
            });
            let unhealthy = section.lines().any(|l| {
                l.contains(" probe ")
                    && l.contains(&format!("/{sick} c: Unhealthy: Liveness probe failed"))
            });
            match (code, failed, unhealthy) {
                (Some(0), true, true) => Ok(text),
                _ => Err(format!("exit {code:?}:\n{text}")),
            }
        },
    )
    .await;
    println!("{warned}");

    node.signal(Service::Probe, Signal::SIGKILL).await;
    let (code, text) = status();
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("UNHEALTHY:\n  probe: "), "{text}");
    node.spawn(Service::Probe);
    node.wait_serving(Service::Probe).await;
    node.stop().await;
}

/// klog's `--vmodule` in a real service (k8s.io/klog/v2: "-vmodule=gopher*=3 sets the V
/// level to 3 in all Go files whose names begin with gopher"): pod-sync at `-v=0` with
/// `--vmodule=runtime_calls=4` and RUST_LOG unset, as the units run it, writes the debug
/// line of sync/runtime_calls.rs (the QoS tiers set, at `v` 4 in component-base's JSON)
/// and no line above `v` 0 from any other file; the same node without `--vmodule` writes
/// no line above `v` 0 at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmodule_raises_one_source_files_level_in_a_real_service() {
    if !require_runtime("vmodule_raises_one_source_files_level...") {
        return;
    }
    for vmodule in [true, false] {
        let mut args = vec!["--logging-format=json".to_string(), "-v=0".into()];
        if vmodule {
            args.push("--vmodule=runtime_calls=4".into());
        }
        let node = Node::start(
            if vmodule { "vmodule" } else { "vmodule-off" },
            NodeOptions {
                env: vec![("RUST_LOG".into(), String::new())],
                service_args: vec![(Service::PodSync, args)],
                ..NodeOptions::default()
            },
        )
        .await;
        node.write_manifest(
            "sleeper.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sleeper\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox:1.36\n    command: [sleep, \"3600\"]\n",
        );
        node.running_container("sleeper", "main", std::time::Duration::from_secs(60))
            .await;
        let lines: Vec<serde_json::Value> = node
            .log(Service::PodSync)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let verbose: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l["v"].as_u64().is_some_and(|v| v > 0))
            .collect();
        if vmodule {
            assert!(
                verbose.iter().any(|l| l["msg"] == "QoS cgroups set"
                    && l["v"] == 4
                    && l["caller"]
                        .as_str()
                        .is_some_and(|c| c.contains("runtime_calls.rs"))),
                "no debug line of runtime_calls.rs: {verbose:#?}"
            );
            let others: Vec<_> = verbose
                .iter()
                .filter(|l| {
                    !l["caller"]
                        .as_str()
                        .is_some_and(|c| c.contains("runtime_calls.rs"))
                })
                .collect();
            assert!(
                others.is_empty(),
                "lines above v 0 from other files: {others:#?}"
            );
        } else {
            assert!(
                verbose.is_empty(),
                "lines above v 0 without --vmodule: {verbose:#?}"
            );
        }
        assert!(lines.len() > 3, "pod-sync wrote {} JSON lines", lines.len());
        node.stop().await;
    }
}
