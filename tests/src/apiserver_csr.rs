//! Client certificates and CertificateSigningRequests for the test API server, as a
//! node's certificate manager meets them on a real cluster:
//!
//! - **TLS** (`ApiServer::start_tls`): a serving certificate from the server's CA, and
//!   client certificates requested and verified against that CA. Each request is
//!   authenticated as upstream's x509 authenticator does, at request time: CN is the
//!   user and O the groups, and a certificate that expired since its connection's
//!   handshake gets 401. A bootstrap token (`<id>.<secret>`) in a bearer header is user
//!   `system:bootstrap:<id>` in `system:bootstrappers`. Every request over TLS is logged
//!   with its user and certificate serial, for tests to see who asked what.
//! - **`certificates.k8s.io/v1` CertificateSigningRequests** in the storage, with the
//!   requester written into `spec.username` and `spec.groups` at create, and the
//!   `approval` subresource (what `kubectl certificate approve|deny` updates).
//! - **The approver** of kube-controller-manager (`csrapproving`) for
//!   `kubernetes.io/kube-apiserver-client-kubelet`: a CSR for `system:node:<n>` in
//!   `system:nodes` from a bootstrap token or from that same node is approved. Serving
//!   CSRs (`kubernetes.io/kubelet-serving`) wait for a manual approval, as upstream,
//!   unless the test sets them automatic. A test may also deny or hold either.
//! - **The signer**: an approved CSR is signed by the server's CA with the lifetime the
//!   test sets (`spec.expirationSeconds` when shorter), so rotation is seen in seconds.

use crate::apiserver::ApiState;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// What the approver does with a CSR of one signer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Approval {
    /// Approve what upstream's approver would.
    Auto,
    /// Leave it pending (a person approves it, or nobody does).
    Manual,
    /// Deny it with this reason.
    Deny(String),
}

/// The client certificate a TLS connection presented.
#[derive(Clone, Debug)]
pub struct ClientCert {
    pub user: String,
    pub groups: Vec<String>,
    pub serial: String,
    pub not_after: SystemTime,
}

/// One request that came over TLS.
#[derive(Clone, Debug)]
pub struct Logged {
    pub user: String,
    /// The client certificate's serial (upper-case hex), if one was presented.
    pub serial: Option<String>,
    pub method: String,
    pub path: String,
    pub query: String,
    pub status: u16,
}

struct Policy {
    client: Approval,
    serving: Approval,
    lifetime: Duration,
    bootstrap_tokens: Vec<String>,
    log: Vec<Logged>,
}

/// The certificate side of a test API server; clones share it.
#[derive(Clone)]
pub struct Certificates {
    inner: Arc<Mutex<Policy>>,
}

impl Default for Certificates {
    fn default() -> Self {
        Certificates {
            inner: Arc::new(Mutex::new(Policy {
                client: Approval::Auto,
                serving: Approval::Manual,
                lifetime: Duration::from_secs(365 * 24 * 3600),
                bootstrap_tokens: Vec::new(),
                log: Vec::new(),
            })),
        }
    }
}

impl Certificates {
    fn lock(&self) -> std::sync::MutexGuard<'_, Policy> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `token` (`<id>.<secret>`) authenticates as `system:bootstrap:<id>`.
    pub fn add_bootstrap_token(&self, token: &str) {
        self.lock().bootstrap_tokens.push(token.into());
    }

    pub fn set_client_approval(&self, a: Approval) {
        self.lock().client = a;
    }

    pub fn set_serving_approval(&self, a: Approval) {
        self.lock().serving = a;
    }

    /// How long the certificates signed from now on live.
    pub fn set_lifetime(&self, d: Duration) {
        self.lock().lifetime = d;
    }

    /// The requests received over TLS so far.
    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    fn user_of_token(&self, token: &str) -> Option<(String, Vec<String>)> {
        let p = self.lock();
        p.bootstrap_tokens.iter().find(|t| *t == token).map(|t| {
            let id = t.split('.').next().unwrap_or_default();
            (
                format!("system:bootstrap:{id}"),
                vec!["system:bootstrappers".to_string()],
            )
        })
    }
}

/// The parsed client certificate of a TLS connection (None without one).
pub fn client_cert(der: &[u8]) -> Option<ClientCert> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let user = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let groups = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    let not_after = SystemTime::UNIX_EPOCH
        + Duration::from_secs(cert.validity().not_after.timestamp().max(0) as u64);
    Some(ClientCert {
        user,
        groups,
        serial: cert.raw_serial_as_string().replace(':', "").to_uppercase(),
        not_after,
    })
}

/// Marks a request that came over TLS, with the certificate its connection presented.
#[derive(Clone, Debug)]
pub struct OverTls(pub Option<ClientCert>);

/// The middleware: authenticates TLS requests, logs them, handles CSR creation (the
/// requester) and approval, and starts the approver and signer on each new CSR.
pub async fn layer(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let tls = req.extensions().get::<OverTls>().cloned();
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let (user, groups, serial) = match (&tls, &bearer) {
        (Some(OverTls(Some(cert))), _) => {
            if cert.not_after <= SystemTime::now() {
                let r = crate::apiserver::status(
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized",
                    "Unauthorized".into(),
                );
                let (m, u) = (req.method().to_string(), req.uri().clone());
                log(
                    &state,
                    &m,
                    &u,
                    cert.user.clone(),
                    Some(cert.serial.clone()),
                    401,
                );
                return r;
            }
            (
                cert.user.clone(),
                cert.groups.clone(),
                Some(cert.serial.clone()),
            )
        }
        (_, Some(token)) => match state.certificates.user_of_token(token) {
            Some((u, g)) => (u, g, None),
            None => ("system:anonymous".to_string(), vec![], None),
        },
        _ => ("system:anonymous".to_string(), vec![], None),
    };
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let log_it = tls.is_some();
    let uri = req.uri().clone();
    let (parts, body) = req.into_parts();
    let response = if method == Method::POST && path == CSRS {
        let bytes = axum::body::to_bytes(body, 1 << 20)
            .await
            .unwrap_or_default();
        let mut csr: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        csr["spec"]["username"] = user.clone().into();
        csr["spec"]["groups"] = json!(groups);
        let req = Request::from_parts(parts, axum::body::Body::from(csr.to_string()));
        let response = next.run(req).await;
        if response.status() == StatusCode::CREATED {
            let (rparts, rbody) = response.into_parts();
            let bytes = axum::body::to_bytes(rbody, 1 << 20)
                .await
                .unwrap_or_default();
            if let Ok(created) = serde_json::from_slice::<Value>(&bytes)
                && let Some(name) = created["metadata"]["name"].as_str()
            {
                control(&state, name);
            }
            Response::from_parts(rparts, axum::body::Body::from(bytes))
        } else {
            response
        }
    } else if method == Method::PUT
        && let Some(name) = path
            .strip_prefix(CSRS)
            .and_then(|p| p.strip_prefix('/'))
            .and_then(|p| p.strip_suffix("/approval"))
    {
        let bytes = axum::body::to_bytes(body, 1 << 20)
            .await
            .unwrap_or_default();
        let protobuf = crate::apiserver_protobuf::is_protobuf(&parts.headers);
        let parsed = if protobuf {
            protobuf_conditions(&bytes)
                .map(|c| json!({"status": {"conditions": c}}))
                .ok_or_else(|| "not a CertificateSigningRequest in protobuf".to_string())
        } else {
            serde_json::from_slice(&bytes).map_err(|e| e.to_string())
        };
        let incoming: Value = match parsed {
            Ok(v) => v,
            Err(e) => {
                return crate::apiserver::status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!(
                        "the approval must be JSON or protobuf ({:?}): {e}: {:?}",
                        parts.headers.get("content-type"),
                        String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                    ),
                );
            }
        };
        let conditions = incoming["status"]["conditions"].clone();
        match state.modify("certificatesigningrequests", "", name, |csr| {
            csr["status"]["conditions"] = conditions;
        }) {
            Some(next) => {
                control(&state, name);
                crate::apiserver::json_response(StatusCode::OK, &next)
            }
            None => crate::apiserver::status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("certificatesigningrequests.certificates.k8s.io \"{name}\" not found"),
            ),
        }
    } else {
        next.run(Request::from_parts(parts, body)).await
    };
    if log_it {
        let status = response.status().as_u16();
        log(&state, method.as_str(), &uri, user, serial, status);
    }
    response
}

/// The `status.conditions` of a CertificateSigningRequest sent as protobuf (what
/// kubectl's clientset sends for `certificate approve`): the `k8s\0` envelope, then
/// CertificateSigningRequest field 3 (status), field 1 (conditions): type 1, reason 2,
/// message 3, status 6.
fn protobuf_conditions(body: &[u8]) -> Option<Vec<Value>> {
    use crate::apiserver_protobuf::fields;
    let (_, _, raw) = crate::apiserver_protobuf::unwrap_envelope(body)?;
    let status = fields(raw)?
        .into_iter()
        .find(|f| f.0 == 3)
        .and_then(|f| f.1.bytes());
    let mut out = Vec::new();
    for (n, condition) in fields(status.unwrap_or_default())? {
        if n != 1 {
            continue;
        }
        let mut c = json!({});
        for (k, v) in fields(condition.bytes()?)? {
            let key = match k {
                1 => "type",
                2 => "reason",
                3 => "message",
                6 => "status",
                _ => continue,
            };
            c[key] = String::from_utf8_lossy(v.bytes()?).into_owned().into();
        }
        out.push(c);
    }
    Some(out)
}

fn log(
    state: &ApiState,
    method: &str,
    uri: &axum::http::Uri,
    user: String,
    serial: Option<String>,
    status: u16,
) {
    state.certificates.lock().log.push(Logged {
        user,
        serial,
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().unwrap_or_default().to_string(),
        status,
    });
}

/// Adds a condition (status True, stamped now) to a CSR's `status.conditions`.
fn add_condition(csr: &mut Value, kind: &str, reason: &str, message: &str) {
    let condition = json!({"type": kind, "status": "True", "reason": reason,
        "message": message, "lastUpdateTime": crate::apiserver::now()});
    match csr["status"]["conditions"].as_array_mut() {
        Some(conditions) => conditions.push(condition),
        None => csr["status"]["conditions"] = json!([condition]),
    }
}

/// The approver and the signer, run on every change of a CSR the server makes.
fn control(state: &ApiState, name: &str) {
    let Some(csr) = state.object("certificatesigningrequests", "", name) else {
        return;
    };
    let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
    let has = |t: &str| {
        csr["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
    };
    if has("Denied") || has("Failed") || csr["status"]["certificate"].is_string() {
        return;
    }
    if !has("Approved") {
        let policy = {
            let p = state.certificates.lock();
            match signer {
                CLIENT_SIGNER => p.client.clone(),
                SERVING_SIGNER => p.serving.clone(),
                _ => Approval::Manual,
            }
        };
        let (kind, reason, message) = match policy {
            Approval::Manual => return,
            Approval::Deny(reason) => ("Denied", reason.clone(), format!("{reason} (test policy)")),
            Approval::Auto if recognized(&csr) => (
                "Approved",
                "AutoApproved".to_string(),
                "Auto approving kubelet certificate after SubjectAccessReview.".to_string(),
            ),
            Approval::Auto => return,
        };
        state.modify("certificatesigningrequests", "", name, |c| {
            add_condition(c, kind, &reason, &message)
        });
        if kind == "Denied" {
            return;
        }
    }
    sign(state, name, &csr, signer);
}

/// What upstream's approver recognizes: `system:node:<n>` in `system:nodes` only, asked
/// by a bootstrap token (client certificates) or by that node itself.
fn recognized(csr: &Value) -> bool {
    let Some((cn, orgs)) = subject(csr) else {
        return false;
    };
    if !cn.starts_with("system:node:") || orgs != ["system:nodes"] {
        return false;
    }
    let username = csr["spec"]["username"].as_str().unwrap_or_default();
    let bootstrapper = csr["spec"]["groups"]
        .as_array()
        .is_some_and(|g| g.iter().any(|g| g == "system:bootstrappers"));
    match csr["spec"]["signerName"].as_str() {
        Some(CLIENT_SIGNER) => username == cn || bootstrapper,
        Some(SERVING_SIGNER) => username == cn,
        _ => false,
    }
}

fn request_pem(csr: &Value) -> Option<String> {
    use base64::Engine;
    let b64 = csr["spec"]["request"].as_str()?;
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(der).ok()
}

/// The CN and O of a CSR's request.
fn subject(csr: &Value) -> Option<(String, Vec<String>)> {
    let pem = request_pem(csr)?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let (_, req) =
        <x509_parser::certification_request::X509CertificationRequest as x509_parser::prelude::FromDer<_>>::from_der(&pem.contents)
            .ok()?;
    let subject = &req.certification_request_info.subject;
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())?
        .to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, orgs))
}

fn sign(state: &ApiState, name: &str, csr: &Value, signer: &str) {
    let lifetime = {
        let configured = state.certificates.lock().lifetime;
        match csr["spec"]["expirationSeconds"].as_u64() {
            Some(s) => configured.min(Duration::from_secs(s)),
            None => configured,
        }
    };
    let result = request_pem(csr)
        .ok_or_else(|| "spec.request is not a PEM certificate request".to_string())
        .and_then(|pem| {
            state
                .root_ca()
                .sign_request(&pem, lifetime, signer == SERVING_SIGNER)
        });
    state.modify("certificatesigningrequests", "", name, |c| match result {
        Ok(cert) => {
            use base64::Engine;
            c["status"]["certificate"] = base64::engine::general_purpose::STANDARD
                .encode(cert)
                .into();
        }
        Err(e) => add_condition(c, "Failed", "SignerValidationFailure", &e),
    });
}
