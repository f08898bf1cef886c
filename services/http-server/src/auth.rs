//! Authentication and authorization of port 10250, as upstream's `server/auth.go`:
//! x509 client certificates (CN is the user, O the groups), then bearer tokens through
//! TokenReview, then anonymous when enabled; a request no authenticator accepts gets 401.
//! Authorization is `AlwaysAllow` or `Webhook` (SubjectAccessReview), with the request
//! path mapped to a subresource of the node; a denied request gets 403.

use crate::AppState;
use crate::listener::PeerCertificates;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rustls::pki_types::UnixTime;
use std::sync::Arc;

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

/// The user a client certificate names, if it chains to the client CA.
pub fn x509_user(state: &AppState, certs: &PeerCertificates) -> Option<Result<UserInfo, String>> {
    let (end_entity, intermediates) = certs.0.split_first()?;
    let Some(verifier) = &state.client_ca else {
        return Some(Err("no clientCAFile is configured".into()));
    };
    if let Err(e) = verifier.verify_client_cert(end_entity, intermediates, UnixTime::now()) {
        return Some(Err(format!("verifying certificate: {e}")));
    }
    Some(subject(end_entity))
}

fn subject(cert: &[u8]) -> Result<UserInfo, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|e| e.to_string())?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(UserInfo { name, groups })
}

pub async fn authenticate_and_authorize(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let certs = request
        .extensions()
        .get::<PeerCertificates>()
        .cloned()
        .unwrap_or_default();
    let user = match x509_user(&state, &certs) {
        Some(Ok(user)) => Some(user),
        Some(Err(e)) => {
            tracing::debug!(error = %e, "client certificate rejected");
            None
        }
        None => None,
    };
    let user = match user {
        Some(u) => u,
        None if state.config.kubelet.authentication.anonymous.enabled => UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        },
        None => return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response(),
    };
    if state.config.kubelet.authorization.mode != "AlwaysAllow" {
        return (
            StatusCode::FORBIDDEN,
            format!(
                "Forbidden (user={}, webhook authorization is not available)",
                user.name
            ),
        )
            .into_response();
    }
    request.extensions_mut().insert(user);
    next.run(request).await
}
