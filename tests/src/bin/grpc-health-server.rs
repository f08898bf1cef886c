//! A gRPC health server for the gRPC probe tests, run inside a test container:
//! `grpc.health.v1` on 0.0.0.0:<port> (default 9090). The server as a whole ("") is always
//! SERVING; the service `app` is SERVING unless the file `/tmp/app-unhealthy` exists, so a
//! test flips it with an exec. It exits 0 on SIGTERM.

use std::time::Duration;
use tonic_health::ServingStatus;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .map(|p| p.parse())
        .transpose()?
        .unwrap_or(9090);
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let status = if std::path::Path::new("/tmp/app-unhealthy").exists() {
                ServingStatus::NotServing
            } else {
                ServingStatus::Serving
            };
            if last != Some(status) {
                reporter.set_service_status("app", status).await;
                println!("app is {status:?}");
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("serving grpc.health.v1 on 0.0.0.0:{port}");
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_shutdown(([0, 0, 0, 0], port).into(), async move {
            term.recv().await;
        })
        .await?;
    Ok(())
}
