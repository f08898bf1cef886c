//! Tower layers that give every gRPC call a span named and attributed after the OTel RPC
//! semantic conventions, and carry W3C trace context in the call's metadata.

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

/// Client side: a span per call, whose context rides in the request's metadata (with the
/// vsock secret, for vsock peers).
#[derive(Clone, Debug)]
pub struct ClientTrace<S> {
    inner: S,
    secret: Option<http::HeaderValue>,
}

impl<S> ClientTrace<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            secret: None,
        }
    }

    /// Sends `secret` in every call's metadata (see [`crate::SECRET_HEADER`]).
    pub fn with_secret(mut self, secret: http::HeaderValue) -> Self {
        let mut secret = secret;
        secret.set_sensitive(true);
        self.secret = Some(secret);
        self
    }
}

impl<S, B, RB> Service<http::Request<B>> for ClientTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<RuntimeOperation<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let span = rpc_span("client", req.uri().path());
        span.in_scope(|| nodeagent_telemetry::inject_headers(req.headers_mut()));
        if let Some(secret) = &self.secret {
            req.headers_mut()
                .insert(crate::SECRET_HEADER, secret.clone());
        }
        let operation = nodeagent_telemetry::metrics::kubelet::runtime_operation(req.uri().path());
        let inner = span.in_scope(|| self.inner.call(req));
        RuntimeOperation {
            inner,
            operation: operation.map(|op| (op, std::time::Instant::now())),
        }
        .instrument(span)
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
    use super::rpc_parts;

    #[test]
    fn splits_grpc_paths() {
        assert_eq!(
            rpc_parts("/kubelet.v1.Volume/EnsurePodVolumes"),
            ("kubelet.v1.Volume", "EnsurePodVolumes")
        );
        assert_eq!(rpc_parts("/odd"), ("odd", ""));
    }
}
