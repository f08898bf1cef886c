//! The harness of the cross-service tests: a node made of the seven real binaries, on
//! sockets in a temp dir, against the real containerd that `deploy/runtime/setup.sh`
//! starts. Waiting is always on a condition with a deadline ([`eventually`]).

pub mod apiserver;
pub mod apiserver_admission;
pub mod apiserver_attach;
pub mod apiserver_auth;
pub mod apiserver_controllers;
pub mod apiserver_csr;
mod apiserver_discovery;
mod apiserver_ephemeral;
mod apiserver_fields;
pub mod apiserver_jwt;
mod apiserver_kubectl;
pub mod apiserver_nodes;
mod apiserver_protobuf;
pub mod apiserver_proxy;
mod apiserver_relay;
mod apiserver_resize;
mod apiserver_runtimeclass;
pub mod apiserver_serviceaccount;
mod apiserver_table;
pub mod apiserver_taints;
pub mod browser;
pub mod cgroup;
pub mod chaos;
pub mod cri_fault;
mod http;
pub mod kubelet_client;
mod node;
pub mod otlp;
pub mod pki;
pub mod raw_pod;
pub mod registry;
pub mod runtime;
pub mod spdy;
mod status;
pub mod websocket;

pub use http::{HttpError, http_get};

/// A test that cannot run here: under CI (`CI` set, as `.ci/run` sets it) a failure that
/// says `why`, so that nothing passes without running; elsewhere reported as skipped
/// (`SKIPPED: why` on stderr, which the runner's output keeps). Always false, for
/// `if !precondition() { return skip_unless_ci(...); }`-style callers.
pub fn skip_unless_ci(why: &str) -> bool {
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("SKIPPED: {why}");
    false
}
pub use node::{
    Node, NodeOptions, binary, free_port, require_runtime, rss_kib, test_binary, wait_serving,
};
pub use status::{container_status, is_running, ready_results};

use std::future::Future;
use std::time::Duration;

/// The main containerd the runtime setup script starts (the test suite's others: [`runtime`]).
pub const CONTAINERD_SOCKET: &str = "/run/nodeagent-containerd/containerd.sock";

/// The locally built image the setup script imports (with the pause image), which no
/// registry can bring back.
pub const BUSYBOX: &str = "docker.io/library/busybox:1.36";

/// Waits until the API server holds an Event in `namespace` that `matches`, and returns it.
pub async fn eventually_event(
    client: &kube::Client,
    namespace: &str,
    what: &str,
    deadline: Duration,
    matches: impl Fn(&k8s_openapi::api::core::v1::Event) -> bool,
) -> k8s_openapi::api::core::v1::Event {
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(client.clone(), namespace);
    let matches = &matches;
    eventually(what, deadline, || async {
        let list = events
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let count = list.items.len();
        list.items
            .into_iter()
            .find(|e| matches(e))
            .ok_or_else(|| format!("no matching event among {count}"))
    })
    .await
}

/// Polls `check` until it returns `Ok`, or panics with `what` and the last state
/// after `deadline`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    eventually_every(what, deadline, Duration::from_millis(200), check).await
}

/// [`eventually`], checking every `period` (a short one catches a state that lasts
/// only milliseconds).
pub async fn eventually_every<T, F, Fut>(
    what: &str,
    deadline: Duration,
    period: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let until = tokio::time::Instant::now() + deadline;
    let mut last;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        if tokio::time::Instant::now() >= until {
            panic!("timed out after {deadline:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(period).await;
    }
}

/// A negative check: polls `check` every `period` for the whole `window` and panics with
/// `what` at the first failure. A thing that must not happen is concluded absent only after
/// it had the stated time to happen.
pub async fn consistently<F, Fut>(what: &str, window: Duration, period: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let until = tokio::time::Instant::now() + window;
    loop {
        if let Err(e) = check().await {
            panic!("{what} did not hold for {window:?}: {e}");
        }
        if tokio::time::Instant::now() >= until {
            return;
        }
        tokio::time::sleep(period).await;
    }
}

/// An API-server pod `name` bound to `node`: one busybox container `c` that sleeps until
/// SIGTERM, grace 1 s, with `extra` merged over it (a JSON merge patch).
pub fn api_pod(
    name: &str,
    node: &str,
    extra: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    let mut v = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]}]
        }
    });
    apiserver::merge_patch(&mut v, &extra);
    serde_json::from_value(v).expect("a valid pod")
}

/// Waits until the API server's pod `name` is in `phase`; returns it.
pub async fn api_pod_in_phase(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    phase: &str,
    deadline: Duration,
) -> k8s_openapi::api::core::v1::Pod {
    eventually(&format!("{name} {phase}"), deadline, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let now = p.status.as_ref().and_then(|s| s.phase.clone());
        if now.as_deref() == Some(phase) {
            Ok(p)
        } else {
            Err(format!("{:?}", p.status))
        }
    })
    .await
}

/// Mounts at or under `dir` in this (the host's) mount namespace, as (mount point,
/// filesystem type), in mount order.
pub fn mounts_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let point = std::path::PathBuf::from(fields.get(4)?);
            let sep = fields.iter().position(|f| *f == "-")?;
            let fs = fields.get(sep + 1)?.to_string();
            point.starts_with(dir).then_some((point, fs))
        })
        .collect()
}

/// The mount points of [`mounts_under`].
pub fn mount_points_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    mounts_under(dir).into_iter().map(|(p, _)| p).collect()
}

/// Detaches every mount under `dir`, the latest first (what a test's node left mounted,
/// e.g. the token volumes of API pods it never deleted).
pub fn unmount_all_under(dir: &std::path::Path) {
    for point in mount_points_under(dir).into_iter().rev() {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}
