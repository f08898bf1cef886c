//! Serving a service's gRPC API on its address, with the health service, systemd
//! notification, peer-credential checks and a bounded graceful drain.

use crate::{ServerTraceLayer, Shutdown};
use nodeagent_config::Address;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_stream::StreamExt;
use tonic::service::Routes;
use tonic_health::ServingStatus;

/// How long in-flight calls get to finish after shutdown before the server stops anyway.
const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// Why a server could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another live process already serves on this unix socket.
    #[error("another process is already serving on {0}")]
    AddressInUse(PathBuf),
    /// Binding or preparing the socket failed.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    /// The gRPC server failed while running.
    #[error("gRPC server on {address} failed: {source}")]
    Serve {
        address: String,
        source: tonic::transport::Error,
    },
}

/// One service's gRPC server.
/// Whether the service's own main loop is alive; the systemd watchdog is pinged only
/// while it says so.
pub type LivenessCheck = std::sync::Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

pub struct Server {
    address: Address,
    routes: Routes,
    service_names: Vec<&'static str>,
    liveness: Option<LivenessCheck>,
}

impl Server {
    /// `service_names` are the fully qualified gRPC service names in `routes`, reported
    /// as SERVING by the health service.
    pub fn new(address: Address, routes: Routes, service_names: &[&'static str]) -> Self {
        Self {
            address,
            routes,
            service_names: service_names.to_vec(),
            liveness: None,
        }
    }

    /// Ties the systemd watchdog to the service's main loop: pings stop while `check`
    /// fails, so systemd restarts a service whose loop has stalled.
    pub fn with_liveness(mut self, check: LivenessCheck) -> Self {
        self.liveness = Some(check);
        self
    }

    /// Binds, reports ready to systemd, serves until `shutdown`, then drains for at most
    /// a few seconds.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), ServeError> {
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", ServingStatus::Serving)
            .await;
        for name in &self.service_names {
            reporter
                .set_service_status(*name, ServingStatus::Serving)
                .await;
        }
        let routes = self.routes.add_service(health);
        let router = tonic::transport::Server::builder()
            .layer(ServerTraceLayer)
            .add_routes(routes);
        let address = self.address.to_string();
        let signal = {
            let shutdown = shutdown.clone();
            async move { shutdown.wait().await }
        };
        let serving =
            match &self.address {
                Address::Unix(path) => {
                    let listener = bind_unix(path).map_err(|e| match e {
                        BindError::InUse => ServeError::AddressInUse(path.clone()),
                        BindError::Io(source) => ServeError::Listen {
                            address: address.clone(),
                            source,
                        },
                    })?;
                    notify_ready(&address, self.liveness.clone());
                    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener)
                        .filter(|conn| match conn {
                            Ok(stream) => peer_allowed(stream),
                            Err(_) => true,
                        });
                    let fut = router.serve_with_incoming_shutdown(incoming, signal);
                    Box::pin(fut) as std::pin::Pin<Box<dyn Future<Output = _> + Send>>
                }
                Address::Vsock { cid, port } => {
                    let listener =
                        tokio_vsock::VsockListener::bind(tokio_vsock::VsockAddr::new(*cid, *port))
                            .map_err(|source| ServeError::Listen {
                                address: address.clone(),
                                source,
                            })?;
                    notify_ready(&address, self.liveness.clone());
                    Box::pin(router.serve_with_incoming_shutdown(listener.incoming(), signal))
                }
            };
        tracing::info!(%address, "serving gRPC");
        let result = tokio::select! {
            r = serving => r,
            _ = async { shutdown.wait().await; tokio::time::sleep(DRAIN_GRACE).await } => {
                tracing::warn!(%address, "calls still open after the drain grace period; closing them");
                Ok(())
            }
        };
        if let Address::Unix(path) = &self.address {
            let _ = std::fs::remove_file(path);
        }
        result.map_err(|source| ServeError::Serve { address, source })
    }
}

enum BindError {
    InUse,
    Io(std::io::Error),
}

/// Removes a stale socket (one nobody answers on), binds, and sets mode 0660.
fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, BindError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(BindError::Io)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(BindError::InUse);
        }
        tracing::info!(path = %path.display(), "removing stale socket");
        std::fs::remove_file(path).map_err(BindError::Io)?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(BindError::Io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(BindError::Io)?;
    Ok(listener)
}

/// Only root, our own user, or members of our group may call us (the socket's mode says
/// the same; this also covers sockets whose directory is shared more widely).
fn peer_allowed(stream: &tokio::net::UnixStream) -> bool {
    match stream.peer_cred() {
        Ok(cred) => {
            let allowed = cred.uid() == 0
                || cred.uid() == nix::unistd::geteuid().as_raw()
                || cred.gid() == nix::unistd::getegid().as_raw();
            if !allowed {
                tracing::warn!(uid = cred.uid(), gid = cred.gid(), pid = ?cred.pid(), "refused a connection from an unauthorised peer");
            }
            allowed
        }
        Err(e) => {
            tracing::warn!(error = %e, "refused a connection whose peer credentials cannot be read");
            false
        }
    }
}

/// Tells systemd we are ready, and starts pinging its watchdog if it asked for that (only
/// while `liveness` passes).
fn notify_ready(address: &str, liveness: Option<LivenessCheck>) {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "sd_notify READY failed");
    }
    if let Some(period) = sd_notify::watchdog_enabled() {
        let address = address.to_string();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period / 2);
            let mut stalled = false;
            loop {
                tick.tick().await;
                if let Some(Err(why)) = liveness.as_ref().map(|check| check()) {
                    if !stalled {
                        tracing::error!(%address, reason = %why, "main loop stalled; no longer pinging the systemd watchdog");
                    }
                    stalled = true;
                    continue;
                }
                stalled = false;
                if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]) {
                    tracing::warn!(%address, error = %e, "sd_notify WATCHDOG failed");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.sock");
        {
            let _stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        } // closed: the file stays behind, nobody answers.
        let live = bind_unix(&path).ok().expect("stale socket replaced");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        assert!(matches!(bind_unix(&path), Err(BindError::InUse)));
        drop(live);
    }
}
