//! The node's own web page under `/ui/` on port 10250 (issue 34): what the seeds'
//! cAdvisor UI on 4194 showed, behind the same authentication and authorization as every
//! other path (subresource `nodes/ui`, then `nodes/proxy`, as upstream's fine-grained
//! checks go). The page (HTML, CSS, script) is embedded here and fetches everything with
//! relative URLs, so it also works through the API server's node proxy
//! (`kubectl proxy`, then `/api/v1/nodes/<node>/proxy/ui/`). It reads the pods from `/pods`
//! and the log tail from `/containerLogs` (each checked by its own subresource); the rest
//! comes from `/ui/api/`: the node (conditions, capacity, pressure signals against their
//! thresholds, the seven services), the history of the last hour ([`history`], which also
//! needs `nodes/stats`), and a pod's events, volumes, probe results and traces (which also
//! need `nodes/pods` or `nodes/proxy`: `authz::checks`).

pub mod history;
pub mod probes;
pub mod services;
pub mod signals;
pub mod traces;

use crate::AppState;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use nodeagent_config::Service;
use nodeagent_proto::api::node_status_client::NodeStatusClient;
use nodeagent_proto::api::volume_client::VolumeClient;
use nodeagent_proto::api::{GetNodeRequest, ListVolumesRequest};
use nodeagent_transport::WithLimits;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long one question to another service may take while a page waits.
const ASK: Duration = Duration::from_secs(2);

/// What the page keeps between requests.
#[derive(Default)]
pub struct UiState {
    pub history: Mutex<history::History>,
    pub services: services::Seen,
    pub probes: Mutex<probes::ProbeLog>,
    /// The process found serving each service's socket, with its start (clock ticks after
    /// boot): while a process of that pid and start lives, it is the one (a pid is not
    /// reused while its process lives), so the socket is not connected to again.
    pub servers: Mutex<BTreeMap<&'static str, (u32, u64)>>,
    /// The Node node-status built last for the page, and when it was asked.
    pub node: Mutex<Option<(std::time::Instant, Value)>>,
}

const INDEX: &str = include_str!("ui/assets/index.html");
const SCRIPT: &str = include_str!("ui/assets/app.js");
const STYLE: &str = include_str!("ui/assets/app.css");

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("ui/") }))
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route("/ui/api/node", get(node))
        .route("/ui/api/history", get(history_of))
        .route("/ui/api/pod", get(pod))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // Nothing but this server: no script, style or font from anywhere else.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
        ],
        body,
    )
        .into_response()
}

fn json_response(value: &Value) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        value.to_string(),
    )
        .into_response()
}

/// Takes a point of history now and then every `--ui-history-period` (15 s by default,
/// [`history::PERIOD`]); forgets the probe results of pods that are gone.
pub async fn sample(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(state.config.ui_history_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match crate::stats::collect::collect(&state, false).await {
            Ok(collected) => {
                let t = unix_ms();
                let mut h = state.ui.history.lock().unwrap_or_else(|e| e.into_inner());
                h.record(t, &collected.summary);
            }
            Err(e) => tracing::debug!(error = %e.message(), "no stats for the page's history"),
        }
        // The probe results of pods no longer on the node go (pod-sync's list, as `/pods`).
        if let Some(live) = pods_here(&state) {
            let live: std::collections::HashSet<String> =
                live.iter().map(|(uid, _, _)| uid.clone()).collect();
            state
                .ui
                .probes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|uid| live.contains(uid));
        }
    }
}

/// The pods on this node as (uid, namespace, name), from pod-sync's last list (however
/// old: a quiet node's list is not renewed; the node page test once got 404 for a pod's
/// details a minute after its pod's last change); None before pod-sync gave one.
fn pods_here(state: &AppState) -> Option<Vec<(String, String, String)>> {
    let pods = state.last_pods.latest()?;
    Some(
        pods.iter()
            .filter_map(|json| {
                let p: Value = serde_json::from_slice(json).ok()?;
                let m = &p["metadata"];
                Some((
                    m["uid"].as_str()?.to_string(),
                    m["namespace"].as_str()?.to_string(),
                    m["name"].as_str()?.to_string(),
                ))
            })
            .collect(),
    )
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// How often the socket directory is looked at for probe instances.
const INSTANCES_LOOKED_FOR: Duration = Duration::from_secs(5);

/// Follows the probe service's results into [`UiState::probes`]: the default instance's,
/// and those of every `--probe-instance` (each serves `probe-<id>.sock` next to the
/// default socket), found by looking at that directory every few seconds; an instance's
/// follower stops when its socket is gone.
pub async fn follow_probes(state: Arc<AppState>, shutdown: nodeagent_transport::Shutdown) {
    let mut followers = tokio::task::JoinSet::new();
    followers.spawn(follow_probe(
        state.clone(),
        state.peers[&Service::Probe].clone(),
        shutdown.clone(),
    ));
    let nodeagent_config::Address::Unix(default) = state.config.endpoint(Service::Probe) else {
        // (Instances need a unix probe endpoint.)
        followers.join_all().await;
        return;
    };
    let dir = default.parent().map(std::path::Path::to_path_buf);
    let mut instances: BTreeMap<std::path::PathBuf, tokio::task::AbortHandle> = BTreeMap::new();
    let mut tick = tokio::time::interval(INSTANCES_LOOKED_FOR);
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = tick.tick() => {}
        }
        let found: std::collections::BTreeSet<std::path::PathBuf> = dir
            .as_deref()
            .and_then(|d| std::fs::read_dir(d).ok())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(nodeagent_config::Address::probe_instance_id)
                    .is_some()
            })
            .collect();
        instances.retain(|path, follower| {
            let keep = found.contains(path);
            if !keep {
                follower.abort();
            }
            keep
        });
        for path in found {
            if let std::collections::btree_map::Entry::Vacant(entry) = instances.entry(path) {
                let channel = nodeagent_transport::connect(&nodeagent_config::Address::Unix(
                    entry.key().clone(),
                ));
                entry.insert(followers.spawn(follow_probe(
                    state.clone(),
                    channel,
                    shutdown.clone(),
                )));
            }
        }
        // Followers that ended (aborted) are reaped.
        while followers.try_join_next().is_some() {}
    }
    followers.abort_all();
}

/// One probe instance's results into [`UiState::probes`].
async fn follow_probe(
    state: Arc<AppState>,
    channel: nodeagent_transport::Channel,
    shutdown: nodeagent_transport::Shutdown,
) {
    let mut rx = nodeagent_transport::watch_probe_results(channel, shutdown);
    while let Some(event) = rx.recv().await {
        if let nodeagent_transport::WatchEvent::Message(update) = event {
            let t = unix_ms();
            let mut log = state.ui.probes.lock().unwrap_or_else(|e| e.into_inner());
            for r in &update.results {
                log.record(t, r);
            }
        }
    }
}

/// Each service's process: the one serving its socket (peer credentials, asked again only
/// once the process found before is gone), this one for http-server; its start time,
/// resident memory from `/proc`.
async fn processes(state: &AppState) -> BTreeMap<&'static str, services::Process> {
    let sockets: Vec<(&'static str, Option<std::path::PathBuf>)> = Service::ALL
        .into_iter()
        .map(|s| match state.config.endpoint(s) {
            nodeagent_config::Address::Unix(path) => (s.name(), Some(path.clone())),
            nodeagent_config::Address::Vsock { .. } => (s.name(), None),
        })
        .collect();
    let mut servers = state
        .ui
        .servers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let found = tokio::task::spawn_blocking(move || {
        use crate::stats::process::{read_stat, read_status, socket_server_pid, status_bytes};
        let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let boot = crate::stats::host::boot_time_ns(&proc_stat).unwrap_or(0) as f64 / 1e9;
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .map_or(100.0, |t| t as f64);
        let processes = sockets
            .into_iter()
            .map(|(name, socket)| {
                // A process lives while it has memory (a zombie has none).
                let read = |pid: u32| {
                    let stat = read_stat(pid)?;
                    let rss = read_status(pid).and_then(|t| status_bytes(&t, "VmRSS"))?;
                    Some((pid, stat, rss))
                };
                let known = servers.get(name).and_then(|&(pid, start)| {
                    read(pid).filter(|(_, stat, _)| stat.start_ticks == start)
                });
                let found = known.or_else(|| {
                    read(if name == Service::HttpServer.name() {
                        std::process::id()
                    } else {
                        socket_server_pid(socket.as_deref()?)?
                    })
                });
                match found {
                    Some((pid, stat, _)) => servers.insert(name, (pid, stat.start_ticks)),
                    None => servers.remove(name),
                };
                let process = found.map_or_else(services::Process::default, |(pid, stat, rss)| {
                    services::Process {
                        pid: Some(pid),
                        start_time: Some(boot + stat.start_ticks as f64 / ticks),
                        resident_memory_bytes: Some(rss as f64),
                    }
                });
                (name, process)
            })
            .collect();
        (processes, servers)
    })
    .await;
    match found {
        Ok((processes, servers)) => {
            *state.ui.servers.lock().unwrap_or_else(|e| e.into_inner()) = servers;
            processes
        }
        Err(_) => BTreeMap::new(),
    }
}

/// Fills in systemd's restart counts for the processes not asked about yet: one
/// `systemctl show` per unit a service's process is in, once per process (a restart
/// changes the process; NRestarts changes with nothing else).
async fn systemd_restarts(
    state: &AppState,
    processes: &BTreeMap<&'static str, services::Process>,
    rows: &mut [services::Row],
) {
    let asks = rows
        .iter()
        .filter(|r| state.ui.services.systemd_unasked(r.name))
        .map(|r| (r.name, processes.get(r.name).and_then(|p| p.pid)))
        .map(|(name, pid)| async move {
            // The unit is read only for a process not asked about yet, not each refresh.
            let Some((pid, unit)) = pid.and_then(|pid| {
                let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                Some((pid, services::unit_of(&cgroup)?))
            }) else {
                return (name, None);
            };
            let show = tokio::process::Command::new("systemctl")
                .args(["show", "--property=MainPID", "--property=NRestarts", "--"])
                .arg(&unit)
                .kill_on_drop(true)
                .output();
            let restarts = match tokio::time::timeout(ASK, show).await {
                Ok(Ok(out)) if out.status.success() => {
                    services::nrestarts_of(&String::from_utf8_lossy(&out.stdout), pid)
                }
                Ok(Ok(out)) => {
                    tracing::debug!(%unit, stderr = %String::from_utf8_lossy(&out.stderr), "systemctl show failed");
                    None
                }
                Ok(Err(e)) => {
                    tracing::debug!(%unit, error = %e, "systemctl show could not run");
                    None
                }
                Err(_) => None,
            };
            (name, restarts)
        });
    for (name, restarts) in futures::future::join_all(asks).await {
        state.ui.services.set_systemd(name, restarts);
        if let (Some(n), Some(row)) = (restarts, rows.iter_mut().find(|r| r.name == name)) {
            row.restarts = n;
            row.restarts_from = "systemd";
        }
    }
}

/// Fills in the versions not known yet, asking only those services (a scrape of each, once
/// per process).
async fn versions(state: &AppState, rows: &mut [services::Row]) {
    let missing: Vec<Service> = rows
        .iter()
        .filter(|r| r.version.is_none() && r.start_time.is_some())
        .filter_map(|r| Service::from_name(r.name))
        .collect();
    let asks = missing.into_iter().map(|s| async move {
        let families: Vec<crate::metrics::exposition::Family> = if s == Service::HttpServer {
            let text = tokio::task::spawn_blocking(nodeagent_telemetry::metrics::encode)
                .await
                .unwrap_or_default();
            crate::metrics::exposition::parse(&text).unwrap_or_default()
        } else {
            crate::metrics::gather(state, Some(s))
                .await
                .families()
                .cloned()
                .collect()
        };
        (s, services::version_of(&families, s.name()))
    });
    for (s, version) in futures::future::join_all(asks).await {
        let Some(version) = version else { continue };
        state.ui.services.set_version(s.name(), version.clone());
        if let Some(row) = rows.iter_mut().find(|r| r.name == s.name()) {
            row.version = Some(version);
        }
    }
}

/// `/ui/api/node`: the Node (node-status's view), the services, the pressure signals.
async fn node(State(state): State<Arc<AppState>>) -> Response {
    let node = async {
        // node-status builds the Node afresh for each question (the runtime's status and
        // version, pleg's health, the pressure observations, pod-sync's devices): the page
        // asks again only once its last answer is `nodeStatusUpdateFrequency` old, as old as
        // the API server's copy may be (the bench's largest cost of an open page).
        let max_age = state.config.kubelet.node_status_update_frequency;
        let cached = state
            .ui
            .node
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some((_, node)) = cached.filter(|(at, _)| at.elapsed() < max_age) {
            return Some(node);
        }
        let mut c = NodeStatusClient::new(state.peers[&Service::NodeStatus].clone()).with_limits();
        let node = match tokio::time::timeout(ASK, c.get_node(GetNodeRequest {})).await {
            Ok(Ok(r)) => serde_json::from_slice::<Value>(&r.into_inner().node_json).ok(),
            _ => None,
        };
        if let Some(n) = &node {
            *state.ui.node.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((std::time::Instant::now(), n.clone()));
        }
        node
    };
    let services = async {
        // A wedged service's socket (a full backlog) must not hold the page up.
        let processes = async {
            tokio::time::timeout(ASK, processes(&state))
                .await
                .unwrap_or_default()
        };
        let (processes, health) = tokio::join!(processes, state.health.check());
        let health = health
            .checks
            .iter()
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        let mut rows = services::rows(&processes, &health, &state.ui.services);
        versions(&state, &mut rows).await;
        systemd_restarts(&state, &processes, &mut rows).await;
        rows
    };
    let signals = async {
        let image_fs = state.cri.image_fs_mount().await;
        let root_dir = state.config.root_dir.clone();
        let observed = tokio::task::spawn_blocking(move || {
            nodeagent_config::eviction::observe(
                &nodeagent_config::cgroupfs::Cgroups::detect(),
                &root_dir,
                image_fs.as_deref(),
            )
        })
        .await
        .unwrap_or_default();
        match nodeagent_config::eviction::Thresholds::from_config(&state.config.kubelet) {
            Ok(thresholds) => signals::rows(&thresholds, &observed),
            Err(_) => signals::rows(&Default::default(), &observed),
        }
    };
    let (node, services, signals) = tokio::join!(node, services, signals);
    json_response(&json!({
        "nodeName": state.config.node_name,
        "node": node,
        "services": services,
        "signals": signals,
        "historyPeriodSeconds": state.config.ui_history_period.as_secs(),
    }))
}

#[derive(serde::Deserialize)]
struct HistoryQuery {
    /// A pod's UID; none for the node.
    uid: Option<String>,
}

/// `/ui/api/history`: the node's series, or a pod's and its containers'.
async fn history_of(State(state): State<Arc<AppState>>, Query(q): Query<HistoryQuery>) -> Response {
    let h = state.ui.history.lock().unwrap_or_else(|e| e.into_inner());
    let body = match q.uid {
        None => json!({ "node": h.node }),
        Some(uid) => match h.pods.get(&uid) {
            Some(p) => json!(p),
            None => json!({ "pod": [], "containers": {} }),
        },
    };
    drop(h);
    json_response(&body)
}

#[derive(serde::Deserialize)]
struct PodQuery {
    uid: String,
}

/// A pod of this node, as `/pods` lists it.
struct PodRef {
    uid: String,
    namespace: String,
    name: String,
}

/// `/ui/api/pod?uid=`: a pod's events, mounted volumes, probe results and traces; only for
/// a pod on this node (its namespace and name from the node's own list), else 404.
async fn pod(State(state): State<Arc<AppState>>, Query(q): Query<PodQuery>) -> Response {
    let Some(q) = pods_here(&state)
        .unwrap_or_default()
        .into_iter()
        .find(|(uid, _, _)| *uid == q.uid)
        .map(|(uid, namespace, name)| PodRef {
            uid,
            namespace,
            name,
        })
    else {
        return (StatusCode::NOT_FOUND, "no such pod on this node\n").into_response();
    };
    let volumes = async {
        let mut c = VolumeClient::new(state.peers[&Service::Volume].clone()).with_limits();
        match tokio::time::timeout(ASK, c.list(ListVolumesRequest {})).await {
            Ok(Ok(r)) => r
                .into_inner()
                .volumes
                .into_iter()
                .filter(|v| v.pod_uid == q.uid)
                .map(|v| json!({"name": v.name, "plugin": v.plugin, "hostPath": v.host_path}))
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        }
    };
    let (events, volumes, traces) =
        tokio::join!(events(&state, &q), volumes, traces::of_pod(&state, &q.uid));
    let probes = state
        .ui
        .probes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .of(&q.uid);
    json_response(&json!({
        "events": events,
        "volumes": volumes,
        "probes": probes,
        "traces": traces,
    }))
}

/// The pod's events: from the API server when there is one (as `kubectl describe` lists
/// them), else the Warning events the services recorded lately (each keeps its own).
async fn events(state: &AppState, q: &PodRef) -> Value {
    let mut refused = None;
    if let Some(client) = &state.api {
        use k8s_openapi::api::core::v1::Event;
        let api: kube::Api<Event> = kube::Api::namespaced(client.clone(), &q.namespace);
        let params =
            kube::api::ListParams::default().fields(&format!("involvedObject.uid={}", q.uid));
        match tokio::time::timeout(ASK, api.list(&params)).await {
            Ok(Ok(list)) => {
                return Value::Array(
                    list.items
                        .iter()
                        .map(|e| {
                            json!({
                                "type": e.type_,
                                "reason": e.reason,
                                "message": e.message,
                                "count": e.count.unwrap_or(1),
                                "last": e.last_timestamp.as_ref().map(|t| t.0.to_string())
                                    .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string())),
                                "source": e.source.as_ref().and_then(|s| s.component.clone()),
                                "fieldPath": e.involved_object.field_path,
                            })
                        })
                        .collect(),
                );
            }
            // Upstream's `system:node` role may create events, not list them: on such a
            // cluster the services' own Warnings are shown instead, saying why.
            Ok(Err(e)) => refused = Some(format!("listing events: {e}")),
            Err(_) => refused = Some("listing events timed out".to_string()),
        }
    }
    let object = format!("{}/{}", q.namespace, q.name);
    let asks = state.peers.iter().map(|(service, channel)| {
        use nodeagent_proto::api::RecentWarningsRequest;
        use nodeagent_proto::api::metrics_client::MetricsClient;
        let mut c = MetricsClient::new(channel.clone()).with_limits();
        let object = object.clone();
        async move {
            let Ok(Ok(r)) =
                tokio::time::timeout(ASK, c.recent_warnings(RecentWarningsRequest {})).await
            else {
                return Vec::new();
            };
            r.into_inner()
                .warnings
                .into_iter()
                .filter(|w| w.object == object)
                .map(|w| {
                    json!({
                        "type": "Warning",
                        "reason": w.reason,
                        "message": w.message,
                        "count": w.count,
                        "lastUnixMs": w.last_unix_nanos / 1_000_000,
                        "source": service.name(),
                        "fieldPath": w.field_path,
                    })
                })
                .collect::<Vec<_>>()
        }
    });
    let warnings: Vec<Value> = futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect();
    match refused {
        Some(why) => json!({"error": why, "warnings": warnings}),
        None => Value::Array(warnings),
    }
}
