//! Authentication and authorization of port 10250, as upstream's `server/auth.go` and
//! the auth filter of `server/server.go`: x509 client certificates (CN is the user, O the
//! groups), then bearer tokens through TokenReview, then anonymous when enabled
//! ([`authn`]); a request no authenticator accepts gets 401 `Unauthorized`. Then the
//! request's node attributes are authorized ([`authz`]): `AlwaysAllow`, or `Webhook`
//! through SubjectAccessReview; a denied request gets 403 with upstream's wording, a
//! webhook that cannot be asked 500. The user goes into the request's extensions
//! ([`UserInfo`]) for handlers.

mod authn;
pub mod authz;
mod cache;
mod webhook;

use crate::listener::PeerCertificates;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use nodeagent_config::Config;
use rustls::server::danger::ClientCertVerifier;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use authn::Authenticator;
pub use authz::{Authorizer, Decision};

/// Who made a request (upstream's `user.Info`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The authenticator and authorizer of port 10250.
pub struct KubeletAuth {
    pub authenticator: Authenticator,
    pub authorizer: Authorizer,
}

impl KubeletAuth {
    /// From the configuration; `api` is None in standalone mode, where webhook token
    /// authentication and Webhook authorization are unavailable (said once, here).
    pub fn new(
        config: &Config,
        client_ca: Option<Arc<dyn ClientCertVerifier>>,
        api: Option<kube::Client>,
    ) -> Self {
        let k = &config.kubelet;
        Self {
            authenticator: Authenticator::new(&k.authentication, client_ca, api.clone()),
            authorizer: Authorizer::new(&k.authorization, &config.node_name, api),
        }
    }
}

/// The auth filter in front of every handler of port 10250.
pub async fn filter(
    State(auth): State<Arc<KubeletAuth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let certs = request
        .extensions()
        .get::<PeerCertificates>()
        .cloned()
        .unwrap_or_default();
    let user = match auth
        .authenticator
        .authenticate(&certs, request.headers_mut())
        .await
    {
        Ok(Some(user)) => user,
        Ok(None) => return unauthorized(),
        Err(e) => {
            tracing::debug!(error = %e, path = %request.uri().path(), "unable to authenticate the request");
            return unauthorized();
        }
    };
    for attrs in authz::checks(request.method(), request.uri().path()) {
        if let Err(refused) = authorize_any(&auth, &user, &attrs).await {
            return refused;
        }
    }
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// Passes when `user` is allowed one of `attrs` (tried in order); else upstream's 403 (or
/// 500 when the authorizer failed).
async fn authorize_any(
    auth: &KubeletAuth,
    user: &UserInfo,
    attrs: &[authz::Attributes],
) -> Result<(), Response> {
    let mut reasons = Vec::new();
    for attr in attrs {
        match auth.authorizer.authorize(user, attr).await {
            Ok(Decision::Allow) => return Ok(()),
            Ok(Decision::Deny(reason)) => reasons.push(reason),
            Err(e) => {
                tracing::error!(error = %e, user = %user.name, verb = attr.verb, subresource = attr.subresource, "authorization error");
                let msg = format!(
                    "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                    user.name, attr.verb, attr.subresource
                );
                return Err((StatusCode::INTERNAL_SERVER_ERROR, msg).into_response());
            }
        }
    }
    let verb = attrs.first().map_or("", |a| a.verb);
    let subresources: Vec<&str> = attrs.iter().map(|a| a.subresource).collect();
    tracing::info!(user = %user.name, verb, ?subresources, reasons = ?reasons, "forbidden");
    let mut msg = format!(
        "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
        user.name,
        subresources.join(" ")
    );
    if matches!(auth.authorizer, Authorizer::Unavailable) {
        // Not upstream (whose kubelet would not start like this): say why and what to do.
        msg.extend(reasons.first().map(|r| {
            format!("{r}: set authorization.mode: AlwaysAllow or give the node a --kubeconfig\n")
        }));
    }
    Err((StatusCode::FORBIDDEN, msg).into_response())
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, "Unauthorized").into_response()
}
