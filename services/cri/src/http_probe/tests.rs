//! The HTTP probe against a local server that records every request it gets.

use super::*;
use crate::Cri;
use crate::actions::{Target, run_handler};
use k8s_openapi::api::core::v1::HTTPHeader;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Request heads the server received, in order.
type Seen = Arc<Mutex<Vec<String>>>;

/// Answers each request with `answer(path, port)`: (status line, extra header lines, body).
async fn server(
    answer: fn(&str, u16) -> (u16, String, String),
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (u16, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (record, tls) = (record.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(tcp).await {
                            handle(s, answer, port, record).await
                        }
                    }
                    None => handle(tcp, answer, port, record).await,
                }
            });
        }
    });
    (port, seen)
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    answer: fn(&str, u16) -> (u16, String, String),
    port: u16,
    seen: Seen,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    seen.lock().unwrap().push(head);
    let (code, extra, body) = answer(&path, port);
    let response = format!(
        "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        body.len()
    );
    let _ = s.write_all(response.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// /ok 200, /r1 -> /ok, /loop -> /loop, /away -> localhost (another hostname), /big 200
/// with 1 MiB, anything else 500.
fn routes(path: &str, port: u16) -> (u16, String, String) {
    let redirect = |to: String| (302, format!("Location: {to}\r\n"), String::new());
    match path {
        "/ok" => (200, String::new(), "fine".into()),
        "/r1" => redirect("/ok".into()),
        "/loop" => redirect("/loop".into()),
        "/away" => redirect(format!("http://localhost:{port}/ok")),
        "/big" => (200, String::new(), "x".repeat(1 << 20)),
        _ => (500, String::new(), "broken".into()),
    }
}

fn action(port: u16, path: &str, headers: &[(&str, &str)]) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(port.into()),
        http_headers: (!headers.is_empty()).then(|| {
            headers
                .iter()
                .map(|(n, v)| HTTPHeader {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect()
        }),
        ..Default::default()
    }
}

/// Through the handler runner probes and hooks share.
async fn get(action: HTTPGetAction) -> Result<(), String> {
    let cri = Cri::connect(
        &"unix:///nonexistent.sock".parse().unwrap(),
        Duration::from_secs(1),
    );
    let target = Target {
        container_id: "",
        pod_ip: "127.0.0.1",
        named_ports: &[],
    };
    run_handler(
        &cri,
        &target,
        None,
        Some(&action),
        None,
        Duration::from_secs(2),
    )
    .await
    .unwrap()
    .map_err(String::from)
}

#[tokio::test]
async fn crlf_in_path_or_header_never_reaches_the_server() {
    let (port, seen) = server(routes, None).await;
    let err = get(action(port, "/ok HTTP/1.1\r\nX-Injected: 1\r\n", &[]))
        .await
        .unwrap_err();
    assert!(err.contains("invalid probe path"), "{err}");
    let err = get(action(port, "/ok", &[("X-Test", "a\r\nX-Injected: 1")]))
        .await
        .unwrap_err();
    assert!(err.contains("invalid value for probe header"), "{err}");
    let err = get(action(port, "/ok", &[("X-Bad\r\nX-Injected", "1")]))
        .await
        .unwrap_err();
    assert!(err.contains("invalid probe header name"), "{err}");
    let mut bad_host = action(port, "/ok", &[]);
    bad_host.host = Some("127.0.0.1\r\nX-Injected: 1".into());
    assert!(get(bad_host).await.is_err());
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
}

#[tokio::test]
async fn upstream_headers_and_a_custom_host() {
    let (port, seen) = server(routes, None).await;
    get(action(port, "/ok", &[])).await.unwrap();
    get(action(
        port,
        "/ok",
        &[("Host", "probe.example"), ("X-Test", "yes")],
    ))
    .await
    .unwrap();
    let seen = seen.lock().unwrap().clone();
    let lower: Vec<String> = seen.iter().map(|h| h.to_ascii_lowercase()).collect();
    assert!(
        lower[0].contains(&format!("host: 127.0.0.1:{port}\r\n")),
        "{}",
        seen[0]
    );
    assert!(
        lower[0].contains("user-agent: kube-probe/1.37\r\n"),
        "{}",
        seen[0]
    );
    assert!(lower[0].contains("accept: */*\r\n"), "{}", seen[0]);
    assert!(lower[1].contains("host: probe.example\r\n"), "{}", seen[1]);
    assert!(!lower[1].contains("host: 127.0.0.1"), "{}", seen[1]);
    assert!(lower[1].contains("x-test: yes\r\n"), "{}", seen[1]);
}

#[tokio::test]
async fn redirects_as_upstream() {
    let (port, seen) = server(routes, None).await;
    // Same host: followed.
    get(action(port, "/r1", &[])).await.unwrap();
    assert!(seen.lock().unwrap()[1].starts_with("GET /ok "));
    // Another host: not followed, a success with a warning.
    seen.lock().unwrap().clear();
    let probed = http_probe(
        &action(port, "/away", &[]),
        "127.0.0.1",
        port,
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    assert!(
        matches!(&probed, Probed::Warning(w) if w.starts_with("Probe terminated redirects")),
        "{probed:?}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    // More than 10: a failure, after the first request and 10 redirects.
    seen.lock().unwrap().clear();
    let err = get(action(port, "/loop", &[])).await.unwrap_err();
    assert!(err.contains("stopped after 10 redirects"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 11);
}

#[tokio::test]
async fn status_codes_body_and_timeout() {
    let (port, _) = server(routes, None).await;
    let err = get(action(port, "/missing", &[])).await.unwrap_err();
    assert!(err.contains("statuscode: 500"), "{err}");
    // A large body is read only up to 10 KiB.
    get(action(port, "/big", &[])).await.unwrap();
    // A server that accepts and never answers: timeoutSeconds bounds the probe, and the
    // connection is closed, not left behind.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = silent.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        let _ = closed_tx.send(());
    });
    let started = std::time::Instant::now();
    let err = http_probe(
        &action(silent_port, "/", &[]),
        "127.0.0.1",
        silent_port,
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert!(err.contains("timed out after 1s"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    tokio::time::timeout(Duration::from_secs(2), closed_rx)
        .await
        .expect("the timed-out connection is closed")
        .unwrap();
}

/// A self-signed certificate from the `openssl` CLI (skipped when it is not installed).
fn self_signed() -> Option<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = (dir.path().join("key.pem"), dir.path().join("cert.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=probe.test", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .ok()?;
    if !made.status.success() {
        return None;
    }
    let certs = vec![CertificateDer::from_pem_file(&cert).unwrap()];
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[tokio::test]
async fn https_with_a_self_signed_certificate() {
    let Some(acceptor) = self_signed() else {
        eprintln!("skipped: no openssl to make a certificate");
        return;
    };
    let (port, seen) = server(routes, Some(acceptor)).await;
    let mut https = action(port, "/ok", &[]);
    https.scheme = Some("HTTPS".into());
    get(https.clone()).await.unwrap();
    https.path = Some("/missing".into());
    assert!(get(https).await.unwrap_err().contains("statuscode: 500"));
    assert_eq!(seen.lock().unwrap().len(), 2);
}
