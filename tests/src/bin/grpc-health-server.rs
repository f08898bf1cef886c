//! A gRPC health server for the gRPC probe tests, run inside a test container:
//! `grpc.health.v1` on 0.0.0.0:<port> (default 9090). The server as a whole ("") is always
//! SERVING; the service `app` is SERVING unless the file `/tmp/app-unhealthy` exists when
//! the check arrives, so a test flips it with an exec. Any other service is NOT_FOUND, as
//! the standard health server answers. It exits 0 on SIGTERM.

use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

struct FileHealth;

#[tonic::async_trait]
impl Health for FileHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let status = match request.get_ref().service.as_str() {
            "" => ServingStatus::Serving,
            "app" if std::path::Path::new("/tmp/app-unhealthy").exists() => {
                ServingStatus::NotServing
            }
            "app" => ServingStatus::Serving,
            other => return Err(Status::not_found(format!("unknown service {other:?}"))),
        };
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }

    type WatchStream = tokio_stream::Empty<Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("the probe tests only Check"))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .map(|p| p.parse())
        .transpose()?
        .unwrap_or(9090);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("serving grpc.health.v1 on 0.0.0.0:{port}");
    tonic::transport::Server::builder()
        .add_service(HealthServer::new(FileHealth))
        .serve_with_shutdown(([0, 0, 0, 0], port).into(), async move {
            term.recv().await;
        })
        .await?;
    Ok(())
}
