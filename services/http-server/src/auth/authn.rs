//! Who a request is, as upstream's delegating authenticator builds it for the kubelet:
//! the union of x509 client certificates and bearer tokens (TokenReview, cached for
//! `authentication.webhook.cacheTTL`, success and failure alike), every authenticated
//! user in `system:authenticated`; then, only when no credential failed, anonymous.

use super::UserInfo;
use super::cache::{CAPACITY, ReviewCache};
use crate::listener::PeerCertificates;
use axum::http::{HeaderMap, HeaderValue};
use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use rustls::pki_types::UnixTime;
use rustls::server::danger::ClientCertVerifier;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// How bearer tokens are checked.
enum Tokens {
    /// `authentication.webhook.enabled: false`: a bearer token authenticates no one.
    Disabled,
    /// The webhook is enabled but the node runs standalone (no API server).
    Unavailable,
    Webhook {
        client: kube::Client,
        ttl: Duration,
        /// SHA-256 of the token -> the reviewed user (None: not authenticated).
        cache: ReviewCache<[u8; 32], Option<UserInfo>>,
        /// TokenReviews under way at once ([`MAX_TOKEN_REVIEWS`]).
        reviews: Arc<tokio::sync::Semaphore>,
    },
}

/// TokenReviews of tokens not in the cache sent at once: a flood of made-up tokens (each a
/// review) waits among itself, and never delays a client with a certificate or a token
/// already reviewed, which need no review.
pub const MAX_TOKEN_REVIEWS: usize = 8;
/// How long a token waits for its review to start before it is refused (not cached).
pub const TOKEN_REVIEW_WAIT: Duration = Duration::from_secs(10);

pub struct Authenticator {
    client_ca: Option<Arc<dyn ClientCertVerifier>>,
    tokens: Tokens,
    anonymous: bool,
}

impl Authenticator {
    pub fn new(
        authn: &nodeagent_config::KubeletAuthentication,
        client_ca: Option<Arc<dyn ClientCertVerifier>>,
        api: Option<kube::Client>,
    ) -> Self {
        let tokens = match (authn.webhook.enabled, api) {
            (false, _) => Tokens::Disabled,
            (true, None) => {
                tracing::warn!(
                    "authentication.webhook.enabled is set but the node has no API server \
                     (--kubeconfig): bearer tokens cannot be reviewed and get 401"
                );
                Tokens::Unavailable
            }
            (true, Some(client)) => Tokens::Webhook {
                client,
                ttl: authn.webhook.cache_ttl,
                cache: ReviewCache::new(CAPACITY),
                reviews: Arc::new(tokio::sync::Semaphore::new(MAX_TOKEN_REVIEWS)),
            },
        };
        Self {
            client_ca,
            tokens,
            anonymous: authn.anonymous.enabled,
        }
    }

    /// The user, None when the request carries no credential (and anonymous is off), or
    /// why a credential it carries was refused. Removes a bearer token it accepted from
    /// `headers`, as upstream does, so handlers never see it.
    pub async fn authenticate(
        &self,
        certs: &PeerCertificates,
        headers: &mut HeaderMap,
    ) -> Result<Option<UserInfo>, String> {
        let mut errors = Vec::new();
        match self.x509(certs) {
            Some(Ok(user)) => return Ok(Some(authenticated(user))),
            Some(Err(e)) => errors.push(e),
            None => {}
        }
        if let Some(token) = bearer_token(headers) {
            match self.token(token).await {
                Some(Ok(user)) => {
                    headers.remove(axum::http::header::AUTHORIZATION);
                    return Ok(Some(authenticated(user)));
                }
                Some(Err(e)) => errors.push(e),
                None => {}
            }
        }
        match websocket_token(headers) {
            Ok(None) => {}
            Err(e) => errors.push(e),
            Ok(Some((token, rest))) => match self.token(&token).await {
                Some(Ok(user)) => {
                    // The token's subprotocol is not echoed or passed on.
                    if let Ok(v) = HeaderValue::from_str(&rest) {
                        headers.insert(axum::http::header::SEC_WEBSOCKET_PROTOCOL, v);
                    }
                    return Ok(Some(authenticated(user)));
                }
                Some(Err(e)) => errors.push(e),
                None => {}
            },
        }
        if !errors.is_empty() {
            // Upstream's anonymous authenticator runs only when no credential failed: a
            // bad certificate or token is not taken for anonymous.
            return Err(errors.join("; "));
        }
        Ok(self.anonymous.then(|| UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..UserInfo::default()
        }))
    }

    /// The user a client certificate names (CN, O as groups), if one was presented and
    /// a client CA is configured (without one, upstream installs no x509 authenticator).
    fn x509(&self, certs: &PeerCertificates) -> Option<Result<UserInfo, String>> {
        let (end_entity, intermediates) = certs.0.split_first()?;
        let verifier = self.client_ca.as_ref()?;
        if let Err(e) = verifier.verify_client_cert(end_entity, intermediates, UnixTime::now()) {
            return Some(Err(format!("verifying the client certificate: {e}")));
        }
        // A certificate without a CN names nobody: upstream's CommonNameUserConversion
        // answers "not authenticated" and the next authenticator (a token) may still run.
        subject(end_entity).transpose()
    }

    async fn token(&self, token: &str) -> Option<Result<UserInfo, String>> {
        let (client, ttl, cache, reviews) = match &self.tokens {
            Tokens::Disabled => return None,
            Tokens::Unavailable => {
                return Some(Err(
                    "bearer token: no API server to review it (standalone mode)".into(),
                ));
            }
            Tokens::Webhook {
                client,
                ttl,
                cache,
                reviews,
            } => (client, *ttl, cache, reviews),
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let (client, token, reviews) = (client.clone(), token.to_string(), reviews.clone());
        let review = async move {
            let _slot = tokio::time::timeout(TOKEN_REVIEW_WAIT, reviews.acquire_owned())
                .await
                .map_err(|_| {
                    format!("too many bearer tokens under review ({MAX_TOKEN_REVIEWS} at once)")
                })?
                .map_err(|e| e.to_string())?;
            review_token(client, token).await
        };
        match cache.get_or_review(key, review, |_| ttl).await {
            Ok(Some(user)) => Some(Ok(user)),
            Ok(None) => Some(Err("invalid bearer token".into())),
            Err(e) => {
                tracing::warn!(error = %e, "cannot review a bearer token");
                Some(Err(e))
            }
        }
    }
}

/// Upstream's `bearertoken` authenticator: `Authorization: Bearer <token>`, scheme case
/// insensitive; an empty token is no token.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The subprotocol prefix that carries a bearer token in a WebSocket handshake, for
/// clients (browsers) that cannot set `Authorization`.
const BEARER_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// Upstream's WebSocket protocol authenticator: on a WebSocket upgrade, a subprotocol
/// `base64url.bearer.authorization.k8s.io.<base64url token>`. Returns the token and the
/// other subprotocols (at least one must remain to be chosen); an error for a second
/// token, a token that does not decode to UTF-8, or no other subprotocol.
fn websocket_token(headers: &HeaderMap) -> Result<Option<(String, String)>, String> {
    let websocket = headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    if !websocket {
        return Ok(None);
    }
    let mut token = None;
    let mut others = Vec::new();
    for value in headers.get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL) {
        let Ok(value) = value.to_str() else { continue };
        for protocol in value.split(',').map(str::trim) {
            let Some(encoded) = protocol.strip_prefix(BEARER_PROTOCOL_PREFIX) else {
                if !protocol.is_empty() {
                    others.push(protocol);
                }
                continue;
            };
            if token.is_some() {
                return Err("multiple base64.bearer.authorization tokens specified".into());
            }
            let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(encoded)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or("invalid bearer token")?;
            token = Some(decoded);
        }
    }
    match token {
        None => Ok(None),
        Some(t) if t.is_empty() => Ok(None),
        Some(_) if others.is_empty() => Err("missing additional subprotocol".into()),
        Some(t) => Ok(Some((t, others.join(",")))),
    }
}

/// Asks the API server who `token` is; Ok(None) when it says not authenticated (with
/// no error of its own), which is cached like a success.
async fn review_token(client: kube::Client, token: String) -> Result<Option<UserInfo>, String> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token,
            audiences: None,
        },
        ..TokenReview::default()
    };
    let answer = super::webhook::create(&client, &review).await?;
    let status = answer.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return match status.error.filter(|e| !e.is_empty()) {
            Some(e) => Err(format!("TokenReview: {e}")),
            None => Ok(None),
        };
    }
    let user = status.user.unwrap_or_default();
    Ok(Some(UserInfo {
        name: user.username.unwrap_or_default(),
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    }))
}

/// Upstream's `AuthenticatedGroupAdder`.
fn authenticated(mut user: UserInfo) -> UserInfo {
    let special = ["system:authenticated", "system:unauthenticated"];
    if user.name != "system:anonymous" && !user.groups.iter().any(|g| special.contains(&g.as_str()))
    {
        user.groups.push("system:authenticated".into());
    }
    user
}

/// The user a certificate names, None when its CN is empty.
fn subject(cert: &[u8]) -> Result<Option<UserInfo>, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| format!("parsing the client certificate: {e}"))?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        return Ok(None);
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(Some(UserInfo {
        name,
        groups,
        ..UserInfo::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_authorization(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    /// A client certificate with `cn` and organizations `o`, DER.
    fn cert(cn: Option<&str>, o: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        for o in o {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    /// upstream: staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509_test.go
    /// TestX509, cases "common name" and "empty dn" (CommonNameUserConversion): no CN
    /// names no user, whatever the organizations say.
    #[test]
    fn a_certificate_without_a_common_name_names_nobody() {
        let user = subject(&cert(Some("bob"), &["system:masters"]))
            .unwrap()
            .unwrap();
        assert_eq!(user.name, "bob");
        assert_eq!(user.groups, vec!["system:masters".to_string()]);
        assert_eq!(subject(&cert(None, &["system:masters"])).unwrap(), None);
        assert_eq!(subject(&cert(Some(""), &["system:masters"])).unwrap(), None);
    }

    #[test]
    fn websocket_bearer_protocol_as_upstream() {
        let ws = |protocols: &[&str]| {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::header::UPGRADE,
                HeaderValue::from_static("websocket"),
            );
            for p in protocols {
                h.append(
                    axum::http::header::SEC_WEBSOCKET_PROTOCOL,
                    HeaderValue::from_str(p).unwrap(),
                );
            }
            h
        };
        // "token-1" in base64url without padding.
        let token = "base64url.bearer.authorization.k8s.io.dG9rZW4tMQ";
        assert_eq!(
            websocket_token(&ws(&[
                &format!("v5.channel.k8s.io, {token}"),
                "v4.channel.k8s.io"
            ])),
            Ok(Some((
                "token-1".to_string(),
                "v5.channel.k8s.io,v4.channel.k8s.io".to_string()
            )))
        );
        assert_eq!(websocket_token(&ws(&["v4.channel.k8s.io"])), Ok(None));
        assert_eq!(
            websocket_token(&ws(&[token])),
            Err("missing additional subprotocol".to_string())
        );
        assert!(
            websocket_token(&ws(&[&format!("{token}, {token}, v4.channel.k8s.io")]))
                .unwrap_err()
                .contains("multiple")
        );
        assert_eq!(
            websocket_token(&ws(&[
                "base64url.bearer.authorization.k8s.io.//8, v4.channel.k8s.io"
            ])),
            Err("invalid bearer token".to_string())
        );
        // Not a WebSocket upgrade: not looked at.
        let mut spdy = ws(&[&format!("{token}, v4.channel.k8s.io")]);
        spdy.insert(
            axum::http::header::UPGRADE,
            HeaderValue::from_static("SPDY/3.1"),
        );
        assert_eq!(websocket_token(&spdy), Ok(None));
    }

    #[test]
    fn bearer_tokens_are_read_as_upstream() {
        assert_eq!(bearer_token(&with_authorization("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&with_authorization("bearer abc")), Some("abc"));
        assert_eq!(
            bearer_token(&with_authorization("  Bearer abc  ")),
            Some("abc")
        );
        assert_eq!(
            bearer_token(&with_authorization("Bearer abc def")),
            Some("abc")
        );
        assert_eq!(bearer_token(&with_authorization("Bearer ")), None);
        assert_eq!(bearer_token(&with_authorization("Bearer  abc")), None);
        assert_eq!(bearer_token(&with_authorization("Basic abc")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn authenticated_users_join_system_authenticated_once() {
        let u = authenticated(UserInfo {
            name: "alice".into(),
            groups: vec!["dev".into()],
            ..UserInfo::default()
        });
        assert_eq!(u.groups, ["dev", "system:authenticated"]);
        assert_eq!(authenticated(u.clone()).groups, u.groups);
    }

    #[tokio::test]
    async fn no_credentials_are_anonymous_only_when_enabled() {
        let mut authn = nodeagent_config::KubeletAuthentication::default();
        authn.webhook.enabled = false;
        let off = Authenticator::new(&authn, None, None);
        let none = PeerCertificates::default();
        assert_eq!(
            off.authenticate(&none, &mut HeaderMap::new()).await,
            Ok(None)
        );
        authn.anonymous.enabled = true;
        let on = Authenticator::new(&authn, None, None);
        let user = on
            .authenticate(&none, &mut HeaderMap::new())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(user.name, "system:anonymous");
        assert_eq!(user.groups, ["system:unauthenticated"]);
        // Webhook disabled: a token is no credential at all, so anonymous applies.
        let mut h = with_authorization("Bearer t");
        assert!(on.authenticate(&none, &mut h).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_token_without_an_api_server_is_refused_even_with_anonymous() {
        let mut authn = nodeagent_config::KubeletAuthentication::default();
        authn.anonymous.enabled = true;
        let standalone = Authenticator::new(&authn, None, None);
        let mut h = with_authorization("Bearer t");
        let r = standalone
            .authenticate(&PeerCertificates::default(), &mut h)
            .await;
        assert!(r.unwrap_err().contains("standalone"));
    }
}
