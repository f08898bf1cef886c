//! TokenReview (`authentication.k8s.io/v1`) and SubjectAccessReview
//! (`authorization.k8s.io/v1`) for the test API server, create only, as a kubelet with
//! webhook authentication and authorization calls them. The answers come from a policy
//! the test sets: which token is which user, and which (user, verb, subresource) of the
//! node resource is allowed. A token the policy does not name may be a service-account
//! token the server issued (`apiserver_serviceaccount`), reviewed as upstream does. Every
//! review is counted and kept, so tests can check what was asked and how often (caching).

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// A user a token stands for.
#[derive(Clone, Debug)]
struct TokenUser {
    name: String,
    uid: String,
    groups: Vec<String>,
}

#[derive(Default)]
struct Policy {
    tokens: HashMap<String, TokenUser>,
    /// (user, verb, subresource); "*" matches anything.
    allowed: Vec<(String, String, String)>,
    token_reviews: Vec<Value>,
    access_reviews: Vec<Value>,
    /// How long each TokenReview takes to answer (a slow or loaded API server).
    token_review_delay: Option<std::time::Duration>,
}

/// The authentication and authorization policy of a test API server; clones share it.
#[derive(Clone, Default)]
pub struct AuthPolicy {
    inner: Arc<Mutex<Policy>>,
}

impl AuthPolicy {
    /// `token` authenticates as `user` (uid `<user>-uid`) in `groups`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let user = TokenUser {
            name: user.into(),
            uid: format!("{user}-uid"),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        self.lock().tokens.insert(token.into(), user);
    }

    /// Allows `user` to `verb` the node's `subresource` ("*" for any user, verb or
    /// subresource).
    pub fn allow(&self, user: &str, verb: &str, subresource: &str) {
        self.lock()
            .allowed
            .push((user.into(), verb.into(), subresource.into()));
    }

    /// Makes every TokenReview take `delay` before it is answered.
    pub fn delay_token_reviews(&self, delay: std::time::Duration) {
        self.lock().token_review_delay = Some(delay);
    }

    /// The delay a request to `path` gets before it is answered, if any.
    pub(crate) fn review_delay(&self, path: &str) -> Option<std::time::Duration> {
        (path.trim_end_matches('/') == TOKEN_REVIEWS)
            .then(|| self.lock().token_review_delay)
            .flatten()
    }

    /// The TokenReviews received so far (their specs).
    pub fn token_reviews(&self) -> Vec<Value> {
        self.lock().token_reviews.clone()
    }

    /// The SubjectAccessReviews received so far (their specs).
    pub fn access_reviews(&self) -> Vec<Value> {
        self.lock().access_reviews.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Policy> {
        self.inner.lock().unwrap()
    }

    /// The review of a token the policy names (None: the policy does not know it).
    fn review_token(&self, spec: &Value) -> Option<Value> {
        let mut p = self.lock();
        p.token_reviews.push(spec.clone());
        let token = spec["token"].as_str().unwrap_or_default();
        p.tokens.get(token).map(|u| {
            json!({
                "authenticated": true,
                "user": {"username": u.name, "uid": u.uid, "groups": u.groups},
                "audiences": spec["audiences"],
            })
        })
    }

    fn review_access(&self, spec: &Value) -> Value {
        let mut p = self.lock();
        p.access_reviews.push(spec.clone());
        let user = spec["user"].as_str().unwrap_or_default();
        let attrs = &spec["resourceAttributes"];
        let verb = attrs["verb"].as_str().unwrap_or_default();
        let subresource = attrs["subresource"].as_str().unwrap_or_default();
        let matches = |want: &str, got: &str| want == "*" || want == got;
        let allowed = attrs["resource"] == "nodes"
            && p.allowed
                .iter()
                .any(|(u, v, s)| matches(u, user) && matches(v, verb) && matches(s, subresource));
        if allowed {
            json!({"allowed": true, "reason": "allowed by the test policy"})
        } else {
            json!({"allowed": false, "reason": "no rule of the test policy allows it"})
        }
    }
}

/// Answers `path` if it is one of the two review resources; None otherwise.
pub(crate) fn handle(
    state: &crate::apiserver::ApiState,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Response> {
    let (kind, api_version) = match path.trim_end_matches('/') {
        TOKEN_REVIEWS => ("TokenReview", "authentication.k8s.io/v1"),
        ACCESS_REVIEWS => ("SubjectAccessReview", "authorization.k8s.io/v1"),
        _ => return None,
    };
    if method != Method::POST {
        return Some(crate::apiserver::status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".to_string(),
        ));
    }
    let mut review: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return Some(crate::apiserver::status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the body is not a {kind}"),
            ));
        }
    };
    let spec = review["spec"].clone();
    review["status"] = match kind {
        "TokenReview" => state.auth.review_token(&spec).unwrap_or_else(|| {
            crate::apiserver_serviceaccount::review(state, &spec)
                .unwrap_or_else(|| json!({"authenticated": false}))
        }),
        _ => state.auth.review_access(&spec),
    };
    review["kind"] = kind.into();
    review["apiVersion"] = api_version.into();
    Some(
        (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            review.to_string(),
        )
            .into_response(),
    )
}
