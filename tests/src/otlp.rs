//! An OTLP/gRPC trace receiver: the collector's `TraceService`, keeping every span it
//! is sent, with the name of the service that sent it.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use std::sync::{Arc, Mutex};

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub attributes: Vec<(String, String)>,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Default)]
pub struct Receiver {
    pub spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

fn text(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut out = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .map(text)
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(ReceivedSpan {
                        service: service.clone(),
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        start_unix_nanos: s.start_time_unix_nano,
                        end_unix_nanos: s.end_time_unix_nano,
                        attributes: s
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(kv)))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Serves on 127.0.0.1 on a free port; returns the endpoint URL.
    pub async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        format!("http://{addr}")
    }

    pub fn snapshot(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }
}
