//! Serving a service's gRPC API on its address, with the health service (which follows
//! the service's main loops), systemd notification, peer checks (credentials on unix,
//! CID and secret on vsock) and a bounded graceful drain.

use crate::bind::{BIND_WINDOW, BindError, bind_unix};
use crate::loop_health::{LivenessCheck, LoopHealth};
use crate::vsock_auth::{VsockScopeLayer, peer_cid_allowed, server_handshake};
use crate::{ServerTraceLayer, Shutdown, WithLimits};
use nodeagent_config::{Address, VsockAuth};
use std::path::PathBuf;
use std::time::Duration;
use tokio_stream::StreamExt;
use tonic::service::Routes;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// How long in-flight calls get to finish after shutdown before the server stops anyway.
const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// How often the main loops' health is sampled.
const HEALTH_PERIOD: Duration = Duration::from_secs(1);

/// Why a server could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another live process still serves on this unix socket after the bind window.
    #[error(
        "another process is still serving on {} after waiting {BIND_WINDOW:?} (lock {}); stop it first",
        .0.display(),
        crate::bind::lock_path(.0).display()
    )]
    AddressInUse(PathBuf),
    /// Binding or preparing the socket failed.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    /// A vsock address without authentication settings.
    #[error(
        "refusing to serve on {0} without vsock authentication (--vsock-secret-file, --vsock-allowed-cids)"
    )]
    VsockUnauthenticated(String),
    /// The gRPC server failed while running.
    #[error("gRPC server on {address} failed: {source}")]
    Serve {
        address: String,
        source: tonic::transport::Error,
    },
}

type ServeFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// One service's gRPC server.
pub struct Server {
    address: Address,
    routes: Routes,
    service_names: Vec<&'static str>,
    loops: LoopHealth,
    vsock_auth: Option<VsockAuth>,
    bind_window: Duration,
}

impl Server {
    /// `service_names` are the fully qualified gRPC service names in `routes`, reported
    /// as SERVING by the health service while the main loops are alive.
    pub fn new(address: Address, routes: Routes, service_names: &[&'static str]) -> Self {
        Self {
            address,
            routes,
            service_names: service_names.to_vec(),
            loops: LoopHealth::default(),
            vsock_auth: crate::vsock_auth::installed().cloned(),
            bind_window: BIND_WINDOW,
        }
    }

    /// Ties health to the service's main loop (see [`LoopHealth::add_check`]): while
    /// `check` keeps failing the health service says NOT_SERVING and the systemd watchdog
    /// pings stop, so systemd restarts a service whose loop has stalled.
    pub fn with_liveness(self, check: LivenessCheck) -> Self {
        self.loops.add_check("main loop", check);
        self
    }

    /// Ties health to every loop registered in `loops` (replacing the server's own
    /// registry: call it before [`Server::with_liveness`]).
    pub fn with_loop_health(mut self, loops: LoopHealth) -> Self {
        self.loops = loops;
        self
    }

    /// vsock authentication for this server (by default the process's, see
    /// [`crate::install_vsock_auth`]).
    pub fn with_vsock_auth(mut self, auth: VsockAuth) -> Self {
        self.vsock_auth = Some(auth);
        self
    }

    /// Binds (waiting up to [`BIND_WINDOW`] for a predecessor), reports ready to systemd,
    /// serves until `shutdown`, then drains for at most a few seconds. A failure is also
    /// reported through `shutdown` ([`Shutdown::fail`]), which ends the process.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), ServeError> {
        let result = self.serve_inner(shutdown.clone()).await;
        if let Err(e) = &result {
            shutdown.fail(e.to_string());
        }
        result
    }

    async fn serve_inner(self, shutdown: Shutdown) -> Result<(), ServeError> {
        let (reporter, health) = tonic_health::server::health_reporter();
        set_health(&reporter, &self.service_names, ServingStatus::Serving).await;
        let vsock = match &self.address {
            Address::Vsock { .. } => Some(self.vsock_auth()?.clone()),
            Address::Unix(_) => None,
        };
        // Every service serves its metrics (process metrics at least) for http-server.
        let metrics =
            nodeagent_proto::api::metrics_server::MetricsServer::new(crate::MetricsService)
                .with_limits();
        let routes = self.routes.clone().add_service(health).add_service(metrics);
        let router = tonic::transport::Server::builder()
            .layer(ServerTraceLayer)
            .layer(VsockScopeLayer::new(vsock.clone()))
            .add_routes(routes);
        let address = self.address.to_string();
        let signal = {
            let shutdown = shutdown.clone();
            async move { shutdown.wait().await }
        };
        let (serving, binding): (ServeFuture, _) = match &self.address {
            Address::Unix(path) => {
                let binding = bind_unix(path, self.bind_window)
                    .await
                    .map_err(|e| match e {
                        BindError::InUse => ServeError::AddressInUse(path.clone()),
                        BindError::Io(source) => ServeError::Listen {
                            address: address.clone(),
                            source,
                        },
                    })?;
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(binding.listener)
                    .filter(|conn| match conn {
                        Ok(stream) => peer_allowed(stream),
                        Err(_) => true,
                    });
                let fut = router.serve_with_incoming_shutdown(incoming, signal);
                (Box::pin(fut), Some(binding.lock))
            }
            Address::Vsock { cid, port } => {
                let auth = vsock
                    .clone()
                    .ok_or_else(|| ServeError::VsockUnauthenticated(address.clone()))?;
                let listener =
                    tokio_vsock::VsockListener::bind(tokio_vsock::VsockAddr::new(*cid, *port))
                        .map_err(|source| ServeError::Listen {
                            address: address.clone(),
                            source,
                        })?;
                let incoming = authenticated_vsock(listener, auth);
                let fut = router.serve_with_incoming_shutdown(incoming, signal);
                (Box::pin(fut), None)
            }
        };
        notify_ready();
        let monitor = tokio::spawn(follow_loops(
            address.clone(),
            self.loops.clone(),
            reporter,
            self.service_names.clone(),
        ));
        tracing::info!(%address, "serving gRPC");
        let result = tokio::select! {
            r = serving => r,
            _ = async { shutdown.wait().await; tokio::time::sleep(DRAIN_GRACE).await } => {
                tracing::warn!(%address, "calls still open after the drain grace period; closing them");
                Ok(())
            }
        };
        monitor.abort();
        if let Address::Unix(path) = &self.address {
            // Only we (the lock holder) may remove it; the lock goes after it.
            let _ = std::fs::remove_file(path);
        }
        drop(binding);
        result.map_err(|source| ServeError::Serve { address, source })
    }

    fn vsock_auth(&self) -> Result<&VsockAuth, ServeError> {
        self.vsock_auth
            .as_ref()
            .ok_or_else(|| ServeError::VsockUnauthenticated(self.address.to_string()))
    }
}

/// The connections of an allowed CID that completed the handshake (each on a task of its
/// own, so a slow or silent peer holds back no other).
fn authenticated_vsock(
    listener: tokio_vsock::VsockListener,
    auth: VsockAuth,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<tokio_vsock::VsockStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "vsock accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            if !peer_cid_allowed(&stream, &auth.allowed_cids) {
                continue;
            }
            let (authenticated, secret) = (tx.clone(), auth.secret.clone());
            tokio::spawn(async move {
                match server_handshake(&mut stream, &secret).await {
                    Ok(()) => {
                        let _ = authenticated.send(Ok(stream)).await;
                    }
                    Err(e) => {
                        let peer = stream.peer_addr().ok();
                        tracing::warn!(error = %e, ?peer, "refused a vsock connection: its handshake failed");
                    }
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn set_health(reporter: &HealthReporter, names: &[&'static str], status: ServingStatus) {
    reporter.set_service_status("", status).await;
    for name in names {
        reporter.set_service_status(*name, status).await;
    }
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

/// Tells systemd we are ready.
fn notify_ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "sd_notify READY failed");
    }
}

/// Samples the main loops every [`HEALTH_PERIOD`]: the health service says NOT_SERVING
/// (for "" and every service name) while any loop is stale, and the systemd watchdog, if
/// systemd asked for it, is pinged only while all are alive.
async fn follow_loops(
    address: String,
    loops: LoopHealth,
    reporter: HealthReporter,
    names: Vec<&'static str>,
) {
    let watchdog = sd_notify::watchdog_enabled();
    let period = watchdog.map_or(HEALTH_PERIOD, |w| (w / 2).min(HEALTH_PERIOD));
    let mut tick = tokio::time::interval(period);
    let mut stalled = false;
    // sd_notify blocks while the notify socket's queue is full (a reader that does not read):
    // it runs on the blocking pool, one ping at a time.
    let mut pending_ping: Option<tokio::task::JoinHandle<std::io::Result<()>>> = None;
    loop {
        tick.tick().await;
        match loops.check() {
            Err(why) => {
                if !stalled {
                    tracing::error!(%address, reason = %why, "main loop stalled; reporting NOT_SERVING and no longer pinging the systemd watchdog");
                    set_health(&reporter, &names, ServingStatus::NotServing).await;
                }
                stalled = true;
            }
            Ok(()) => {
                if stalled {
                    tracing::info!(%address, "main loops running again; reporting SERVING");
                    set_health(&reporter, &names, ServingStatus::Serving).await;
                }
                stalled = false;
                if watchdog.is_some() && pending_ping.as_ref().is_none_or(|p| p.is_finished()) {
                    if let Some(done) = pending_ping.take()
                        && let Ok(Err(e)) = done.await
                    {
                        tracing::warn!(%address, error = %e, "sd_notify WATCHDOG failed");
                    }
                    pending_ping = Some(tokio::task::spawn_blocking(|| {
                        sd_notify::notify(&[sd_notify::NotifyState::Watchdog])
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_health, connect, shutdown_channel};

    async fn health(address: &Address, service: &str) -> Result<(), String> {
        check_health(connect(address), service, Duration::from_secs(2)).await
    }

    /// Through the real server and health client: a loop that stops beating flips "" and
    /// every service name to NOT_SERVING, and its next beat flips them back.
    #[tokio::test]
    async fn a_loop_that_stops_beating_makes_the_server_not_serving() {
        let dir = tempfile::tempdir().unwrap();
        let address = Address::Unix(dir.path().join("svc.sock"));
        let loops = LoopHealth::default();
        let beat = loops.register("source", Duration::from_millis(1500));
        let (trigger, shutdown) = shutdown_channel();
        let server = Server::new(address.clone(), Routes::default(), &["test.v1.Svc"])
            .with_loop_health(loops);
        let serving = tokio::spawn(server.serve(shutdown));
        let wait_for = |want_ok: bool| {
            let address = address.clone();
            let beat = beat.clone();
            async move {
                let until = tokio::time::Instant::now() + Duration::from_secs(10);
                loop {
                    if want_ok {
                        beat.beat();
                    }
                    let both = (
                        health(&address, "").await,
                        health(&address, "test.v1.Svc").await,
                    );
                    if want_ok == both.0.is_ok() && want_ok == both.1.is_ok() {
                        return both;
                    }
                    assert!(
                        tokio::time::Instant::now() < until,
                        "health stayed {both:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let _ = wait_for(true).await;
        // Stop beating: within the silence limit plus a sample period it is reported.
        let (whole, named) = wait_for(false).await;
        assert_eq!(whole, Err("status NotServing".into()));
        assert_eq!(named, Err("status NotServing".into()));
        let _ = wait_for(true).await;
        trigger.trigger();
        serving.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_serve_failure_is_reported_through_the_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.sock");
        let address = Address::Unix(path.clone());
        let (_trigger, shutdown) = shutdown_channel();
        let _holder = bind_unix(&path, Duration::ZERO).await.ok().unwrap();
        let mut server = Server::new(address, Routes::default(), &[]);
        server.bind_window = Duration::from_millis(300); // the real window is 10 s
        let r = server.serve(shutdown.clone()).await;
        let err = r.unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(shutdown.is_triggered());
        assert_eq!(shutdown.failed().await, err);
    }
}
