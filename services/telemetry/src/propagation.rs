//! W3C trace context in and out of gRPC metadata and our `TraceContext` message fields.

use nodeagent_proto::api::TraceContext;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The current span's context as a message field.
pub fn current_trace_context() -> Option<TraceContext> {
    let cx = tracing::Span::current().context();
    let mut map: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut map);
    let traceparent = map.remove("traceparent")?;
    Some(TraceContext {
        traceparent,
        tracestate: map.remove("tracestate").unwrap_or_default(),
    })
}

/// Makes `span` a child of the context carried by a message, if it carries one.
pub fn set_parent_from(span: &tracing::Span, trace: Option<&TraceContext>) {
    let Some(trace) = trace.filter(|t| !t.traceparent.is_empty()) else {
        return;
    };
    let mut map = HashMap::new();
    map.insert("traceparent".to_string(), trace.traceparent.clone());
    if !trace.tracestate.is_empty() {
        map.insert("tracestate".to_string(), trace.tracestate.clone());
    }
    let cx = TraceContextPropagator::new().extract(&map);
    let _ = span.set_parent(cx);
}

/// Writes the current span's context into HTTP/2 headers (gRPC metadata).
pub fn inject_headers(headers: &mut http::HeaderMap) {
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

/// Reads a W3C context from HTTP/2 headers.
pub fn context_from_headers(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

pub struct HeaderInjector<'a>(pub &'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::header::HeaderName::from_bytes(key.as_bytes()),
            http::header::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

pub struct HeaderExtractor<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn a_context_survives_a_message_hop() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("t")));
        tracing::subscriber::with_default(subscriber, || {
            let sender = tracing::info_span!("sender");
            let trace = sender.in_scope(current_trace_context).expect("a context");
            assert!(trace.traceparent.starts_with("00-"), "{trace:?}");
            let trace_id = trace.traceparent.split('-').nth(1).unwrap().to_string();

            let receiver = tracing::info_span!("receiver");
            set_parent_from(&receiver, Some(&trace));
            let back = receiver.in_scope(current_trace_context).unwrap();
            assert_eq!(back.traceparent.split('-').nth(1).unwrap(), trace_id);

            let mut headers = http::HeaderMap::new();
            receiver.in_scope(|| inject_headers(&mut headers));
            let cx = context_from_headers(&headers);
            use opentelemetry::trace::TraceContextExt;
            assert_eq!(cx.span().span_context().trace_id().to_string(), trace_id);
        });
    }
}
