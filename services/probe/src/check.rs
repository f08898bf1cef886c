//! Running one probe once: exec (CRI ExecSync), httpGet, tcpSocket.

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodeagent_cri::Cri;
use nodeagent_proto::cri::ExecSyncRequest;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where and how to probe.
#[derive(Debug, Clone)]
pub struct ProbeCheck {
    pub probe: Probe,
    pub container_id: String,
    pub pod_ip: String,
    /// Container ports by name, to resolve named ports.
    pub named_ports: Vec<(String, i32)>,
}

fn port(p: &IntOrString, named: &[(String, i32)]) -> Result<u16, String> {
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

/// Runs the probe once: Ok(()) on success, Err(reason) on failure.
pub async fn run_check(cri: &Cri, check: &ProbeCheck) -> Result<(), String> {
    let timeout = Duration::from_secs(check.probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let p = &check.probe;
    if let Some(exec) = &p.exec {
        let mut runtime = cri.runtime.clone();
        let mut req = tonic::Request::new(ExecSyncRequest {
            container_id: check.container_id.clone(),
            cmd: exec.command.clone().unwrap_or_default(),
            timeout: timeout.as_secs() as i64,
        });
        req.set_timeout(timeout + Duration::from_secs(5));
        return match runtime.exec_sync(req).await {
            Ok(r) => {
                let r = r.into_inner();
                if r.exit_code == 0 {
                    Ok(())
                } else {
                    let out = String::from_utf8_lossy(&r.stdout).trim().to_string();
                    Err(format!("command exited with {}: {out}", r.exit_code))
                }
            }
            Err(e) if e.code() == tonic::Code::DeadlineExceeded => {
                Err(format!("command timed out after {}s", timeout.as_secs()))
            }
            Err(e) => Err(format!("exec failed: {}", e.message())),
        };
    }
    if let Some(http) = &p.http_get {
        let host = http
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| check.pod_ip.clone());
        let port = port(&http.port, &check.named_ports)?;
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        return tokio::time::timeout(timeout, http_get(&host, port, &path))
            .await
            .map_err(|_| {
                format!(
                    "GET http://{host}:{port}{path}: timed out after {}s",
                    timeout.as_secs()
                )
            })?;
    }
    if let Some(tcp) = &p.tcp_socket {
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| check.pod_ip.clone());
        let port = port(&tcp.port, &check.named_ports)?;
        return match tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {host}:{port}: timed out")),
        };
    }
    Err("the probe has no handler (exec, httpGet or tcpSocket)".into())
}

/// A minimal HTTP/1.0 GET; 200–399 is success, as upstream.
async fn http_get(host: &str, port: u16, path: &str) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("GET http://{host}:{port}{path}: {e}"))?;
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\n\r\n"
    );
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1024];
    let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
    let head = String::from_utf8_lossy(&buf[..n]);
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("malformed HTTP response")?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HTTPGetAction, TCPSocketAction};

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
