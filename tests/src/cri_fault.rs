//! A fault-injecting proxy in front of the real containerd: every CRI call goes through to
//! the runtime unchanged, except the methods the test marks as failing, which get
//! UNAVAILABLE without reaching the runtime. It stands in for what cannot be had on demand
//! from containerd itself (a status read that fails while the container changes), never
//! for the runtime: every call it does not fail is containerd's own answer.

use http_body_util::{BodyExt, Empty, combinators::UnsyncBoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

#[derive(Default)]
struct Faults {
    /// gRPC paths (`/runtime.v1.RuntimeService/ContainerStatus`) that fail.
    failing: Mutex<HashSet<String>>,
    /// Calls failed so far.
    failed: AtomicUsize,
}

/// The proxy, serving on `socket` until dropped with the test.
pub struct CriFaultProxy {
    socket: PathBuf,
    faults: Arc<Faults>,
}

impl CriFaultProxy {
    /// Serves on `socket`, forwarding to the runtime at `runtime` (a socket path).
    pub async fn start(socket: &Path, runtime: &Path) -> Self {
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket).expect("bind the CRI proxy");
        let faults = Arc::new(Faults::default());
        let (shared, runtime) = (faults.clone(), runtime.to_path_buf());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (faults, runtime) = (shared.clone(), runtime.clone());
                tokio::spawn(async move {
                    // One connection to the runtime per client connection.
                    let Ok(upstream) = tokio::net::UnixStream::connect(&runtime).await else {
                        return;
                    };
                    let Ok((sender, conn)) = hyper::client::conn::http2::handshake(
                        TokioExecutor::new(),
                        TokioIo::new(upstream),
                    )
                    .await
                    else {
                        return;
                    };
                    tokio::spawn(conn);
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        forward(faults.clone(), sender.clone(), req)
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        CriFaultProxy {
            socket: socket.to_path_buf(),
            faults,
        }
    }

    /// The endpoint to give a service (`--container-runtime-endpoint`).
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// From now on, calls of `method` (`RuntimeService/ContainerStatus`) fail.
    pub fn fail(&self, method: &str) {
        self.lock().insert(format!("/runtime.v1.{method}"));
    }

    /// Every call goes through again.
    pub fn heal(&self) {
        self.lock().clear();
    }

    /// How many calls were failed so far.
    pub fn failures(&self) -> usize {
        self.faults.failed.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.faults
            .failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

async fn forward(
    faults: Arc<Faults>,
    mut sender: hyper::client::conn::http2::SendRequest<Incoming>,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, hyper::Error> {
    let failing = faults
        .failing
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(req.uri().path());
    if failing {
        faults.failed.fetch_add(1, Ordering::SeqCst);
        // A trailers-only gRPC answer: the status rides in the headers.
        let response = Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("grpc-message", "injected fault: the runtime did not answer")
            .body(Empty::new().map_err(|never| match never {}).boxed_unsync())
            .expect("a response");
        return Ok(response);
    }
    if req.uri().authority().is_none() {
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        *req.uri_mut() = format!("http://localhost{path}").parse().expect("a URI");
    }
    let response = sender.send_request(req).await?;
    Ok(response.map(|b| b.boxed_unsync()))
}
