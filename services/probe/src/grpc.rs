//! The gRPC probe: `grpc.health.v1.Health/Check` on the pod's IP, as upstream's
//! `pkg/probe/grpc` does it (plaintext HTTP/2, the probe's `service` name, one timeout for
//! the connection and the call, upstream's messages for every failure).

use nodeagent_cri::http_probe::USER_AGENT_VALUE;
use std::time::Duration;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Asks `host:port` for the health of `service` ("" is the server as a whole). Ok when it
/// answers SERVING; otherwise Err with upstream's message. A gRPC probe never errs in the
/// prober's sense: every problem is a failure, as upstream.
pub async fn check(host: &str, port: u16, service: &str, timeout: Duration) -> Result<(), String> {
    // Go's net.JoinHostPort: an IPv6 literal goes in brackets.
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("error: failed to connect service at {addr:?}: {e}"))?
        .connect_timeout(timeout)
        .user_agent(USER_AGENT_VALUE)
        .map_err(|e| format!("error: failed to connect service at {addr:?}: {e}"))?;
    let started = tokio::time::Instant::now();
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => {
            return Err(format!(
                "error: failed to connect service at {addr:?}: {}",
                source_chain(&e)
            ));
        }
        Err(_) => {
            return Err(format!(
                "timeout: failed to connect service {addr:?} within {}",
                go_duration(timeout)
            ));
        }
    };
    let left = timeout.saturating_sub(started.elapsed());
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    let answer = tokio::time::timeout(left, HealthClient::new(channel).check(request)).await;
    let status = match answer {
        Err(_) => {
            return Err(format!(
                "timeout: health rpc did not complete within {}",
                go_duration(timeout)
            ));
        }
        Ok(Err(s)) => return Err(rpc_failure(&s, timeout)),
        Ok(Ok(response)) => response.into_inner().status(),
    };
    if status == ServingStatus::Serving {
        Ok(())
    } else {
        Err(format!(
            "service unhealthy (responded with {:?})",
            status.as_str_name()
        ))
    }
}

/// Upstream's wording for a Check call that ended with a gRPC status.
fn rpc_failure(s: &tonic::Status, timeout: Duration) -> String {
    match s.code() {
        tonic::Code::Unimplemented => format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            s.message()
        ),
        tonic::Code::DeadlineExceeded => format!(
            "timeout: health rpc did not complete within {}",
            go_duration(timeout)
        ),
        code => format!(
            "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
            s.message()
        ),
    }
}

/// An error and its sources, as Go's `%+v` of a wrapped error reads.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// A duration as Go prints one (`1s`, `1.5s`, `500ms`), for upstream's messages.
fn go_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::ServingStatus as Status;

    /// A health server on a free port of 127.0.0.1: "" serving, "app" as told.
    async fn server(app: Status) -> (u16, tonic_health::server::HealthReporter) {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("", Status::Serving).await;
        reporter.set_service_status("app", app).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (port, reporter)
    }

    const T: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn serving_and_not_serving_as_upstream_words_them() {
        let (port, reporter) = server(Status::NotServing).await;
        assert_eq!(check("127.0.0.1", port, "", T).await, Ok(()));
        assert_eq!(
            check("127.0.0.1", port, "app", T).await,
            Err("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        reporter.set_service_status("app", Status::Serving).await;
        assert_eq!(check("127.0.0.1", port, "app", T).await, Ok(()));
        // An unknown service is NOT_FOUND, a failure.
        let err = check("127.0.0.1", port, "nope", T).await.unwrap_err();
        assert!(
            err.starts_with("error: health rpc probe failed: rpc error: code = NotFound"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_server_without_the_health_service_is_unimplemented() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // A gRPC server with no service at all answers every call UNIMPLEMENTED.
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let err = check("127.0.0.1", port, "", T).await.unwrap_err();
        assert!(
            err.starts_with(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn nothing_listening_or_a_silent_peer_fail() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let err = check("127.0.0.1", port, "", T).await.unwrap_err();
        assert!(
            err.starts_with(&format!(
                "error: failed to connect service at \"127.0.0.1:{port}\""
            )),
            "{err}"
        );
        // A peer that accepts and never speaks HTTP/2: the call times out.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let t = Duration::from_millis(300);
        let err = check("127.0.0.1", port, "", t).await.unwrap_err();
        assert!(err.starts_with("timeout: "), "{err}");
        assert!(err.ends_with("within 300ms"), "{err}");
        held.abort();
    }

    #[test]
    fn durations_read_as_go_prints_them() {
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_millis(300)), "300ms");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
    }
}
