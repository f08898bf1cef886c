//! A pod's security context against the real containerd: runAsNonRoot checked against the
//! image's user, fsGroup on an emptyDir, seccomp RuntimeDefault and safe (or allowed
//! unsafe) sysctls applied, other unsafe sysctls refused with upstream's reason; and an
//! orphan (a pod removed while pod-sync and config-source were down) stopped with its own
//! grace period and preStop hook, from its annotations.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_non_root_is_checked_against_the_image_user_and_run_as_user() {
    if !require_runtime("runAsNonRoot") {
        return;
    }
    let node = Node::start("nonroot", NodeOptions::default()).await;
    node.write_manifest(
        "nonroot.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: nonroot
spec:
  securityContext:
    runAsNonRoot: true
    fsGroup: 2000
  volumes:
  - name: data
    emptyDir: {}
  containers:
  - name: image-user
    image: busybox:1.36
    command: ["sleep", "3600"]
  - name: user1000
    image: busybox:1.36
    command: ["sleep", "3600"]
    securityContext:
      runAsUser: 1000
    volumeMounts: [{name: data, mountPath: /data}]
"#,
    );
    let id = node
        .running_container("nonroot", "user1000", DEADLINE)
        .await;
    let uid = node.exec(&id, &["id", "-u"]).await.expect("exec id -u");
    assert_eq!(uid.trim(), "1000");
    // fsGroup: a supplemental group, and the emptyDir's group for what the user creates.
    let groups = node.exec(&id, &["id", "-G"]).await.expect("exec id -G");
    assert!(groups.split_whitespace().any(|g| g == "2000"), "{groups}");
    let file_group = node
        .exec(&id, &["sh", "-c", "touch /data/f && stat -c %g /data/f"])
        .await
        .expect("the user writes the emptyDir");
    assert_eq!(file_group.trim(), "2000");
    // busybox runs as root: the container is never created.
    let waiting = node
        .waiting_message(
            "nonroot",
            "image-user",
            "CreateContainerConfigError",
            DEADLINE,
        )
        .await;
    assert!(
        waiting.starts_with("container has runAsNonRoot and image will run as root"),
        "{waiting}"
    );
    assert!(node.container_id("nonroot", "image-user").await.is_none());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_and_safe_sysctls_are_applied_and_unsafe_sysctls_refused() {
    if !require_runtime("seccomp and sysctls") {
        return;
    }
    let node = Node::start(
        "seccomp",
        NodeOptions {
            extra_config: "allowedUnsafeSysctls: [\"net.core.somaxconn\"]\n".into(),
            ..Default::default()
        },
    )
    .await;
    // A Localhost profile under <root-dir>/seccomp that forbids mkdir.
    let profiles = node.path("root/seccomp");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("deny-mkdir.json"),
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    node.write_manifest(
        "confined.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: confined
spec:
  securityContext:
    seccompProfile: {type: RuntimeDefault}
    sysctls:
    - {name: net.ipv4.ip_unprivileged_port_start, value: "80"}
    - {name: net.core.somaxconn, value: "1234"}
  containers:
  - name: app
    image: busybox:1.36
    command: ["sleep", "3600"]
  - name: local
    image: busybox:1.36
    command: ["sleep", "3600"]
    securityContext:
      seccompProfile: {type: Localhost, localhostProfile: deny-mkdir.json}
"#,
    );
    node.write_manifest(
        "unsafe.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: unsafe
spec:
  securityContext:
    sysctls:
    - {name: kernel.msgmax, value: "65536"}
  containers:
  - name: app
    image: busybox:1.36
    command: ["sleep", "3600"]
"#,
    );
    let id = node.running_container("confined", "app", DEADLINE).await;
    let status = node.exec(&id, &["cat", "/proc/1/status"]).await.unwrap();
    let seccomp = status.lines().find(|l| l.starts_with("Seccomp:"));
    assert_eq!(
        seccomp.map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["Seccomp:", "2"])
    );
    let port_start = node
        .exec(
            &id,
            &["cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"],
        )
        .await
        .unwrap();
    assert_eq!(port_start.trim(), "80");
    // The container's Localhost profile overrides the pod's RuntimeDefault.
    node.exec(&id, &["mkdir", "/tmp/allowed"]).await.unwrap();
    let local = node.running_container("confined", "local", DEADLINE).await;
    let denied = node.exec(&local, &["mkdir", "/tmp/denied"]).await;
    assert!(
        denied
            .as_ref()
            .is_err_and(|e| e.contains("Operation not permitted")),
        "mkdir under the deny-mkdir profile: {denied:?}"
    );
    // An unsafe sysctl the node's allowedUnsafeSysctls lists is applied too.
    let somaxconn = node
        .exec(&id, &["cat", "/proc/sys/net/core/somaxconn"])
        .await
        .unwrap();
    assert_eq!(somaxconn.trim(), "1234");

    let unsafe_pod = eventually("the unsafe pod refused", DEADLINE, || async {
        let p = node.pod("unsafe").await?;
        if p["status"]["phase"] == "Failed" {
            Ok(p)
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    assert_eq!(unsafe_pod["status"]["reason"], "SysctlForbidden");
    assert_eq!(
        unsafe_pod["status"]["message"],
        "Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted"
    );
    let full = node.pod_name("unsafe");
    assert!(
        !node
            .sandboxes()
            .await
            .iter()
            .any(|s| s.metadata.as_ref().is_some_and(|m| m.name == full)),
        "a refused pod gets no sandbox"
    );
    assert!(
        node.log(Service::PodSync)
            .contains("pod refused at admission")
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_stopped_with_its_own_grace_period_and_pre_stop_hook() {
    if !require_runtime("orphan grace and preStop") {
        return;
    }
    let mut node = Node::start("orphan", NodeOptions::default()).await;
    let out = node.path("out");
    std::fs::create_dir_all(&out).unwrap();
    node.write_manifest(
        "orphan.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: orphan
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: stubborn
    image: busybox:1.36
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done"]
    lifecycle:
      preStop:
        exec:
          command: ["sh", "-c", "echo prestop >> /out/events"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  volumes:
  - name: out
    hostPath: {{path: {}, type: DirectoryOrCreate}}
"#,
            out.display()
        ),
    );
    node.running_container("orphan", "stubborn", DEADLINE).await;
    // The pod goes while both pod-sync and config-source are down: the restarted ones
    // never see its spec, only its containers.
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.signal(Service::ConfigSource, Signal::SIGKILL).await;
    node.remove_manifest("orphan.yaml");
    node.spawn(Service::ConfigSource);
    node.wait_serving(Service::ConfigSource).await;
    let restarted = Instant::now();
    node.spawn(Service::PodSync);
    eventually("the orphan's containers gone", DEADLINE, || async {
        let n = node.containers().await.len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} containers"))
        }
    })
    .await;
    let took = restarted.elapsed();
    eprintln!("the orphan was stopped {took:?} after pod-sync restarted");
    let events = std::fs::read_to_string(out.join("events")).unwrap_or_default();
    assert_eq!(
        events, "prestop\n",
        "the preStop hook ran from the annotation"
    );
    // The container ignores SIGTERM, so it is killed when its 5 s grace ends: not 30 s.
    assert!(
        took >= Duration::from_secs(5),
        "stopped after {took:?}, before the grace period ended"
    );
    assert!(
        took < Duration::from_secs(25),
        "stopped after {took:?}: the default 30 s grace"
    );
    node.stop().await;
}
