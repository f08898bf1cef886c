//! Running one probe once: exec (CRI ExecSync), httpGet, tcpSocket, gRPC.

use k8s_openapi::api::core::v1::Probe;
use nodeagent_cri::actions::ActionError;
use nodeagent_cri::http_probe::{Probed, http_probe};
use nodeagent_cri::{Cri, actions};
use std::time::Duration;

/// Where and how to probe.
#[derive(Debug, Clone)]
pub struct ProbeCheck {
    pub probe: Probe,
    pub container_id: String,
    pub pod_ip: String,
    /// Container ports by name, to resolve named ports.
    pub named_ports: Vec<(String, i32)>,
}

/// What one run of a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    Success,
    /// A success with something worth telling (upstream `probe.Warning`: an HTTP probe
    /// redirected to another host, which is not followed).
    Warning(String),
    /// The probe ran and failed, with upstream's message.
    Failure(String),
    /// The probe could not be run (upstream's prober error: the runtime's exec call failed,
    /// the probe has no handler). Upstream throws the result away: it is neither a success
    /// nor a failure, and the counters stay as they were.
    Error(String),
}

/// Upstream's `maxProbeRetries`: a prober error is retried this many times in one run.
const MAX_PROBE_RETRIES: usize = 3;

/// Runs the probe once, retrying a prober error as upstream's `runProbeWithRetries`.
pub async fn run_check(cri: &Cri, check: &ProbeCheck) -> Checked {
    let mut last = Checked::Error("not run".into());
    for _ in 0..MAX_PROBE_RETRIES {
        last = run_once(cri, check).await;
        if !matches!(last, Checked::Error(_)) {
            break;
        }
    }
    last
}

async fn run_once(cri: &Cri, check: &ProbeCheck) -> Checked {
    let timeout = Duration::from_secs(check.probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let p = &check.probe;
    if let Some(g) = &p.grpc {
        let Ok(port) = u16::try_from(g.port) else {
            return Checked::Failure(format!("invalid port {}", g.port));
        };
        let service = g.service.as_deref().unwrap_or_default();
        return match crate::grpc::check(&check.pod_ip, port, service, timeout).await {
            Ok(()) => Checked::Success,
            Err(message) => Checked::Failure(message),
        };
    }
    // httpGet is run here rather than through the shared handler runner, which keeps
    // only pass or fail (all a lifecycle hook needs): a probe reports its warning.
    if p.exec.is_none()
        && let Some(h) = &p.http_get
    {
        let port = match actions::resolve_port(&h.port, &check.named_ports) {
            Ok(port) => port,
            Err(message) => return Checked::Failure(message),
        };
        return match http_probe(h, &check.pod_ip, port, timeout).await {
            Ok(Probed::Success) => Checked::Success,
            Ok(Probed::Warning(warning)) => Checked::Warning(warning),
            Err(message) => Checked::Failure(message),
        };
    }
    let target = actions::Target {
        container_id: &check.container_id,
        pod_ip: &check.pod_ip,
        named_ports: &check.named_ports,
    };
    match actions::run_handler(
        cri,
        &target,
        p.exec.as_ref(),
        p.http_get.as_ref(),
        p.tcp_socket.as_ref(),
        timeout,
    )
    .await
    {
        Some(Ok(())) => Checked::Success,
        Some(Err(ActionError::Failed(m))) => Checked::Failure(m),
        // Upstream's exec prober: the command's output, raw, is the whole message.
        Some(Err(ActionError::Exited { output, .. })) => Checked::Failure(output),
        Some(Err(ActionError::Errored(m))) => Checked::Error(m),
        // Validation refuses such a pod; upstream's prober treats one that got through as
        // an error ("missing probe handler"), never as a failure that kills the container.
        None => Checked::Error("missing probe handler (exec, httpGet, tcpSocket or grpc)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HTTPGetAction, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn check(probe: Probe) -> ProbeCheck {
        ProbeCheck {
            probe,
            container_id: String::new(),
            pod_ip: "127.0.0.1".into(),
            named_ports: vec![("web".into(), 0)],
        }
    }

    #[tokio::test]
    async fn http_and_tcp_probes_against_a_local_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 512];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = if request.starts_with("GET /ok ") {
                    "HTTP/1.0 200 OK\r\n\r\n"
                } else if request.starts_with("GET /away ") {
                    // Another host: not followed.
                    "HTTP/1.0 302 Found\r\nLocation: http://192.0.2.1/\r\n\r\nmoved"
                } else {
                    "HTTP/1.0 503 Unavailable\r\n\r\n"
                };
                let _ = s.write_all(line.as_bytes()).await;
            }
        });
        let cri = Cri::connect(
            &"unix:///nonexistent.sock".parse().unwrap(),
            Duration::from_secs(1),
        );
        let get = |path: &str| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::Int(port as i32),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(run_check(&cri, &check(get("/ok"))).await, Checked::Success);
        let Checked::Failure(err) = run_check(&cri, &check(get("/bad"))).await else {
            panic!("a 503 is a failure")
        };
        assert!(err.contains("statuscode: 503"), "{err}");
        assert_eq!(
            run_check(&cri, &check(get("/away"))).await,
            Checked::Warning("Probe terminated redirects, Response body: moved".into())
        );
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(port as i32),
                host: None,
            }),
            ..Default::default()
        };
        assert_eq!(run_check(&cri, &check(tcp)).await, Checked::Success);
        let named = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                host: None,
            }),
            ..Default::default()
        };
        assert!(matches!(
            run_check(&cri, &check(named)).await,
            Checked::Failure(m) if m.contains("unknown port name")
        ));
        // An exec the runtime cannot run (here: no runtime at all) is a prober error,
        // which upstream throws away, and so is a probe without a handler.
        let exec = Probe {
            exec: Some(k8s_openapi::api::core::v1::ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Default::default()
        };
        assert!(matches!(
            run_check(&cri, &check(exec)).await,
            Checked::Error(_)
        ));
        assert!(matches!(
            run_check(&cri, &check(Probe::default())).await,
            Checked::Error(m) if m.starts_with("missing probe handler")
        ));
    }
}
