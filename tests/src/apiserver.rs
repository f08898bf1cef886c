//! A test API server: the one test double allowed for the Kubernetes API. It speaks the
//! real wire protocol to the unmodified kube-rs client and keeps the semantics the node
//! agent depends on:
//!
//! - pods, nodes, leases, events, configmaps, secrets, serviceaccounts and
//!   runtimeclasses (`node.k8s.io/v1`, with upstream's RuntimeClass admission of pods in
//!   `apiserver_runtimeclass`), csidrivers, csinodes, storageclasses and volumeattachments
//!   (`storage.k8s.io/v1`), persistentvolumes and persistentvolumeclaims, each object
//!   with a `metadata.resourceVersion` from one cluster-wide counter, a uid and a creation
//!   time;
//! - list (with the list's resourceVersion) and watch (`watch=true`) from a
//!   `resourceVersion`, newline-delimited JSON events, `allowWatchBookmarks` bookmarks,
//!   `timeoutSeconds`; a watch from a version older than the retained history gets an
//!   ERROR event with a 410 `Expired` Status, as the real server does;
//! - create (409 `AlreadyExists`), update with a stale resourceVersion (409 `Conflict`),
//!   the `status` subresource (status-only updates, and spec-only updates of the main
//!   resource), JSON merge patch and strategic merge patch (the lists upstream's types.go
//!   tags `patchStrategy:"merge"`, such as conditions, containers and pod IPs, merged by
//!   their keys; the rest, container statuses among them, replaced whole);
//! - `fieldSelector` on any field path (`spec.nodeName`, `metadata.name`,
//!   `involvedObject.name` for events, ...), `=`, `==` and `!=`;
//! - deletion with a grace period: a pod with grace > 0 gets `deletionTimestamp` and
//!   `deletionGracePeriodSeconds` (a MODIFIED event); a later delete may only shorten
//!   the period, and one with grace 0 removes the pod (its DELETED event says period 0);
//!   other kinds are removed at once;
//! - `tokenreviews` and `subjectaccessreviews` (create only), answered from a policy the
//!   test sets (`apiserver_auth`), as a kubelet's webhook authn/authz calls them, and
//!   service-account tokens from the `serviceaccounts/token` subresource (TokenRequest),
//!   reviewed as upstream does (`apiserver_serviceaccount`);
//! - what two controllers keep in every namespace in use: the `default` ServiceAccount and
//!   the `kube-root-ca.crt` ConfigMap with the server's CA, and the claims the ephemeral
//!   volume controller makes for a new pod's generic ephemeral volumes
//!   (`apiserver_controllers`);
//! - the ServiceAccount admission of a created pod: the `default` service account, which
//!   must exist (403 Forbidden), and the `kube-api-access-*` token volume mounted in its
//!   containers (`apiserver_admission`).
//!
//! - the attach/detach controller and, for the drivers a test deploys one for, an
//!   external-attacher: VolumeAttachments made, attached through the driver's
//!   `ControllerPublishVolume`, detached once the node no longer uses the volume, and the
//!   Node's `volumesAttached` (`apiserver_attach`).
//!
//! - over TLS (`start_tls`), x509 client-certificate and bootstrap-token authentication
//!   of each request, and CertificateSigningRequests (`certificates.k8s.io/v1`) with the
//!   `approval` subresource, upstream's kubelet CSR approver and a signer
//!   (`apiserver_csr`).
//!
//! Not covered (a test needing them must extend this first): authorization of its own
//! clients (and authentication over plain HTTP), label selectors, server-side apply, JSON
//! patch, finalizers, any other admission, validation, other defaulting, pagination
//! (`limit`/`continue`), protobuf encoding (except what kubectl sends as protobuf: ConfigMaps
//! and Secrets it creates, and CSR approvals; `apiserver_protobuf`), and any resource not
//! listed above.

use crate::apiserver_controllers::Write;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// How many past events a watch may resume from.
const HISTORY: usize = 1000;
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);

/// A resource the server knows: (plural, kind, API group version, namespaced).
pub(crate) const RESOURCES: [(&str, &str, &str, bool); 15] = [
    ("pods", "Pod", "v1", true),
    ("nodes", "Node", "v1", false),
    ("configmaps", "ConfigMap", "v1", true),
    ("secrets", "Secret", "v1", true),
    ("serviceaccounts", "ServiceAccount", "v1", true),
    ("events", "Event", "v1", true),
    ("leases", "Lease", "coordination.k8s.io/v1", true),
    ("runtimeclasses", "RuntimeClass", "node.k8s.io/v1", false),
    // A CSI driver's policy (`volumeLifecycleModes`, `podInfoOnMount`, `fsGroupPolicy`),
    // and the node's registered drivers, which the node agent keeps (issue 32).
    ("csidrivers", "CSIDriver", "storage.k8s.io/v1", false),
    ("csinodes", "CSINode", "storage.k8s.io/v1", false),
    // Persistent volumes and their claims, and the attachments the attach/detach
    // controller makes (issue 32, `apiserver_attach`); the tests bind claims themselves,
    // as the PV controller would.
    ("persistentvolumes", "PersistentVolume", "v1", false),
    (
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        "v1",
        true,
    ),
    ("storageclasses", "StorageClass", "storage.k8s.io/v1", false),
    (
        "volumeattachments",
        "VolumeAttachment",
        "storage.k8s.io/v1",
        false,
    ),
    (
        "certificatesigningrequests",
        "CertificateSigningRequest",
        "certificates.k8s.io/v1",
        false,
    ),
];

#[derive(Clone, Debug)]
pub(crate) struct WatchEvent {
    rv: u64,
    pub(crate) plural: String,
    pub(crate) kind: &'static str,
    object: Value,
}

impl WatchEvent {
    /// The object as the event carries it.
    pub(crate) fn object(&self) -> &Value {
        &self.object
    }
}

#[derive(Default)]
struct Store {
    /// (plural, namespace, name) -> object.
    objects: BTreeMap<(String, String, String), Value>,
    rv: u64,
    history: VecDeque<WatchEvent>,
    /// Events at or below this version are gone (compacted).
    compacted: u64,
}

/// The server's state; it outlives a server instance, so a test can "restart" the API
/// server on the same port and keep its objects.
#[derive(Clone)]
pub struct ApiState {
    store: Arc<Mutex<Store>>,
    events: broadcast::Sender<WatchEvent>,
    /// How many watches were refused with 410 Gone.
    pub expired_watches: Arc<std::sync::atomic::AtomicUsize>,
    /// How the proxy subresources reach kubelets (`apiserver_proxy`).
    pub kubelet: crate::apiserver_proxy::KubeletAccess,
    /// TokenReview and SubjectAccessReview answers (`apiserver_auth`).
    pub auth: crate::apiserver_auth::AuthPolicy,
    /// The service-account token issuer and the TokenRequests it served.
    pub service_accounts: crate::apiserver_serviceaccount::ServiceAccountTokens,
    /// The cluster CA published in every namespace's `kube-root-ca.crt`; it also signs
    /// the serving certificate of `start_tls` and approved CSRs (`apiserver_csr`).
    root_ca: Arc<crate::pki::TestCa>,
    /// Client-certificate authentication, CSR approval and signing (`apiserver_csr`).
    pub certificates: crate::apiserver_csr::Certificates,
    /// The scheduler and the node lifecycle controller (`apiserver_nodes`), off until
    /// enabled.
    pub cluster: crate::apiserver_nodes::ClusterControllers,
    /// The external-attachers deployed for CSI drivers (`apiserver_attach`, whose
    /// attach/detach controller always runs).
    pub attachers: crate::apiserver_attach::Attachers,
    /// How many of the next writes (PATCH or PUT) of a pod's `status` are answered 500
    /// InternalError, as an overloaded or failing server answers (a test sets it).
    pub fail_pod_status_writes: Arc<std::sync::atomic::AtomicUsize>,
    /// How many pod status writes were failed so.
    pub failed_pod_status_writes: Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for ApiState {
    fn default() -> Self {
        let state = Self {
            store: Arc::default(),
            events: broadcast::channel(4096).0,
            expired_watches: Arc::default(),
            kubelet: Default::default(),
            auth: Default::default(),
            service_accounts: Default::default(),
            root_ca: Arc::new(crate::pki::TestCa::new("nodeagent-test-apiserver-ca")),
            certificates: Default::default(),
            cluster: Default::default(),
            attachers: Default::default(),
            fail_pod_status_writes: Default::default(),
            failed_pod_status_writes: Default::default(),
        };
        {
            let mut s = state.store.lock().unwrap();
            for ns in crate::apiserver_controllers::INITIAL_NAMESPACES {
                sync_namespace(&state, &mut s, ns);
            }
        }
        state
    }
}

/// A running instance; dropping it (or `stop`) closes the listener and every watch.
pub struct ApiServer {
    pub state: ApiState,
    pub port: u16,
    /// Served over TLS (`start_tls`).
    tls: bool,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The cluster controllers' loop (`apiserver_nodes`), stopped with the server.
    controllers: tokio::task::JoinHandle<()>,
    /// The attach/detach controller's and the attachers' loop (`apiserver_attach`).
    attach: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        self.controllers.abort();
        self.attach.abort();
    }
}

/// Serves one connection (HTTP/1.1 with upgrades) until it closes.
async fn serve_connection<I, S>(io: I, app: S)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<
            axum::http::Request<hyper::body::Incoming>,
            Response = Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades()
        .await;
}

pub(crate) fn status(code: StatusCode, reason: &str, message: String) -> Response {
    status_with_details(code, reason, message, Value::Null)
}

/// A failure Status with `details` (name, group, kind, causes), as upstream's errors carry.
pub(crate) fn status_with_details(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Value,
) -> Response {
    let mut body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    if !details.is_null() {
        body["details"] = details;
    }
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(crate) fn now() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_second(nanos as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl ApiServer {
    /// Serves `state` on 127.0.0.1:`port` (0: any free port).
    pub async fn start(state: ApiState, port: u16) -> ApiServer {
        Self::start_at(state, ([127, 0, 0, 1], port).into())
            .await
            .expect("bind the API server")
    }

    /// Serves `state` on `addr` (the standalone binary's `--bind-address` and `--port`).
    pub async fn start_at(
        state: ApiState,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<ApiServer> {
        Self::serve(state, addr, None).await
    }

    /// Serves `state` over TLS on 127.0.0.1 (any free port): a serving certificate for
    /// 127.0.0.1 and localhost from the server's CA, and client certificates of that CA
    /// authenticating each request (`apiserver_csr`).
    pub async fn start_tls(state: ApiState) -> ApiServer {
        Self::start_tls_at(state, ([127, 0, 0, 1], 0).into())
            .await
            .expect("bind the API server")
    }

    /// Serves `state` over TLS on `addr` (the standalone binary's `--tls-dir`), its serving
    /// certificate for 127.0.0.1, localhost and `addr`'s IP.
    pub async fn start_tls_at(
        state: ApiState,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<ApiServer> {
        use rustls::pki_types::pem::PemObject as _;
        let ip = addr.ip().to_string();
        let mut sans = vec!["127.0.0.1", "localhost"];
        if !addr.ip().is_unspecified() && !sans.contains(&ip.as_str()) {
            sans.push(&ip);
        }
        let identity = state.root_ca.issue_server(&sans);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(state.root_ca_pem().as_bytes()) {
            roots.add(c.expect("CA PEM")).expect("CA");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .expect("client verifier");
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("server cert");
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
            .expect("server key");
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .expect("server config");
        Self::serve(state, addr, Some(Arc::new(config))).await
    }

    async fn serve(
        state: ApiState,
        addr: std::net::SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<ApiServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let port = listener.local_addr()?.port();
        // Discovery, proxy subresources and Tables (what kubectl needs) sit in front;
        // before them, authentication and CSRs.
        let app = Router::new()
            .fallback(handle)
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                crate::apiserver_kubectl::layer,
            ))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                crate::apiserver_csr::layer,
            ))
            .with_state(state.clone());
        let over_tls = tls.is_some();
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        // Our own accept loop: every connection task lives in this task's JoinSet, so that
        // stopping the server really closes every connection (and every watch), as a
        // restarting API server does.
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let app = app.clone();
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    let Some(acceptor) = acceptor else {
                        return serve_connection(stream, app).await;
                    };
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let cert = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| crate::apiserver_csr::client_cert(c));
                    let mark = crate::apiserver_csr::OverTls(cert);
                    let app = tower::ServiceExt::map_request(
                        app,
                        move |mut req: axum::http::Request<hyper::body::Incoming>| {
                            req.extensions_mut().insert(mark.clone());
                            req
                        },
                    );
                    serve_connection(stream, app).await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        let controllers = tokio::spawn(crate::apiserver_nodes::run(state.clone()));
        let attach = tokio::spawn(crate::apiserver_attach::run(state.clone()));
        Ok(ApiServer {
            state,
            port,
            tls: over_tls,
            task: Some(task),
            controllers,
            attach,
        })
    }

    /// Stops serving: the listener and every open connection (and watch) close.
    pub async fn stop(mut self) -> ApiState {
        self.controllers.abort();
        self.attach.abort();
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        self.state.clone()
    }

    /// A kubeconfig for this server (no credentials; over TLS it trusts the server's CA).
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_with("{}")
    }

    /// A bootstrap kubeconfig: the bootstrap `token` as its credentials (see
    /// `Certificates::add_bootstrap_token`).
    pub fn bootstrap_kubeconfig(&self, token: &str) -> String {
        self.kubeconfig_with(&format!("{{token: {token}}}"))
    }

    /// A kubeconfig of an administrator (`test-admin` in `system:masters`) with a client
    /// certificate from the server's CA: what kubectl needs against the TLS server (with
    /// no credentials at all it prompts for a password).
    pub fn admin_kubeconfig(&self) -> String {
        self.admin_kubeconfig_of(&self.admin_identity())
    }

    /// A client certificate of an administrator (`test-admin` in `system:masters`).
    pub fn admin_identity(&self) -> crate::pki::Identity {
        self.state
            .root_ca
            .issue_client("test-admin", &["system:masters"])
    }

    /// A kubeconfig with `id` as its credentials.
    pub fn admin_kubeconfig_of(&self, id: &crate::pki::Identity) -> String {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        self.kubeconfig_with(&format!(
            "{{client-certificate-data: {}, client-key-data: {}}}",
            b64(&id.cert_pem),
            b64(&id.key_pem)
        ))
    }

    fn kubeconfig_with(&self, user: &str) -> String {
        use base64::Engine;
        let ca = if self.tls {
            format!(
                "    certificate-authority-data: {}\n",
                base64::engine::general_purpose::STANDARD.encode(self.state.root_ca_pem())
            )
        } else {
            String::new()
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n{ca}\
             users:\n- name: test\n  user: {user}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
             current-context: test\n",
            url = self.url()
        )
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// A kube-rs client of this server, built as production builds one from a URL.
    pub fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().unwrap());
        if self.tls {
            use rustls::pki_types::pem::PemObject as _;
            config.root_cert = Some(
                rustls::pki_types::CertificateDer::pem_slice_iter(
                    self.state.root_ca_pem().as_bytes(),
                )
                .map(|c| c.expect("CA PEM").to_vec())
                .collect(),
            );
        }
        kube::Client::try_from(config).unwrap()
    }
}

impl ApiState {
    /// Simulates other writes to the cluster and then a compaction of the history: every
    /// version a client has seen so far becomes too old, so resuming a watch from it gets
    /// 410 Gone and the client must list again.
    pub fn compact(&self) {
        let mut s = self.store.lock().unwrap();
        s.rv += 1;
        s.compacted = s.rv;
        s.history.clear();
    }

    /// The stored object `name` of a kind (plural) in `namespace` ("" for cluster-scoped).
    pub fn object(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let s = self.store.lock().unwrap();
        s.objects
            .get(&(plural.to_string(), namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The CA bundle (PEM) published as `ca.crt` of every namespace's `kube-root-ca.crt`.
    pub fn root_ca_pem(&self) -> &str {
        self.root_ca.cert_pem()
    }

    pub(crate) fn root_ca(&self) -> &crate::pki::TestCa {
        &self.root_ca
    }

    /// Changes a stored object as a controller does (a MODIFIED event); None when it
    /// does not exist.
    pub(crate) fn modify(
        &self,
        plural: &str,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let t = target(
            plural,
            (!namespace.is_empty()).then(|| namespace.to_string()),
        )?;
        let mut s = self.store.lock().unwrap();
        let k = key(&t, name);
        let mut next = s.objects.get(&k)?.clone();
        change(&mut next);
        Some(commit(self, &mut s, &t, k, next))
    }

    /// Creates an object as a controller does (an ADDED event): `metadata.name`, or a name
    /// made from `metadata.generateName`; None when the kind is unknown there or the name
    /// is taken.
    pub(crate) fn add(&self, plural: &str, namespace: &str, mut object: Value) -> Option<Value> {
        let t = target(
            plural,
            (!namespace.is_empty()).then(|| namespace.to_string()),
        )?;
        let name = match object["metadata"]["name"].as_str() {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => format!(
                "{}{:05x}",
                object["metadata"]["generateName"]
                    .as_str()
                    .unwrap_or_default(),
                rand_suffix()
            ),
        };
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("generateName");
        }
        let mut s = self.store.lock().unwrap();
        if s.objects.contains_key(&key(&t, &name)) {
            return None;
        }
        Some(insert_new(self, &mut s, &t, &name, object))
    }

    /// Deletes a stored object as a controller does (a DELETED event); None when it does
    /// not exist.
    pub(crate) fn remove(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let t = target(
            plural,
            (!namespace.is_empty()).then(|| namespace.to_string()),
        )?;
        let mut s = self.store.lock().unwrap();
        let mut gone = s.objects.remove(&key(&t, name))?;
        s.rv += 1;
        gone["metadata"]["resourceVersion"] = s.rv.to_string().into();
        self.record(&mut s, &t.plural, t.kind, "DELETED", &gone);
        Some(gone)
    }

    /// Every write from now on, as watches see them.
    pub(crate) fn changes(&self) -> broadcast::Receiver<WatchEvent> {
        self.events.subscribe()
    }

    /// Every stored object of a kind (plural), e.g. "events".
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        let s = self.store.lock().unwrap();
        s.objects
            .iter()
            .filter(|(k, _)| k.0 == plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn record(
        &self,
        s: &mut Store,
        plural: &str,
        kind: &'static str,
        ty: &'static str,
        object: &Value,
    ) {
        let event = WatchEvent {
            rv: s.rv,
            plural: plural.to_string(),
            kind: ty,
            object: object.clone(),
        };
        s.history.push_back(event.clone());
        while s.history.len() > HISTORY {
            if let Some(old) = s.history.pop_front() {
                s.compacted = old.rv;
            }
        }
        let _ = kind;
        let _ = self.events.send(event);
    }
}

/// A parsed request path: /api/v1/[namespaces/{ns}/]{plural}[/{name}[/status]].
#[derive(Debug)]
struct Target {
    plural: String,
    kind: &'static str,
    api_version: &'static str,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// `pods/{name}/ephemeralcontainers` (`apiserver_ephemeral`).
    ephemeral: bool,
    /// `pods/{name}/resize` (`apiserver_resize`).
    resize: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match parts.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", "coordination.k8s.io", "v1", rest @ ..] => rest,
        ["apis", "node.k8s.io", "v1", rest @ ..] => rest,
        ["apis", "storage.k8s.io", "v1", rest @ ..] => rest,
        ["apis", "certificates.k8s.io", "v1", rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, status, ephemeral, resize) = match rest {
        [plural] => (*plural, None, false, false, false),
        [plural, name] => (*plural, Some(name.to_string()), false, false, false),
        [plural, name, "status"] => (*plural, Some(name.to_string()), true, false, false),
        ["pods", name, "ephemeralcontainers"] => {
            ("pods", Some(name.to_string()), false, true, false)
        }
        ["pods", name, "resize"] => ("pods", Some(name.to_string()), false, false, true),
        _ => return None,
    };
    let mut t = target(plural, namespace)?;
    t.name = name;
    t.status = status;
    t.ephemeral = ephemeral;
    t.resize = resize;
    Some(t)
}

/// The collection of `plural` in `namespace`, if the server knows it there.
fn target(plural: &str, namespace: Option<String>) -> Option<Target> {
    let (_, kind, api_version, namespaced) = RESOURCES.iter().find(|r| r.0 == plural)?;
    if !namespaced && namespace.is_some() {
        return None;
    }
    Some(Target {
        plural: plural.to_string(),
        kind,
        api_version,
        namespace,
        name: None,
        status: false,
        ephemeral: false,
        resize: false,
    })
}

fn matches_fields(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    selector.split(',').all(|term| {
        let (key, want, negate) = match term.split_once("!=") {
            Some((k, v)) => (k, v, true),
            None => match term.split_once('=') {
                Some((k, v)) => (k, v.trim_start_matches('='), false),
                None => return true,
            },
        };
        (field_value(object, key) == want) != negate
    })
}

/// The value a field selector's label names, as upstream's field sets give it: the dotted
/// path into the object (`spec.nodeName`, `involvedObject.name`, `status.phase`), an
/// event's `source` as its component; strings as they are, booleans and numbers printed,
/// a missing field empty (so it matches no non-empty value, never everything).
fn field_value(object: &Value, key: &str) -> String {
    let key = if key == "source" {
        "source.component"
    } else {
        key
    };
    let v = key.split('.').fold(object, |v, part| &v[part]);
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

async fn handle(
    State(state): State<ApiState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    if let Some(delay) = state.auth.review_delay(uri.path()) {
        tokio::time::sleep(delay).await;
    }
    if let Some(r) = crate::apiserver_auth::handle(&state, &method, uri.path(), &body) {
        return r;
    }
    if let Some(r) = crate::apiserver_serviceaccount::handle(&state, &method, uri.path(), &body) {
        return r;
    }
    let Some(t) = parse_path(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource ({})",
                uri.path()
            ),
        );
    };
    if t.plural == "pods"
        && t.status
        && matches!(method, Method::PATCH | Method::PUT)
        && state
            .fail_pod_status_writes
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok()
    {
        state
            .failed_pod_status_writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "Internal error occurred: the test injected this failure".into(),
        );
    }
    use crate::apiserver_fields::{self as fields, Directive};
    // A JSON body's repeated keys (protobuf has none to repeat).
    let duplicates = if body.is_empty() || crate::apiserver_protobuf::is_protobuf(&headers) {
        Vec::new()
    } else {
        fields::duplicate_fields(&body)
    };
    let body: Value = if body.is_empty() {
        Value::Null
    } else if crate::apiserver_protobuf::is_protobuf(&headers) {
        match crate::apiserver_protobuf::decode(&t.plural, &body) {
            Ok(v) => v,
            Err(e) => {
                return status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    e,
                );
            }
        }
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("invalid JSON body: {e}"),
                );
            }
        }
    };
    let directive = match Directive::parse(query.get("fieldValidation").map(String::as_str)) {
        Ok(d) => d,
        Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", message),
    };
    let checked = |object: &Value, before: &Value| {
        fields::check(
            t.kind,
            t.api_version,
            directive,
            &duplicates,
            object,
            before,
        )
    };
    match (method, &t.name) {
        (Method::POST, None) | (Method::PUT, Some(_)) if body.is_object() => {
            let warnings = match checked(&body, &Value::Null) {
                Ok(w) => w,
                Err(message) => return fields::refused(message),
            };
            let answer = match &t.name {
                None => create(&state, &t, body),
                Some(name) => update(&state, &t, name, body),
            };
            fields::with_warnings(answer, &warnings)
        }
        (Method::GET, None)
            if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) =>
        {
            watch(state, t, query).await
        }
        (Method::GET, None) => list(&state, &t, &query),
        (Method::GET, Some(name)) => get(&state, &t, name),
        (Method::POST, None) => create(&state, &t, body),
        (Method::PUT, Some(name)) => update(&state, &t, name, body),
        (Method::PATCH, Some(name)) => {
            let ctype = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            patch(&state, &t, name, &ctype, body, checked)
        }
        (Method::DELETE, Some(name)) => delete(&state, &t, name, body, &query),
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
        ),
    }
}

fn key(t: &Target, name: &str) -> (String, String, String) {
    (
        t.plural.clone(),
        t.namespace.clone().unwrap_or_default(),
        name.to_string(),
    )
}

pub(crate) fn json_response(code: StatusCode, v: &Value) -> Response {
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

fn with_type_meta(t: &Target, mut v: Value) -> Value {
    v["kind"] = t.kind.into();
    v["apiVersion"] = t.api_version.into();
    v
}

fn list(state: &ApiState, t: &Target, query: &HashMap<String, String>) -> Response {
    let s = state.store.lock().unwrap();
    let items: Vec<Value> = s
        .objects
        .iter()
        .filter(|(k, _)| k.0 == t.plural && t.namespace.as_ref().is_none_or(|ns| &k.1 == ns))
        .filter(|(_, v)| matches_fields(v, query.get("fieldSelector")))
        .map(|(_, v)| v.clone())
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", t.kind), "apiVersion": t.api_version,
            "metadata": {"resourceVersion": s.rv.to_string()}, "items": items,
        }),
    )
}

/// The real server's words: the resource qualified by its group, when it has one
/// (`volumeattachments.storage.k8s.io "x" not found`, `pods "x" not found`).
fn not_found(t: &Target, name: &str) -> Response {
    let resource = match t.api_version.split_once('/') {
        Some((group, _)) => format!("{}.{group}", t.plural),
        None => t.plural.clone(),
    };
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{resource} \"{name}\" not found"),
    )
}

fn get(state: &ApiState, t: &Target, name: &str) -> Response {
    let s = state.store.lock().unwrap();
    match s.objects.get(&key(t, name)) {
        Some(v) => json_response(StatusCode::OK, v),
        None => not_found(t, name),
    }
}

fn create(state: &ApiState, t: &Target, mut body: Value) -> Response {
    let name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = if name.is_empty() {
        match body["metadata"]["generateName"].as_str() {
            Some(prefix) => format!("{prefix}{:05x}", rand_suffix()),
            None => {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required".into(),
                );
            }
        }
    } else {
        name
    };
    let mut s = state.store.lock().unwrap();
    // A namespace's first object: its controllers' objects come first, as they would in a
    // cluster where the namespace was created before anything was put in it (so a pod's
    // admission finds the `default` ServiceAccount).
    if let Some(ns) = &t.namespace {
        sync_namespace(state, &mut s, ns);
    }
    if t.plural == "pods"
        && let Some(why) = crate::apiserver_ephemeral::create_error(&body)
    {
        return invalid_pod(&name, why);
    }
    // Admission comes before storage, as upstream's: a refused pod is refused even when
    // its name is taken.
    if t.plural == "pods"
        && let Some(ns) = &t.namespace
    {
        let account = |sa: &str| {
            s.objects
                .get(&("serviceaccounts".to_string(), ns.clone(), sa.to_string()))
                .cloned()
        };
        let class = |name: &str| {
            s.objects
                .get(&(
                    "runtimeclasses".to_string(),
                    String::new(),
                    name.to_string(),
                ))
                .cloned()
        };
        let admitted = crate::apiserver_admission::admit_pod(&mut body, ns, account)
            .and_then(|()| crate::apiserver_runtimeclass::admit_pod(&mut body, class));
        crate::apiserver_taints::default_toleration_seconds(&mut body);
        if let Err(why) = admitted {
            return status_with_details(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!("pods {name:?} is forbidden: {why}"),
                json!({"name": name, "kind": "pods"}),
            );
        }
    }
    if s.objects.contains_key(&key(t, &name)) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", t.plural),
        );
    }
    let body = insert_new(state, &mut s, t, &name, body);
    if t.plural == "pods"
        && let Some(claims) = target("persistentvolumeclaims", t.namespace.clone())
    {
        for claim in crate::apiserver_controllers::ephemeral_claims(&body) {
            let claim_name = claim["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if !s.objects.contains_key(&key(&claims, &claim_name)) {
                insert_new(state, &mut s, &claims, &claim_name, claim);
            }
        }
    }
    json_response(StatusCode::CREATED, &body)
}

/// Stores a new object `name` (the caller checked that it does not exist).
fn insert_new(state: &ApiState, s: &mut Store, t: &Target, name: &str, mut body: Value) -> Value {
    s.rv += 1;
    body = with_type_meta(t, body);
    body["metadata"]["name"] = name.into();
    if let Some(ns) = &t.namespace {
        body["metadata"]["namespace"] = ns.clone().into();
    }
    body["metadata"]["uid"] = format!("{:08x}-0000-4000-8000-{:012x}", rand_suffix(), s.rv).into();
    body["metadata"]["resourceVersion"] = s.rv.to_string().into();
    body["metadata"]["creationTimestamp"] = now().into();
    s.objects.insert(key(t, name), body.clone());
    state.record(s, &t.plural, t.kind, "ADDED", &body);
    body
}

/// Carries out what the namespace controllers (`apiserver_controllers`) want in `ns`.
fn sync_namespace(state: &ApiState, s: &mut Store, ns: &str) {
    let writes =
        crate::apiserver_controllers::reconcile(state.root_ca.cert_pem(), |plural, name| {
            s.objects
                .get(&(plural.to_string(), ns.to_string(), name.to_string()))
                .cloned()
        });
    for write in writes {
        let (plural, object) = match write {
            Write::Create(plural, object) | Write::Update(plural, object) => (plural, object),
        };
        let Some(t) = target(plural, Some(ns.to_string())) else {
            continue;
        };
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if s.objects.contains_key(&key(&t, &name)) {
            commit(state, s, &t, key(&t, &name), object);
        } else {
            insert_new(state, s, &t, &name, object);
        }
    }
}

fn rand_suffix() -> u32 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    n ^ std::process::id()
}

/// Stores `next` as the new version of `k` (the caller checked preconditions).
fn commit(
    state: &ApiState,
    s: &mut Store,
    t: &Target,
    k: (String, String, String),
    mut next: Value,
) -> Value {
    s.rv += 1;
    next["metadata"]["resourceVersion"] = s.rv.to_string().into();
    next = with_type_meta(t, next);
    s.objects.insert(k, next.clone());
    state.record(s, &t.plural, t.kind, "MODIFIED", &next);
    next
}

/// The subresource rule: /status changes only status; the main resource never does.
fn merge_subresource(t: &Target, current: &Value, incoming: Value) -> Value {
    let mut next = incoming;
    if t.plural == "pods" {
        next = crate::apiserver_ephemeral::merge(current, next, t.ephemeral);
    }
    if t.resize {
        // Only the containers' resources and resize policies, as upstream's ResizeStrategy.
        return crate::apiserver_resize::merge(current, next);
    }
    if t.status {
        let status = next["status"].clone();
        next = current.clone();
        next["status"] = status;
    } else if current.get("status").is_some() {
        next["status"] = current["status"].clone();
    }
    // Identity and system fields are the server's.
    for f in [
        "uid",
        "creationTimestamp",
        "namespace",
        "name",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        if let Some(v) = current["metadata"].get(f) {
            next["metadata"][f] = v.clone();
        }
    }
    next
}

/// 422 Invalid for a change of the ephemeral containers upstream refuses
/// (`apiserver_ephemeral`).
fn ephemeral_refused(t: &Target, name: &str, current: &Value, next: &Value) -> Option<Response> {
    let why = t
        .ephemeral
        .then(|| crate::apiserver_ephemeral::update_error(current, next))??;
    Some(invalid_pod(name, why))
}

/// 422 Invalid for a resize upstream's `ValidatePodResize` refuses (`apiserver_resize`).
fn resize_refused(t: &Target, name: &str, current: &Value, next: &Value) -> Option<Response> {
    let why = t
        .resize
        .then(|| crate::apiserver_resize::validate(current, next))??;
    Some(invalid_pod(name, why))
}

/// upstream's `NewInvalid`: each error (`<field>: <type>: <detail>`) a cause, which
/// kubectl prints after `The Pod "x" is invalid: `.
fn invalid_pod(name: &str, errors: Vec<String>) -> Response {
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| {
            // An error upstream gives no field starts with its type.
            let bare = ["Forbidden: ", "Invalid value: "]
                .iter()
                .any(|t| e.starts_with(t));
            let (field, message) = match e.split_once(": ") {
                Some(split) if !bare => split,
                _ => ("", e.as_str()),
            };
            let reason = match message.split_once(':').map(|(t, _)| t) {
                Some("Forbidden") => "FieldValueForbidden",
                Some("Not found") => "FieldValueNotFound",
                _ => "FieldValueInvalid",
            };
            json!({"reason": reason, "message": message, "field": field})
        })
        .collect();
    status_with_details(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("Pod {name:?} is invalid: {}", errors.join(", ")),
        json!({"name": name, "kind": "Pod", "causes": causes}),
    )
}

/// 409 Conflict when the request names a resourceVersion that is no longer current.
fn stale(t: &Target, name: &str, body: &Value, current: &Value) -> Option<Response> {
    let sent = body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let have = current["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    (!sent.is_empty() && sent != have).then(|| {
        status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                t.plural
            ),
        )
    })
}

fn update(state: &ApiState, t: &Target, name: &str, body: Value) -> Response {
    let mut s = state.store.lock().unwrap();
    let k = key(t, name);
    let Some(current) = s.objects.get(&k).cloned() else {
        return not_found(t, name);
    };
    if let Some(conflict) = stale(t, name, &body, &current) {
        return conflict;
    }
    if let Some(refused) = ephemeral_refused(t, name, &current, &body) {
        return refused;
    }
    let next = merge_subresource(t, &current, body);
    if let Some(refused) = resize_refused(t, name, &current, &next) {
        return refused;
    }
    let stored = commit(state, &mut s, t, k, next);
    if let Some(ns) = &t.namespace {
        sync_namespace(state, &mut s, ns);
    }
    json_response(StatusCode::OK, &stored)
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let obj = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    obj.remove(k);
                } else {
                    merge_patch(obj.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The merge keys of the lists that strategic merge patch merges, as upstream's types.go
/// tags them (`patchStrategy:"merge"` with a `patchMergeKey`); every other list is
/// replaced whole by the patch's, among them a pod's container statuses (init, regular
/// and ephemeral: no patch strategy, `+listType=atomic`) and the Node's `volumesAttached`
/// and `volumesInUse`.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" => "type",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "resourceClaimStatuses" => "name",
        "podIPs" | "hostIPs" => "ip",
        "addresses" => "type",
        _ => return None,
    })
}

/// Strategic merge patch, for the lists upstream merges by key.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let obj = target.as_object_mut().unwrap();
    for (k, v) in p {
        if k.starts_with("$setElementOrder") || k == "$patch" {
            continue;
        }
        match (v, merge_key(k)) {
            (Value::Null, _) => {
                obj.remove(k);
            }
            // A `{"$patch": "replace"}` item: the list is the other items, whole.
            (Value::Array(items), _) if items.iter().any(|i| i["$patch"] == "replace") => {
                let whole = items
                    .iter()
                    .filter(|i| i["$patch"] != "replace")
                    .cloned()
                    .collect();
                obj.insert(k.clone(), Value::Array(whole));
            }
            (Value::Array(items), Some(mk)) => {
                let current = obj.entry(k.clone()).or_insert_with(|| json!([]));
                if !current.is_array() {
                    *current = json!([]);
                }
                let list = current.as_array_mut().unwrap();
                for item in items {
                    let id = &item[mk];
                    if item["$patch"] == "delete" {
                        list.retain(|e| &e[mk] != id);
                    } else if let Some(existing) = list.iter_mut().find(|e| &e[mk] == id) {
                        strategic_merge_patch(existing, item);
                    } else {
                        list.push(item.clone());
                    }
                }
            }
            (Value::Object(_), _) => {
                strategic_merge_patch(obj.entry(k.clone()).or_insert(Value::Null), v)
            }
            _ => {
                obj.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Patches the stored object; `check` judges the result's fields (upstream checks the
/// patched object's unknown fields, as a whole object).
fn patch(
    state: &ApiState,
    t: &Target,
    name: &str,
    ctype: &str,
    body: Value,
    check: impl Fn(&Value, &Value) -> crate::apiserver_fields::Checked,
) -> Response {
    let mut s = state.store.lock().unwrap();
    let k = key(t, name);
    let Some(current) = s.objects.get(&k).cloned() else {
        return not_found(t, name);
    };
    let mut next = current.clone();
    match ctype.split(';').next().unwrap_or_default() {
        "application/merge-patch+json" => merge_patch(&mut next, &body),
        "application/strategic-merge-patch+json" => strategic_merge_patch(&mut next, &body),
        other => {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("the test API server does not support patch type {other:?}"),
            );
        }
    }
    if let Some(conflict) = stale(t, name, &body, &current) {
        return conflict;
    }
    let warnings = match check(&next, &current) {
        Ok(w) => w,
        Err(message) => return crate::apiserver_fields::refused(message),
    };
    if let Some(refused) = ephemeral_refused(t, name, &current, &next) {
        return refused;
    }
    let next = merge_subresource(t, &current, next);
    if let Some(refused) = resize_refused(t, name, &current, &next) {
        return refused;
    }
    let stored = commit(state, &mut s, t, k, next);
    if let Some(ns) = &t.namespace {
        sync_namespace(state, &mut s, ns);
    }
    crate::apiserver_fields::with_warnings(json_response(StatusCode::OK, &stored), &warnings)
}

fn delete(
    state: &ApiState,
    t: &Target,
    name: &str,
    body: Value,
    query: &HashMap<String, String>,
) -> Response {
    let mut s = state.store.lock().unwrap();
    let k = key(t, name);
    let Some(current) = s.objects.get(&k).cloned() else {
        return not_found(t, name);
    };
    // The storage layer's preconditions: a deletion meant for another object of that
    // name (another UID, or a changed one) is refused, 409, with etcd3's words.
    for (field, meta) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        if let Some(want) = body["preconditions"][field].as_str()
            && current["metadata"][field].as_str() != Some(want)
        {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: {meta} in precondition: {want}, {meta} in object meta: {}",
                    t.plural,
                    current["metadata"][field].as_str().unwrap_or_default()
                ),
            );
        }
    }
    let grace = body["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()))
        .or_else(|| {
            (t.plural == "pods").then(|| {
                current["spec"]["terminationGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(30)
            })
        })
        .unwrap_or(0);
    let already = current["metadata"]["deletionGracePeriodSeconds"].as_i64();
    if t.plural == "pods" && grace > 0 {
        // kube-apiserver's BeforeDelete: a second deletion may only shorten the period.
        if already.is_some_and(|g| g <= grace) {
            return json_response(StatusCode::OK, &current);
        }
        let mut next = current;
        next["metadata"]["deletionTimestamp"] = now().into();
        next["metadata"]["deletionGracePeriodSeconds"] = grace.into();
        let stored = commit(state, &mut s, t, k, next);
        return json_response(StatusCode::OK, &stored);
    }
    s.objects.remove(&k);
    s.rv += 1;
    let mut gone = current;
    if t.plural == "pods" {
        // An immediate deletion (grace 0, or a force delete during a graceful one) is
        // stored with period 0 before it goes, so the DELETED event says 0.
        if gone["metadata"].get("deletionTimestamp").is_none() {
            gone["metadata"]["deletionTimestamp"] = now().into();
        }
        gone["metadata"]["deletionGracePeriodSeconds"] = 0.into();
    }
    gone["metadata"]["resourceVersion"] = s.rv.to_string().into();
    state.record(&mut s, &t.plural, t.kind, "DELETED", &gone);
    if let Some(ns) = &t.namespace {
        sync_namespace(state, &mut s, ns);
    }
    json_response(StatusCode::OK, &gone)
}

async fn watch(state: ApiState, t: Target, query: HashMap<String, String>) -> Response {
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(300));
    let selector = query.get("fieldSelector").cloned();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let relevant = {
        let t_plural = t.plural.clone();
        let ns = t.namespace.clone();
        move |e: &WatchEvent| {
            e.plural == t_plural
                && ns
                    .as_ref()
                    .is_none_or(|n| e.object["metadata"]["namespace"].as_str() == Some(n))
                && matches_fields(&e.object, selector.as_ref())
        }
    };
    let line = |ty: &str, object: &Value| {
        Bytes::from(format!("{}\n", json!({"type": ty, "object": object})))
    };
    // Under the lock: check the version, take the backlog, subscribe, so nothing is missed.
    let (backlog, mut live, expired, current_rv) = {
        let s = state.store.lock().unwrap();
        let expired = from != 0 && from < s.compacted;
        let backlog: Vec<WatchEvent> = if from == 0 {
            // No version: the current state as ADDED events, as the real server does.
            s.objects
                .iter()
                .filter(|(k, _)| k.0 == t.plural)
                .map(|(_, v)| WatchEvent {
                    rv: s.rv,
                    plural: t.plural.clone(),
                    kind: "ADDED",
                    object: v.clone(),
                })
                .collect()
        } else {
            s.history.iter().filter(|e| e.rv > from).cloned().collect()
        };
        (backlog, state.events.subscribe(), expired, s.rv)
    };
    if expired {
        state
            .expired_watches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let err = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {from} ({current_rv})"), "reason": "Expired", "code": 410});
        let _ = tx.try_send(Ok(line("ERROR", &err)));
    } else {
        let kind = t.kind;
        let api_version = t.api_version;
        tokio::spawn(async move {
            let mut last = from;
            for e in backlog.into_iter().filter(|e| relevant(e)) {
                last = last.max(e.rv);
                if tx.send(Ok(line(e.kind, &e.object))).await.is_err() {
                    return;
                }
            }
            let deadline = tokio::time::Instant::now() + timeout;
            let mut tick = tokio::time::interval(BOOKMARK_EVERY);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => return,
                    _ = tx.closed() => return,
                    _ = tick.tick(), if bookmarks => {
                        let rv = state.store.lock().unwrap().rv.max(last);
                        let bm = json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}});
                        if tx.send(Ok(line("BOOKMARK", &bm))).await.is_err() { return; }
                    }
                    e = live.recv() => match e {
                        Ok(e) if e.rv > last && relevant(&e) => {
                            last = e.rv;
                            if tx.send(Ok(line(e.kind, &e.object))).await.is_err() { return; }
                        }
                        Ok(_) => {}
                        Err(_) => return, // lagged or closed: the client re-watches
                    }
                }
            }
        });
    }
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategic_merge_merges_conditions_by_type() {
        let mut pod = json!({"status": {"phase": "Pending", "conditions": [
            {"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}});
        strategic_merge_patch(
            &mut pod,
            &json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        assert_eq!(pod["status"]["phase"], "Running");
        let conds = pod["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[0], json!({"type": "Ready", "status": "True"}));
    }

    /// What `kubectl describe pod x` asks for its events (kubectl's describe:
    /// `involvedObject.name=x,involvedObject.namespace=ns,involvedObject.uid=u`): only
    /// that pod's events, never another's (an unknown label once matched everything).
    #[test]
    fn field_selectors_follow_the_field_path() {
        let event = json!({"involvedObject": {"kind": "Pod", "name": "user1", "namespace": "default", "uid": "u1"},
                           "source": {"component": "kubelet"}, "type": "Normal"});
        let sel = |s: &str| matches_fields(&event, Some(&s.to_string()));
        assert!(sel(
            "involvedObject.name=user1,involvedObject.namespace=default,involvedObject.uid=u1"
        ));
        assert!(!sel("involvedObject.name=user2"));
        assert!(sel("involvedObject.name!=user2"));
        assert!(sel("source=kubelet,type==Normal"));
        assert!(!sel("involvedObject.fieldPath=spec.containers{c}"));
        let pod = json!({"spec": {"nodeName": "n1", "hostNetwork": true}, "status": {"phase": "Running"}});
        assert!(matches_fields(
            &pod,
            Some(&"spec.nodeName=n1,status.phase=Running,spec.hostNetwork=true".into())
        ));
        assert!(!matches_fields(&pod, Some(&"spec.nodeName=".into())));
    }

    #[test]
    fn merge_patch_replaces_lists_and_removes_nulls() {
        let mut v = json!({"a": [1, 2], "b": {"c": 1, "d": 2}});
        merge_patch(&mut v, &json!({"a": [3], "b": {"c": null}}));
        assert_eq!(v, json!({"a": [3], "b": {"d": 2}}));
    }

    #[test]
    fn paths_name_resources() {
        let t = parse_path("/api/v1/namespaces/default/pods/web/status").unwrap();
        assert_eq!(
            (
                t.plural.as_str(),
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.status
            ),
            ("pods", Some("default"), Some("web"), true)
        );
        assert!(parse_path("/api/v1/namespaces/x/nodes").is_none());
        assert_eq!(
            parse_path("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
                .unwrap()
                .kind,
            "Lease"
        );
        assert!(matches_fields(
            &json!({"spec": {"nodeName": "n1"}}),
            Some(&"spec.nodeName=n1".to_string())
        ));
        assert!(!matches_fields(
            &json!({"spec": {"nodeName": "n2"}}),
            Some(&"spec.nodeName=n1".to_string())
        ));
    }
}
