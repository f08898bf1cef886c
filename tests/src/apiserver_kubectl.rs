//! What a real client (kubectl) needs from the test API server beyond the storage API,
//! routed in front of it: discovery documents (`apiserver_discovery`), OpenAPI v3
//! (`apiserver_fields`), the proxy
//! subresources forwarded to kubelets (`apiserver_proxy`), and Tables for `kubectl get`
//! (`apiserver_table`), made from the storage's own JSON answers.

use crate::apiserver::ApiState;
use crate::apiserver_discovery;
use crate::apiserver_fields;
use crate::apiserver_proxy::{self, Proxied};
use crate::apiserver_table;
use axum::extract::{Query, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;

/// The largest storage answer turned into a Table.
const TABLE_SOURCE_LIMIT: usize = 64 << 20;

/// The middleware: answers discovery and proxy requests, converts GET answers to Tables
/// when asked, and passes everything else to the storage handler.
pub async fn layer(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if req.method() == Method::GET
        && let Some(doc) = apiserver_discovery::document(&path)
            .or_else(|| apiserver_fields::openapi_document(&path))
    {
        return doc;
    }
    if let Some(target) = Proxied::parse(&path) {
        return apiserver_proxy::serve(&state, target, req).await;
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let query = Query::<HashMap<String, String>>::try_from_uri(req.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    if req.method() != Method::GET || watch || !apiserver_table::wants_table(accept) {
        return next.run(req).await;
    }
    let response = next.run(req).await;
    if response.status() != StatusCode::OK {
        return response;
    }
    let body = match axum::body::to_bytes(response.into_body(), TABLE_SOURCE_LIMIT).await {
        Ok(body) => body,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let object: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(object) => object,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let table = apiserver_table::to_table(&object, query.get("includeObject").map(String::as_str));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        table.to_string(),
    )
        .into_response()
}
