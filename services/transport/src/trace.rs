//! Tower layers that give every gRPC call a span named and attributed after the OTel RPC
//! semantic conventions, and carry W3C trace context in the call's metadata.

use crate::limit::CallLimit;
use std::task::{Context, Poll};
use tower::{Layer, Service};
use tracing::Instrument;
use tracing::instrument::Instrumented;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Splits "/kubelet.v1.Volume/EnsurePodVolumes" into ("kubelet.v1.Volume", "EnsurePodVolumes").
fn rpc_parts(path: &str) -> (&str, &str) {
    let path = path.trim_start_matches('/');
    path.split_once('/').unwrap_or((path, ""))
}

fn rpc_span(kind: &'static str, path: &str) -> tracing::Span {
    let (service, method) = rpc_parts(path);
    tracing::info_span!(
        "grpc",
        otel.name = %format_args!("{service}/{method}"),
        otel.kind = kind,
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
    )
}

/// Server side: extracts the caller's context and runs the handler in a child span.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerTraceLayer;

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace { inner }
    }
}

#[derive(Clone, Debug)]
pub struct ServerTrace<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for ServerTrace<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let span = rpc_span("server", req.uri().path());
        let parent = nodeagent_telemetry::context_from_headers(req.headers());
        let _ = span.set_parent(parent);
        let _enter = span.enter();
        let fut = self.inner.call(req);
        drop(_enter);
        fut.instrument(span)
    }
}

/// Client side: a span per call, whose context rides in the request's metadata.
#[derive(Clone, Debug)]
pub struct ClientTrace<S> {
    inner: S,
    limit: Option<CallLimit>,
}

impl<S> ClientTrace<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, limit: None }
    }

    /// Bounds the calls `limit` covers (see [`CallLimit`]).
    pub fn with_call_limit(mut self, limit: CallLimit) -> Self {
        self.limit = Some(limit);
        self
    }
}

impl<S, B, RB> Service<http::Request<B>> for ClientTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        Instrumented<std::pin::Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let span = rpc_span("client", req.uri().path());
        span.in_scope(|| nodeagent_telemetry::inject_headers(req.headers_mut()));
        let operation = nodeagent_telemetry::metrics::kubelet::runtime_operation(req.uri().path());
        let timed = move |inner| RuntimeOperation {
            inner,
            operation: operation.map(|op| (op, std::time::Instant::now())),
        };
        let limit = self
            .limit
            .as_ref()
            .filter(|l| (l.covers)(req.uri().path()))
            .map(|l| (l.clone(), req.uri().path().to_string()));
        let future: std::pin::Pin<Box<dyn Future<Output = _> + Send>> = match limit {
            None => Box::pin(timed(span.in_scope(|| self.inner.call(req)))),
            Some((limit, path)) => {
                // The service that was made ready goes with the call (tower's rule: call
                // what poll_ready readied); this handle keeps a fresh clone.
                let fresh = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, fresh);
                let call_span = span.clone();
                Box::pin(async move {
                    let mut permit = limit.acquire(&path).await;
                    let answer = timed(call_span.in_scope(|| ready.call(req))).await;
                    permit.done();
                    answer
                })
            }
        };
        future.instrument(span)
    }
}

pin_project_lite::pin_project! {
    /// A call's future that, for a CRI call, records upstream's
    /// `kubelet_runtime_operations_*` metrics when the response (or failure) arrives. An
    /// error is a transport failure or a non-OK `grpc-status` in the response headers
    /// (where gRPC puts it for a call that fails without a body: CRI errors).
    pub struct RuntimeOperation<F> {
        #[pin]
        inner: F,
        operation: Option<(&'static str, std::time::Instant)>,
    }
}

impl<F, RB, E> Future for RuntimeOperation<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        if let Some((operation, start)) = this.operation.take() {
            let failed = match &out {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .is_some_and(|code| code.as_bytes() != b"0"),
                Err(_) => true,
            };
            nodeagent_telemetry::metrics::kubelet::record_runtime_operation(
                operation,
                start.elapsed().as_secs_f64(),
                failed,
            );
        }
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tower::ServiceExt;

    /// 12 calls of a limited method and 12 of another at once, over clones of one
    /// channel whose calls each take 50 ms: at most 3 limited calls run together, while
    /// the others all run together.
    #[tokio::test]
    async fn a_call_limit_bounds_only_the_methods_it_covers() {
        #[derive(Default)]
        struct Seen {
            now: [AtomicUsize; 2],
            most: [AtomicUsize; 2],
        }
        let seen = Arc::new(Seen::default());
        let inner = {
            let seen = seen.clone();
            tower::service_fn(move |req: http::Request<()>| {
                let seen = seen.clone();
                async move {
                    let i = usize::from(req.uri().path().ends_with("/Heavy"));
                    let now = seen.now[i].fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most[i].fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    seen.now[i].fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(http::Response::new(()))
                }
            })
        };
        let channel = ClientTrace::new(inner)
            .with_call_limit(CallLimit::new(3, |path| path.ends_with("/Heavy")));
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..24 {
            let channel = channel.clone();
            let path = if n % 2 == 0 {
                "/s.S/Heavy"
            } else {
                "/s.S/Light"
            };
            calls.spawn(async move {
                let req = http::Request::builder().uri(path).body(()).unwrap();
                channel.oneshot(req).await.unwrap();
            });
        }
        while calls.join_next().await.is_some() {}
        assert_eq!(seen.most[1].load(Ordering::SeqCst), 3, "limited calls");
        assert_eq!(seen.most[0].load(Ordering::SeqCst), 12, "other calls");
    }

    #[test]
    fn splits_grpc_paths() {
        assert_eq!(
            rpc_parts("/kubelet.v1.Volume/EnsurePodVolumes"),
            ("kubelet.v1.Volume", "EnsurePodVolumes")
        );
        assert_eq!(rpc_parts("/odd"), ("odd", ""));
    }
}
