//! Actions run against a container or its pod: a command through CRI `ExecSync`, an HTTP
//! GET, a TCP connect. Probes and lifecycle hooks are made of these.

use crate::Cri;
use k8s_openapi::api::core::v1::{Container, ExecAction, HTTPGetAction, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodeagent_proto::cri::ExecSyncRequest;
use std::time::Duration;

/// Why an action did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionError {
    /// The action ran and failed: a non-zero exit, a timeout, an HTTP status, a refused
    /// connection.
    Failed(String),
    /// An exec that exited non-zero, with what it printed: stdout then stderr, as
    /// upstream's `RunInContainer` joins them, at most [`EXEC_OUTPUT_BYTES`]. Upstream's
    /// exec prober makes that output, raw, the probe's whole message (`Readiness probe
    /// failed: <output>`); a hook's log says the exit code too.
    Exited { code: i32, output: String },
    /// The action could not be run at all (the runtime's exec call itself failed, say for a
    /// container that is gone): upstream's prober error, which a probe throws away instead
    /// of counting it as a failure, and which a hook counts as a failure.
    Errored(String),
}

impl std::fmt::Display for ActionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActionError::Failed(m) | ActionError::Errored(m) => f.write_str(m),
            ActionError::Exited { code, output } => {
                write!(f, "command exited with {code}: {}", output.trim())
            }
        }
    }
}

impl From<ActionError> for String {
    fn from(e: ActionError) -> String {
        e.to_string()
    }
}

/// Upstream's exec prober keeps this much of a command's output (`maxReadLength`, 10 KiB,
/// pkg/probe/exec/exec.go).
pub const EXEC_OUTPUT_BYTES: usize = 10 * 1024;

/// Runs `cmd` in the container; Ok when it exits 0, `Exited` with what it printed
/// otherwise, `Errored` when the runtime could not run it.
pub async fn exec(
    cri: &Cri,
    container_id: &str,
    cmd: Vec<String>,
    timeout: Duration,
) -> Result<(), ActionError> {
    let mut runtime = cri.runtime.clone();
    let mut req = tonic::Request::new(ExecSyncRequest {
        container_id: container_id.to_string(),
        cmd,
        timeout: timeout.as_secs().max(1) as i64,
    });
    req.set_timeout(timeout + Duration::from_secs(5));
    match runtime.exec_sync(req).await {
        Ok(r) => {
            let r = r.into_inner();
            if r.exit_code == 0 {
                Ok(())
            } else {
                let mut out = r.stdout;
                out.extend_from_slice(&r.stderr);
                out.truncate(EXEC_OUTPUT_BYTES);
                Err(ActionError::Exited {
                    code: r.exit_code,
                    output: String::from_utf8_lossy(&out).into_owned(),
                })
            }
        }
        // containerd reports an ExecSync timeout as DEADLINE_EXCEEDED; upstream's exec
        // prober counts a timeout as a failure (ExecProbeTimeout).
        Err(e) if e.code() == tonic::Code::DeadlineExceeded => Err(ActionError::Failed(format!(
            "command timed out after {}s",
            timeout.as_secs()
        ))),
        Err(e) => Err(ActionError::Errored(format!(
            "exec failed: {}",
            e.message()
        ))),
    }
}

/// An HTTP GET as upstream's prober does it (see `http_probe`); a warning (a redirect to
/// another host, not followed) is logged and counts as success, as upstream.
pub async fn http_get(
    action: &HTTPGetAction,
    default_host: &str,
    port: u16,
    timeout: Duration,
) -> Result<(), String> {
    match crate::http_probe::http_probe(action, default_host, port, timeout).await? {
        crate::http_probe::Probed::Success => Ok(()),
        crate::http_probe::Probed::Warning(warning) => {
            tracing::warn!(%warning, "HTTP probe succeeded with a warning");
            Ok(())
        }
    }
}

/// Opens (and closes) a TCP connection.
pub async fn tcp_connect(host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
        Err(_) => Err(format!("dial tcp {host}:{port}: timed out")),
    }
}

/// A port given by number or by the name of one of the container's ports.
pub fn resolve_port(p: &IntOrString, named: &[(String, i32)]) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(s) => named
            .iter()
            .find(|(n, _)| n == s)
            .and_then(|(_, p)| u16::try_from(*p).ok())
            .or_else(|| s.parse().ok())
            .ok_or_else(|| format!("unknown port name {s:?}")),
    }
}

/// The container's named ports, to resolve a handler's `port: name`.
pub fn named_ports(c: &Container) -> Vec<(String, i32)> {
    c.ports
        .iter()
        .flatten()
        .filter_map(|p| Some((p.name.clone()?, p.container_port)))
        .collect()
}

/// Where a handler runs: the container, and its pod's IP (the default host) and named ports.
pub struct Target<'a> {
    pub container_id: &'a str,
    pub pod_ip: &'a str,
    pub named_ports: &'a [(String, i32)],
}

/// Runs whichever of exec, httpGet and tcpSocket is set (probes and lifecycle hooks share
/// these); `None` when none is.
pub async fn run_handler(
    cri: &Cri,
    target: &Target<'_>,
    exec_action: Option<&ExecAction>,
    http: Option<&HTTPGetAction>,
    tcp: Option<&TCPSocketAction>,
    timeout: Duration,
) -> Option<Result<(), ActionError>> {
    let failed = |r: Result<(), String>| r.map_err(ActionError::Failed);
    let host = |h: &Option<String>| {
        h.clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| target.pod_ip.to_string())
    };
    if let Some(e) = exec_action {
        let cmd = e.command.clone().unwrap_or_default();
        return Some(exec(cri, target.container_id, cmd, timeout).await);
    }
    if let Some(h) = http {
        let port = match resolve_port(&h.port, target.named_ports) {
            Ok(p) => p,
            Err(e) => return Some(failed(Err(e))),
        };
        return Some(failed(http_get(h, target.pod_ip, port, timeout).await));
    }
    if let Some(t) = tcp {
        let port = match resolve_port(&t.port, target.named_ports) {
            Ok(p) => p,
            Err(e) => return Some(failed(Err(e))),
        };
        return Some(failed(tcp_connect(&host(&t.host), port, timeout).await));
    }
    None
}
