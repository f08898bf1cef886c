//! Running one probe once: exec (CRI ExecSync), httpGet, tcpSocket.

use k8s_openapi::api::core::v1::Probe;
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
    /// When the container started (its status' StartedAt): initialDelaySeconds counts
    /// from here.
    pub started_at: Option<std::time::SystemTime>,
}

/// Runs the probe once: Ok(()) on success, Err(reason) on failure.
pub async fn run_check(cri: &Cri, check: &ProbeCheck) -> Result<(), String> {
    let timeout = Duration::from_secs(check.probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let p = &check.probe;
    let target = actions::Target {
        container_id: &check.container_id,
        pod_ip: &check.pod_ip,
        named_ports: &check.named_ports,
    };
    actions::run_handler(
        cri,
        &target,
        p.exec.as_ref(),
        p.http_get.as_ref(),
        p.tcp_socket.as_ref(),
        timeout,
    )
    .await
    .unwrap_or_else(|| Err("the probe has no handler (exec, httpGet or tcpSocket)".into()))
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
            started_at: None,
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
                let ok = String::from_utf8_lossy(&buf[..n]).starts_with("GET /ok ");
                let line = if ok {
                    "HTTP/1.0 200 OK\r\n\r\n"
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
        assert_eq!(run_check(&cri, &check(get("/ok"))).await, Ok(()));
        let err = run_check(&cri, &check(get("/bad"))).await.unwrap_err();
        assert!(err.contains("statuscode: 503"), "{err}");
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(port as i32),
                host: None,
            }),
            ..Default::default()
        };
        assert_eq!(run_check(&cri, &check(tcp)).await, Ok(()));
        let named = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                host: None,
            }),
            ..Default::default()
        };
        assert!(
            run_check(&cri, &check(named))
                .await
                .unwrap_err()
                .contains("unknown port name")
        );
    }
}
