//! Service-account tokens as kube-apiserver issues and checks them.
//!
//! - The TokenRequest subresource, `POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token`
//!   (upstream pkg/registry/core/serviceaccount/storage/token.go): the service account
//!   must exist (404), `spec.audiences` defaults to the API server's, `expirationSeconds`
//!   to 3600 and must lie in [600, 2^32] (422 Invalid), a bound Pod, Secret or Node must
//!   exist (404), a bound Pod must run as that service account (400) and a given uid must
//!   match (409 Conflict). A pod-bound token of the kubelet's default 3607 s for the API
//!   server's audiences gets upstream's extended expiry (one year, `warnafter` at 3607 s,
//!   as `--service-account-extend-token-expiration` does by default); the answer's
//!   `status.expirationTimestamp` is the requested one.
//! - A maximum lifetime a test may set ([`ServiceAccountTokens::set_max_expiration_seconds`]),
//!   as `--service-account-max-token-expiration`: a longer request is shortened to it
//!   after validation (with upstream's `Warning` header), before the extension above.
//! - The review of such a token (pkg/serviceaccount/claims.go and the JWT authenticator):
//!   signature, expiry with upstream's 60 s leeway, audiences (the intersection with the
//!   review's, or with the API server's when it names none), the service account and the
//!   bound object still existing with their uids.
//!
//! The tokens are ES256 JWTs (`apiserver_jwt`) with upstream's claims. Not served: the
//! OIDC discovery document and JWKS, and legacy Secret-based tokens.

use crate::apiserver::{ApiState, status, status_with_details};
use crate::apiserver_jwt::Signer;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

/// The issuer (`iss`) of the tokens, and the API server's own audience.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The audiences a token gets when its request names none (`--api-audiences`).
pub const API_AUDIENCES: [&str; 1] = [ISSUER];

const MIN_EXPIRATION_SECONDS: i64 = 10 * 60;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
const DEFAULT_EXPIRATION_SECONDS: i64 = 60 * 60;
/// What the kubelet asks for by default, which upstream extends (`token.WarnOnly…`), and
/// what the admitted pods' token volumes ask for.
pub(crate) const WARN_ONLY_EXPIRATION_SECONDS: i64 = 60 * 60 + 7;
const EXPIRATION_EXTENSION_SECONDS: i64 = 24 * 365 * 60 * 60;
/// go-jose's `DefaultLeeway`, which upstream's validation uses.
const LEEWAY_SECONDS: i64 = 60;
const INVALIDATED: &str = "service account token has been invalidated";

/// The token issuer of one test API server and the TokenRequests it served; clones
/// share them.
#[derive(Clone, Default)]
pub struct ServiceAccountTokens {
    signer: Arc<Signer>,
    served: Arc<Mutex<Vec<Value>>>,
    /// The cap on `expirationSeconds`; 0: none.
    max_expiration_seconds: Arc<AtomicI64>,
}

impl ServiceAccountTokens {
    /// Caps the lifetime of the tokens issued from now on, as kube-apiserver's
    /// `--service-account-max-token-expiration`: a TokenRequest asking for more than
    /// `max` seconds (after its validation, so it still must ask for at least 10 minutes)
    /// gets `max`, in its answer's `spec.expirationSeconds` and
    /// `status.expirationTimestamp` and in the token's `exp`. A request so shortened is no
    /// longer the kubelet's 3607 s and so gets no extended expiry, as upstream; with a cap
    /// above 3607 s a 3607 s request still gets the one-year token, as upstream's.
    ///
    /// Unlike upstream's flag, which must lie between one hour and 2^32 seconds, this
    /// test knob takes any positive number of seconds, so that a test can see tokens
    /// expire and be refreshed within seconds. None (or a value ≤ 0): no cap, the
    /// default. Shared by every clone, so it applies to a running server's state.
    pub fn set_max_expiration_seconds(&self, max: Option<i64>) {
        let max = max.filter(|m| *m > 0).unwrap_or(0);
        self.max_expiration_seconds.store(max, Ordering::SeqCst);
    }

    /// The cap set by [`Self::set_max_expiration_seconds`], if any.
    pub fn max_expiration_seconds(&self) -> Option<i64> {
        Some(self.max_expiration_seconds.load(Ordering::SeqCst)).filter(|m| *m > 0)
    }

    /// The TokenRequests served for service account `name` in `namespace`, oldest first,
    /// each as answered (with `status.token` and `status.expirationTimestamp`).
    pub fn token_requests(&self, namespace: &str, name: &str) -> Vec<Value> {
        self.served
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r["metadata"]["namespace"] == namespace && r["metadata"]["name"] == name)
            .cloned()
            .collect()
    }

    /// The claims of `token` if this server signed it (the signature only: a TokenReview
    /// checks the rest).
    pub fn verify(&self, token: &str) -> Result<Value, String> {
        self.signer.verify(token)
    }
}

/// Answers `path` if it is a service account's `token` subresource; None otherwise.
pub(crate) fn handle(
    state: &ApiState,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Response> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let [
        "api",
        "v1",
        "namespaces",
        ns,
        "serviceaccounts",
        name,
        "token",
    ] = parts.as_slice()
    else {
        return None;
    };
    if method != Method::POST {
        return Some(status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".to_string(),
        ));
    }
    Some(match token_request(state, ns, name, body) {
        Ok((answer, warning)) => {
            let mut response = (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                answer.to_string(),
            )
                .into_response();
            // As upstream's `warning.AddWarning`: code 299, agent "-", the text quoted.
            if let Some(warning) = warning
                && let Ok(value) = format!("299 - {warning:?}").parse()
            {
                response.headers_mut().insert("warning", value);
            }
            response
        }
        Err(f) => status_with_details(f.code, f.reason, f.message, f.details),
    })
}

/// A refused TokenRequest: the Status to answer.
struct Failure {
    code: StatusCode,
    reason: &'static str,
    message: String,
    details: Value,
}

impl Failure {
    fn new(code: StatusCode, reason: &'static str, message: String, details: Value) -> Failure {
        Failure {
            code,
            reason,
            message,
            details,
        }
    }

    fn bad_request(message: String) -> Failure {
        Failure::new(StatusCode::BAD_REQUEST, "BadRequest", message, Value::Null)
    }
}

/// The objects a token is bound to: (name, uid) of each.
#[derive(Default)]
struct Bound {
    pod: Option<(String, String)>,
    secret: Option<(String, String)>,
    node: Option<(String, String)>,
}

/// The answer to a TokenRequest, and the warning to send with it.
fn token_request(
    state: &ApiState,
    ns: &str,
    name: &str,
    body: &[u8],
) -> Result<(Value, Option<String>), Failure> {
    let mut req: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return Err(Failure::bad_request(
                "the body is not a TokenRequest".to_string(),
            ));
        }
    };
    for field in ["metadata", "spec"] {
        if !req[field].is_object() {
            req[field] = json!({});
        }
    }
    for (field, want, what) in [("name", name, "name"), ("namespace", ns, "namespace")] {
        if let Some(got) = req["metadata"][field].as_str().filter(|g| !g.is_empty())
            && got != want
        {
            return Err(invalid(
                name,
                &format!("metadata.{field}"),
                json!(got),
                &format!("must match the service account {what} if specified"),
            ));
        }
    }
    let sa = state
        .object("serviceaccounts", ns, name)
        .ok_or_else(|| not_found("serviceaccounts", name))?;
    let mut audiences: Vec<String> = strings(&req["spec"]["audiences"]);
    if audiences.is_empty() {
        audiences = API_AUDIENCES.iter().map(|a| a.to_string()).collect();
    }
    let mut seconds = req["spec"]["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
    if seconds < MIN_EXPIRATION_SECONDS {
        let why = "may not specify a duration less than 10 minutes";
        return Err(invalid("", "spec.expirationSeconds", json!(seconds), why));
    }
    if seconds > MAX_EXPIRATION_SECONDS {
        let why = "may not specify a duration larger than 2^32 seconds";
        return Err(invalid("", "spec.expirationSeconds", json!(seconds), why));
    }
    let bound = bind(state, ns, name, &req["spec"]["boundObjectRef"])?;
    let mut warning = None;
    if let Some(max) = state.service_accounts.max_expiration_seconds()
        && seconds > max
    {
        warning = Some(format!(
            "requested expiration of {seconds} seconds shortened to {max} seconds"
        ));
        seconds = max;
    }

    let now = now_seconds();
    // Upstream's safe transition for projected tokens: warn after the requested time,
    // fail only after the extension.
    let kube_audiences = audiences
        .iter()
        .all(|a| API_AUDIENCES.contains(&a.as_str()));
    let (lifetime, warn_after) =
        if bound.pod.is_some() && seconds == WARN_ONLY_EXPIRATION_SECONDS && kube_audiences {
            (EXPIRATION_EXTENSION_SECONDS, Some(now + seconds))
        } else {
            (seconds, None)
        };
    let mut k8s = json!({
        "namespace": ns,
        "serviceaccount": {"name": name, "uid": sa["metadata"]["uid"]},
    });
    for (claim, bound) in [
        ("pod", &bound.pod),
        ("secret", &bound.secret),
        ("node", &bound.node),
    ] {
        if let Some((name, uid)) = bound {
            k8s[claim] = json!({"name": name});
            if !uid.is_empty() {
                k8s[claim]["uid"] = uid.as_str().into();
            }
        }
    }
    if let Some(at) = warn_after {
        k8s["warnafter"] = at.into();
    }
    let claims = json!({
        "aud": audiences,
        "exp": now + lifetime,
        "iat": now,
        "iss": ISSUER,
        "jti": uuid(),
        "kubernetes.io": k8s,
        "nbf": now,
        "sub": format!("system:serviceaccount:{ns}:{name}"),
    });
    let token = state.service_accounts.signer.sign(&claims);

    req["apiVersion"] = "authentication.k8s.io/v1".into();
    req["kind"] = "TokenRequest".into();
    req["metadata"]["name"] = name.into();
    req["metadata"]["namespace"] = ns.into();
    req["metadata"]["creationTimestamp"] = rfc3339(now).into();
    req["spec"]["audiences"] = json!(audiences);
    req["spec"]["expirationSeconds"] = seconds.into();
    req["status"] = json!({"token": token, "expirationTimestamp": rfc3339(now + seconds)});
    state
        .service_accounts
        .served
        .lock()
        .unwrap()
        .push(req.clone());
    Ok((req, warning))
}

/// Checks `spec.boundObjectRef` as upstream: the object exists, a Pod runs as `sa_name`,
/// and a given uid is the object's.
fn bind(state: &ApiState, ns: &str, sa_name: &str, r: &Value) -> Result<Bound, Failure> {
    let mut bound = Bound::default();
    if !r.is_object() {
        return Ok(bound);
    }
    let text = |field: &str| r[field].as_str().unwrap_or_default().to_string();
    let (api_version, kind, name, want_uid) =
        (text("apiVersion"), text("kind"), text("name"), text("uid"));
    let (group, version) = api_version
        .split_once('/')
        .unwrap_or(("", api_version.as_str()));
    let (plural, scope) = match (group, kind.as_str()) {
        ("", "Pod") => ("pods", ns),
        ("", "Secret") => ("secrets", ns),
        ("", "Node") => ("nodes", ""),
        _ => {
            return Err(Failure::bad_request(format!(
                "cannot bind token to object of type {group}/{version}, Kind={kind}"
            )));
        }
    };
    let object = state
        .object(plural, scope, &name)
        .ok_or_else(|| not_found(plural, &name))?;
    let uid = object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    match plural {
        "pods" => {
            if object["spec"]["serviceAccountName"] != sa_name {
                return Err(Failure::bad_request(format!(
                    "cannot bind token for serviceaccount {sa_name:?} to pod running with different serviceaccount name."
                )));
            }
            // The node the pod runs on goes into the claims too (upstream's
            // ServiceAccountTokenPodNodeInfo), with its uid if the Node exists.
            if let Some(node) = object["spec"]["nodeName"]
                .as_str()
                .filter(|n| !n.is_empty())
            {
                let node_uid = state
                    .object("nodes", "", node)
                    .and_then(|n| n["metadata"]["uid"].as_str().map(String::from))
                    .unwrap_or_default();
                bound.node = Some((node.to_string(), node_uid));
            }
            bound.pod = Some((name.clone(), uid.clone()));
        }
        "secrets" => bound.secret = Some((name.clone(), uid.clone())),
        _ => bound.node = Some((name.clone(), uid.clone())),
    }
    if !want_uid.is_empty() && want_uid != uid {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {kind} {name:?}: the UID in the bound object reference ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
            json!({"name": name, "kind": kind}),
        ));
    }
    Ok(bound)
}

/// The TokenReview status of `spec.token` if this server issued it (its `iss`); None for
/// any other token.
pub(crate) fn review(state: &ApiState, spec: &Value) -> Option<Value> {
    let token = spec["token"].as_str()?;
    let (_, claims, _) = crate::apiserver_jwt::split(token).ok()?;
    if claims["iss"] != ISSUER {
        return None;
    }
    Some(
        authenticate(state, token, &strings(&spec["audiences"]))
            .unwrap_or_else(|error| json!({"authenticated": false, "error": error})),
    )
}

fn authenticate(state: &ApiState, token: &str, requested: &[String]) -> Result<Value, String> {
    let claims = state
        .service_accounts
        .verify(token)
        .map_err(|e| format!("invalid bearer token, {e}"))?;
    let now = now_seconds();
    let at = |claim: &str| claims[claim].as_i64();
    if at("exp").is_some_and(|exp| now > exp + LEEWAY_SECONDS) {
        return Err("service account token has expired".into());
    }
    if at("nbf").is_some_and(|nbf| now + LEEWAY_SECONDS < nbf) {
        return Err("service account token is not valid yet".into());
    }
    if at("iat").is_some_and(|iat| now + LEEWAY_SECONDS < iat) {
        return Err("service account token is issued in the future".into());
    }
    let requested = match requested {
        [] => API_AUDIENCES.iter().map(|a| a.to_string()).collect(),
        some => some.to_vec(),
    };
    let token_audiences = match &claims["aud"] {
        Value::String(one) => vec![one.clone()],
        many => strings(many),
    };
    let audiences: Vec<&String> = token_audiences
        .iter()
        .filter(|a| requested.contains(a))
        .collect();
    if audiences.is_empty() {
        return Err(format!(
            "token audiences {} is invalid for the target audiences {}",
            quoted(&token_audiences),
            quoted(&requested)
        ));
    }

    let k8s = &claims["kubernetes.io"];
    let ns = k8s["namespace"].as_str().unwrap_or_default();
    let sa_name = k8s["serviceaccount"]["name"].as_str().unwrap_or_default();
    let sa_uid = k8s["serviceaccount"]["uid"].as_str().unwrap_or_default();
    let cutoff = now - LEEWAY_SECONDS;
    let sa = state
        .object("serviceaccounts", ns, sa_name)
        .ok_or_else(|| format!("serviceaccounts {sa_name:?} not found"))?;
    let have = sa["metadata"]["uid"].as_str().unwrap_or_default();
    if have != sa_uid {
        return Err(format!(
            "service account UID ({have}) does not match claim ({sa_uid})"
        ));
    }
    if deleted_before(&sa, cutoff) {
        return Err(format!("service account {ns}/{sa_name} has been deleted"));
    }
    if k8s["secret"].is_object() {
        still_bound(state, "secrets", ns, &k8s["secret"], cutoff)?;
    }
    let mut extra = serde_json::Map::new();
    let key = |k: &str| format!("authentication.kubernetes.io/{k}");
    if k8s["pod"].is_object() {
        let (name, uid) = still_bound(state, "pods", ns, &k8s["pod"], cutoff)?;
        extra.insert(key("pod-name"), json!([name]));
        extra.insert(key("pod-uid"), json!([uid]));
    }
    if k8s["node"].is_object() {
        // A pod-bound token names its pod's node only for information.
        let (name, uid) = if k8s["pod"].is_object() {
            let text = |f: &str| k8s["node"][f].as_str().unwrap_or_default().to_string();
            (text("name"), text("uid"))
        } else {
            still_bound(state, "nodes", "", &k8s["node"], cutoff)?
        };
        extra.insert(key("node-name"), json!([name]));
        if !uid.is_empty() {
            extra.insert(key("node-uid"), json!([uid]));
        }
    }
    if let Some(jti) = claims["jti"].as_str().filter(|j| !j.is_empty()) {
        extra.insert(key("credential-id"), json!([format!("JTI={jti}")]));
    }
    Ok(json!({
        "authenticated": true,
        "user": {
            "username": format!("system:serviceaccount:{ns}:{sa_name}"),
            "uid": sa_uid,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "extra": extra,
        },
        "audiences": audiences,
    }))
}

/// The (name, uid) of a bound object that still exists with the claimed uid.
fn still_bound(
    state: &ApiState,
    plural: &str,
    ns: &str,
    claim: &Value,
    cutoff: i64,
) -> Result<(String, String), String> {
    let name = claim["name"].as_str().unwrap_or_default();
    let uid = claim["uid"].as_str().unwrap_or_default();
    let object = state
        .object(plural, ns, name)
        .ok_or_else(|| INVALIDATED.to_string())?;
    let have = object["metadata"]["uid"].as_str().unwrap_or_default();
    if have != uid {
        let what = plural.trim_end_matches('s');
        return Err(format!(
            "{what} UID ({have}) does not match service account {what} ref claim ({uid})"
        ));
    }
    if deleted_before(&object, cutoff) {
        return Err(INVALIDATED.to_string());
    }
    Ok((name.to_string(), uid.to_string()))
}

/// Whether `object` was marked deleted before `cutoff` (Unix seconds).
fn deleted_before(object: &Value, cutoff: i64) -> bool {
    object["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .is_some_and(|t| t.as_second() < cutoff)
}

fn not_found(plural: &str, name: &str) -> Failure {
    Failure::new(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{plural} {name:?} not found"),
        json!({"name": name, "kind": plural}),
    )
}

/// Upstream's 422 for a TokenRequest field.
fn invalid(name: &str, field: &str, value: Value, detail: &str) -> Failure {
    let cause = format!("Invalid value: {value}: {detail}");
    Failure::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("TokenRequest.authentication.k8s.io {name:?} is invalid: {field}: {cause}"),
        json!({
            "name": name, "group": "authentication.k8s.io", "kind": "TokenRequest",
            "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": field}],
        }),
    )
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A list as Go's `%q` prints a `[]string`.
fn quoted(list: &[String]) -> String {
    let items: Vec<String> = list.iter().map(|a| format!("{a:?}")).collect();
    format!("[{}]", items.join(" "))
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

fn rfc3339(seconds: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// A random (version 4) UUID, the token's `jti`.
fn uuid() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random source");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_format_as_upstream() {
        assert_eq!(
            quoted(&["a".to_string(), "b c".to_string()]),
            r#"["a" "b c"]"#
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        let id = uuid();
        assert_eq!((id.len(), &id[14..15]), (36, "4"), "{id}");
        let gone = json!({"metadata": {"deletionTimestamp": "1970-01-01T00:01:40Z"}});
        assert!(deleted_before(&gone, 101));
        assert!(!deleted_before(&gone, 100));
        assert!(!deleted_before(&json!({"metadata": {}}), i64::MAX));
    }
}
