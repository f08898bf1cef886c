//! `nodeagent status`: the node agent at a glance, for an operator at the node. Each
//! service's health (its gRPC health check, which covers its main loops) and the build it
//! runs (`nodeagent_build_info` from its metrics: services are upgraded one at a time, so
//! two may differ); the Node's conditions (node-status); the pods by phase and the
//! containers that are waiting for a reason other than starting (pod-sync: image pull
//! errors, crash-loop back-off, bad configuration); the last Warning events the services
//! recorded (each keeps its own in memory, API server or not); the configuration's fields
//! and flags that are accepted but not acted on. Exits 0 when every service serves and the node is
//! Ready, 1 otherwise (naming why), 2 on a bad command line.
//!
//! It reads the services' own flags: those given, or else the ones `kubelet` left in
//! `<socket-dir>/kubelet.env` on a kubeadm node, so `nodeagent status` alone finds the
//! sockets and the config file the services use.

use clap::CommandFactory;
use nodeagent_config::{Config, KubeletFlags, Service};
use nodeagent_proto::api::metrics_client::MetricsClient;
use nodeagent_proto::api::node_status_client::NodeStatusClient;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_proto::api::{GetNodeRequest, ListPodsRequest, RecentWarningsRequest, ScrapeRequest};
use nodeagent_transport::WithLimits;
use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

/// How long each question to a service may take.
const ASK: Duration = Duration::from_secs(3);
/// How many recent warnings the report shows.
const WARNINGS_SHOWN: usize = 10;

/// What one service answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceState {
    pub name: &'static str,
    /// `Ok` when it serves; else why not (not serving, no socket, no answer).
    pub health: Result<(), String>,
    pub version: Option<String>,
    /// The Warning events it recorded lately, oldest first.
    pub warnings: Vec<Warning>,
}

/// A Warning event a service recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Warning {
    pub service: &'static str,
    pub last_unix_nanos: i64,
    /// "namespace/name", or the node's name.
    pub object: String,
    /// The container's name, when it is about one.
    pub container: Option<String>,
    pub reason: String,
    pub message: String,
    pub count: u32,
}

/// A Node condition as node-status reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub kind: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Everything the report shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub node: String,
    pub services: Vec<ServiceState>,
    /// `None` when node-status could not be asked.
    pub conditions: Option<Vec<Condition>>,
    /// `None` when pod-sync could not be asked.
    pub phases: Option<BTreeMap<String, usize>>,
    /// "namespace/name container: reason: message".
    pub waiting: Vec<String>,
    /// The newest Warning events of all services, oldest first.
    pub warnings: Vec<Warning>,
    pub ignored_fields: Vec<String>,
    pub ignored_flags: Vec<String>,
}

/// Why the node agent is not healthy: every service serving and the node Ready (a
/// condition `Ready` with status `True`), or the reasons.
pub fn problems(report: &Report) -> Vec<String> {
    let mut out: Vec<String> = report
        .services
        .iter()
        .filter_map(|s| s.health.as_ref().err().map(|e| format!("{}: {e}", s.name)))
        .collect();
    match &report.conditions {
        None => out.push("node conditions unknown (node-status did not answer)".into()),
        Some(conditions) => match conditions.iter().find(|c| c.kind == "Ready") {
            Some(c) if c.status == "True" => {}
            Some(c) => out.push(format!("node not Ready: {} {}", c.reason, c.message)),
            None => out.push("node has no Ready condition yet".into()),
        },
    }
    out
}

/// The containers waiting for a reason other than being started, from pods' JSON
/// (upstream's waiting reasons: ErrImagePull, ImagePullBackOff, CrashLoopBackOff,
/// CreateContainerConfigError, ...).
pub fn waiting_containers(pods: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for pod in pods {
        let name = format!(
            "{}/{}",
            pod["metadata"]["namespace"].as_str().unwrap_or_default(),
            pod["metadata"]["name"].as_str().unwrap_or_default()
        );
        for key in [
            "initContainerStatuses",
            "containerStatuses",
            "ephemeralContainerStatuses",
        ] {
            for c in pod["status"][key].as_array().into_iter().flatten() {
                let waiting = &c["state"]["waiting"];
                let reason = waiting["reason"].as_str().unwrap_or_default();
                if reason.is_empty() || matches!(reason, "ContainerCreating" | "PodInitializing") {
                    continue;
                }
                let message = waiting["message"].as_str().unwrap_or_default();
                let container = c["name"].as_str().unwrap_or_default();
                out.push(if message.is_empty() {
                    format!("{name} {container}: {reason}")
                } else {
                    format!("{name} {container}: {reason}: {message}")
                });
            }
        }
    }
    out
}

/// Pods by `status.phase` (a pod without one yet counts as Pending, as upstream shows it).
pub fn phases(pods: &[Value]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for pod in pods {
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        *out.entry(phase.to_string()).or_insert(0) += 1;
    }
    out
}

/// The value of `nodeagent_build_info`'s `version` label in a metrics text.
pub fn build_version(metrics: &str) -> Option<String> {
    let line = metrics
        .lines()
        .find(|l| l.starts_with("nodeagent_build_info{"))?;
    let at = line.find("version=\"")? + "version=\"".len();
    let rest = &line[at..];
    let mut out = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    None
}

/// The report as text, and the verdict's last line.
pub fn render(report: &Report) -> String {
    let mut out = format!("node {}\n\nservices:\n", report.node);
    for s in &report.services {
        let health = match &s.health {
            Ok(()) => "serving".to_string(),
            Err(e) => format!("NOT SERVING ({e})"),
        };
        let version = s.version.as_deref().unwrap_or("version unknown");
        out.push_str(&format!("  {:<14} {health:<12} {version}\n", s.name));
    }
    out.push_str("\nconditions:\n");
    match &report.conditions {
        None => out.push_str("  unknown (node-status did not answer)\n"),
        Some(cs) if cs.is_empty() => out.push_str("  none yet\n"),
        Some(cs) => {
            for c in cs {
                out.push_str(&format!(
                    "  {:<22} {:<7} {} {}\n",
                    c.kind, c.status, c.reason, c.message
                ));
            }
        }
    }
    match &report.phases {
        None => out.push_str("\npods: unknown (pod-sync did not answer)\n"),
        Some(p) => {
            let total: usize = p.values().sum();
            let parts: Vec<String> = p.iter().map(|(k, v)| format!("{k} {v}")).collect();
            out.push_str(&format!("\npods: {total}"));
            if !parts.is_empty() {
                out.push_str(&format!(" ({})", parts.join(", ")));
            }
            out.push('\n');
        }
    }
    if !report.waiting.is_empty() {
        out.push_str("\nwaiting containers:\n");
        for w in &report.waiting {
            out.push_str(&format!("  {w}\n"));
        }
    }
    if !report.warnings.is_empty() {
        out.push_str("\nrecent warnings (UTC, newest last):\n");
        for w in &report.warnings {
            let secs = w
                .last_unix_nanos
                .div_euclid(1_000_000_000)
                .rem_euclid(86_400);
            let what = match &w.container {
                Some(c) => format!("{} {c}", w.object),
                None => w.object.clone(),
            };
            let times = if w.count > 1 {
                format!(" (x{})", w.count)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "  {:02}:{:02}:{:02} {:<11} {what}: {}: {}{times}\n",
                secs / 3600,
                secs / 60 % 60,
                secs % 60,
                w.service,
                w.reason,
                w.message
            ));
        }
    }
    if !report.ignored_fields.is_empty() || !report.ignored_flags.is_empty() {
        out.push_str("\naccepted but not acted on:\n");
        if !report.ignored_fields.is_empty() {
            out.push_str(&format!(
                "  config fields: {}\n",
                report.ignored_fields.join(", ")
            ));
        }
        if !report.ignored_flags.is_empty() {
            out.push_str(&format!("  flags: {}\n", report.ignored_flags.join(", ")));
        }
    }
    let problems = problems(report);
    if problems.is_empty() {
        out.push_str("\nhealthy\n");
    } else {
        out.push_str("\nUNHEALTHY:\n");
        for p in problems {
            out.push_str(&format!("  {p}\n"));
        }
    }
    out
}

async fn ask_service(config: &Config, service: Service) -> ServiceState {
    let address = config.endpoint(service);
    // One connection serves both questions.
    let channel = nodeagent_transport::connect(address);
    let health = nodeagent_transport::check_health(channel.clone(), "", ASK).await;
    let mut metrics = MetricsClient::new(channel).with_limits();
    let version = match tokio::time::timeout(ASK, metrics.scrape(ScrapeRequest {})).await {
        Ok(Ok(r)) => build_version(&r.into_inner().text),
        _ => None,
    };
    // A service of an older build does not know the call: it has none to show.
    let warnings =
        match tokio::time::timeout(ASK, metrics.recent_warnings(RecentWarningsRequest {})).await {
            Ok(Ok(r)) => r.into_inner().warnings,
            _ => Vec::new(),
        };
    ServiceState {
        name: service.name(),
        health: health.map_err(|e| format!("{e} at {address}")),
        version,
        warnings: warnings
            .into_iter()
            .map(|w| Warning {
                service: service.name(),
                last_unix_nanos: w.last_unix_nanos,
                object: w.object,
                container: container_of(&w.field_path),
                reason: w.reason,
                message: w.message,
                count: w.count,
            })
            .collect(),
    }
}

async fn ask_conditions(config: &Config) -> Option<Vec<Condition>> {
    let mut client = NodeStatusClient::new(nodeagent_transport::connect(
        config.endpoint(Service::NodeStatus),
    ))
    .with_limits();
    let reply = tokio::time::timeout(ASK, client.get_node(GetNodeRequest {}))
        .await
        .ok()?
        .ok()?
        .into_inner();
    let node: Value = serde_json::from_slice(&reply.node_json).ok()?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Some(
        node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| Condition {
                kind: text(&c["type"]),
                status: text(&c["status"]),
                reason: text(&c["reason"]),
                message: text(&c["message"]),
            })
            .collect(),
    )
}

async fn ask_pods(config: &Config) -> Option<Vec<Value>> {
    let mut client = PodSyncClient::new(nodeagent_transport::connect(
        config.endpoint(Service::PodSync),
    ))
    .with_limits();
    let reply = tokio::time::timeout(ASK, client.list_pods(ListPodsRequest {}))
        .await
        .ok()?
        .ok()?
        .into_inner();
    Some(
        reply
            .pods_json
            .iter()
            .filter_map(|p| serde_json::from_slice(p).ok())
            .collect(),
    )
}

/// Gathers the report from the running services.
pub async fn gather(config: &Config) -> Report {
    let mut services = Vec::with_capacity(Service::ALL.len());
    for service in Service::ALL {
        services.push(ask_service(config, service).await);
    }
    let (conditions, pods) = tokio::join!(ask_conditions(config), ask_pods(config));
    let warnings = newest_warnings(services.iter().flat_map(|s| s.warnings.clone()));
    Report {
        node: config.node_name.clone(),
        services,
        conditions,
        phases: pods.as_deref().map(phases),
        waiting: pods.as_deref().map(waiting_containers).unwrap_or_default(),
        warnings,
        ignored_fields: config.ignored_fields.clone(),
        ignored_flags: config.ignored_flags.clone(),
    }
}

/// The container a `fieldPath` names (`spec.containers{c}`, `spec.initContainers{c}`).
pub fn container_of(field_path: &str) -> Option<String> {
    let (_, rest) = field_path.split_once('{')?;
    Some(rest.strip_suffix('}')?.to_string())
}

/// The [`WARNINGS_SHOWN`] newest of all services' warnings, oldest first.
pub fn newest_warnings(all: impl Iterator<Item = Warning>) -> Vec<Warning> {
    let mut all: Vec<Warning> = all.collect();
    all.sort_by_key(|w| w.last_unix_nanos);
    let skip = all.len().saturating_sub(WARNINGS_SHOWN);
    all.split_off(skip)
}

/// The flags of `kubelet.env` (`KUBELET_ARGS='...'`), as `kubelet` wrote them.
pub fn kubelet_env_args(text: &str) -> Option<Vec<OsString>> {
    let line = text.lines().find_map(|l| l.strip_prefix("KUBELET_ARGS="))?;
    let inner = line.trim().trim_matches('\'');
    Some(inner.split_whitespace().map(OsString::from).collect())
}

/// `nodeagent status [flags]`: `args` holds the program name first.
pub fn main(args: Vec<OsString>) -> ExitCode {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: KubeletFlags,
    }
    let name = "nodeagent status";
    let cmd = Cli::command().name(name).bin_name(name).about(
        "The node agent at a glance: services, node conditions, pods; exit 1 when unhealthy",
    );
    let mut args = args;
    if args.len() == 1 {
        // No flags: the ones kubelet left for the services, when there are.
        let default_env =
            std::path::Path::new("/run/nodeagent").join(nodeagent_transport::KUBELET_ENV);
        if let Some(found) = std::fs::read_to_string(default_env)
            .ok()
            .and_then(|t| kubelet_env_args(&t))
        {
            args.extend(found);
        }
    }
    let cli: Cli = nodeagent_transport::parse_command_line(cmd, args, |c: &mut Cli| &mut c.flags);
    let config = match Config::load(&cli.flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = runtime.block_on(gather(&config));
    print!("{}", render(&report));
    if problems(&report).is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests;
