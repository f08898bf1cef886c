//! The proxy subresources of the test API server, forwarded to the node's kubelet API
//! (TLS, port 10250) with a client certificate, as kube-apiserver forwards them
//! (pkg/registry/core/pod/strategy.go `LogLocation`, `ExecLocation`, `AttachLocation`,
//! `PortForwardLocation`; the node proxy):
//!
//! - `pods/log` → `/containerLogs/{ns}/{pod}/{container}` with `follow`, `previous`,
//!   `timestamps`, `sinceSeconds`, `sinceTime`, `tailLines`, `limitBytes`, streamed;
//! - `pods/exec`, `pods/attach` → `/exec|/attach/{ns}/{pod}/{container}` with `command`,
//!   `stdin`, `stdout`, `stderr`, `tty` (`1` when set, as upstream);
//! - `pods/portforward` → `/portForward/{ns}/{pod}`;
//! - `nodes/{name}[:port]/proxy/{path}` → `/{path}`, any method, the query as sent.
//!
//! The container defaults to the pod's only container and must be one of the pod's
//! (upstream's `validateContainer` wording). An upgrade (SPDY/3.1 or WebSocket) is relayed
//! as raw bytes once the kubelet answers 101, and a kubelet that refuses it is answered
//! as it answered, so a kubectl that tried WebSocket first falls back to SPDY. A WebSocket
//! carrying SPDY (`SPDY/3.1+portforward.k8s.io`, what kubectl ≥ 1.31 asks for
//! port-forward) is unwrapped here and spoken to the kubelet as a SPDY upgrade, as
//! kube-apiserver's tunneling handler does (the connection itself: `apiserver_relay`).

use crate::apiserver::{ApiState, status};
use crate::apiserver_relay::{forward, is_spdy_tunnel, tunnel_port_forward};
use crate::pki::Identity;
use axum::extract::{Query, Request};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// How the API server reaches kubelets: kube-apiserver's `--kubelet-client-certificate`
/// and `--kubelet-client-key`, `--kubelet-certificate-authority`, and host overrides.
#[derive(Clone, Debug, Default)]
pub struct KubeletSettings {
    /// The client certificate presented to kubelets; without one the kubelet sees an
    /// anonymous client, as with a kube-apiserver started without one.
    pub client: Option<Identity>,
    /// The CA (PEM) that signs kubelets' serving certificates; None: not verified, as
    /// kube-apiserver without `--kubelet-certificate-authority`.
    pub server_ca: Option<String>,
    /// Node name → the host to dial instead of the Node's published address.
    pub hosts: HashMap<String, String>,
}

/// The settings, shared by every copy of an [`ApiState`] and changeable while it serves.
#[derive(Clone, Debug, Default)]
pub struct KubeletAccess(Arc<RwLock<KubeletSettings>>);

impl KubeletAccess {
    pub fn configure(&self, change: impl FnOnce(&mut KubeletSettings)) {
        change(&mut self.0.write().unwrap_or_else(|e| e.into_inner()));
    }

    pub(crate) fn settings(&self) -> KubeletSettings {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A pod subresource the API server forwards.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum PodSubresource {
    Log,
    Exec,
    Attach,
    PortForward,
}

/// A request path this module serves.
#[derive(Debug, PartialEq)]
pub(crate) enum Proxied {
    Pod {
        namespace: String,
        name: String,
        sub: PodSubresource,
    },
    Node {
        name: String,
        port: Option<u16>,
        /// The kubelet path, with its leading `/`.
        path: String,
    },
}

impl Proxied {
    pub fn parse(path: &str) -> Option<Proxied> {
        let rest = path.strip_prefix("/api/v1/")?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["namespaces", ns, "pods", name, sub] => {
                let sub = match *sub {
                    "log" => PodSubresource::Log,
                    "exec" => PodSubresource::Exec,
                    "attach" => PodSubresource::Attach,
                    "portforward" => PodSubresource::PortForward,
                    _ => return None,
                };
                Some(Proxied::Pod {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    sub,
                })
            }
            ["nodes", node, "proxy", tail @ ..] => {
                // `name`, `name:port` or `https:name:port`, as upstream accepts.
                let node = node.strip_prefix("https:").unwrap_or(node);
                let (name, port) = match node.split_once(':') {
                    Some((name, port)) => (name, Some(port.parse().ok()?)),
                    None => (node, None),
                };
                Some(Proxied::Node {
                    name: name.to_string(),
                    port,
                    path: format!("/{}", tail.join("/")),
                })
            }
            _ => None,
        }
    }
}

/// Where a request goes: the node, and the kubelet path and query.
pub(crate) struct Location {
    pub node: String,
    pub port: Option<u16>,
    pub path_and_query: String,
}

/// Serves one proxied request.
pub(crate) async fn serve(state: &ApiState, target: Proxied, req: Request) -> Response {
    let allowed = match &target {
        Proxied::Pod {
            sub: PodSubresource::Log,
            ..
        } => req.method() == Method::GET,
        Proxied::Pod { .. } => req.method() == Method::GET || req.method() == Method::POST,
        Proxied::Node { .. } => true,
    };
    if !allowed {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({} {})",
                req.method(),
                req.uri().path()
            ),
        );
    }
    let location = match locate(state, &target, &req) {
        Ok(Some(location)) => location,
        // A pod not yet bound has no logs: an empty answer, as upstream.
        Ok(None) => return (StatusCode::OK, "").into_response(),
        Err(failure) => return failure.into_response(),
    };
    let tunnel = matches!(
        target,
        Proxied::Pod {
            sub: PodSubresource::PortForward,
            ..
        }
    ) && is_spdy_tunnel(req.headers());
    let log = matches!(
        target,
        Proxied::Pod {
            sub: PodSubresource::Log,
            ..
        }
    );
    let result = match tunnel {
        true => tunnel_port_forward(state, &location, req).await,
        false => forward(state, &location, req).await,
    };
    let response = result.unwrap_or_else(|failure| failure);
    if log {
        log_failure_as_status(response).await
    } else {
        response
    }
}

/// A kubelet's failed log answer as upstream's API server gives it: a `Status` whose
/// message is the kubelet's text (`GenericHttpResponseChecker`: 400 BadRequest, 404
/// NotFound, 500 InternalError), which kubectl prints as `Error from server (BadRequest):
/// container "c" in pod "p" is waiting to start: ContainerCreating`.
async fn log_failure_as_status(response: Response) -> Response {
    let code = response.status();
    if (200..=206).contains(&code.as_u16()) {
        return response;
    }
    let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
        response.into_body(),
        16 << 10,
    ))
    .await
    .map(|b| b.to_bytes())
    .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim_end().to_string();
    match code {
        StatusCode::BAD_REQUEST => status(code, "BadRequest", text),
        StatusCode::NOT_FOUND => status(code, "NotFound", text),
        StatusCode::INTERNAL_SERVER_ERROR => status(
            code,
            "InternalError",
            format!("Internal error occurred: {text}"),
        ),
        _ => status(code, "", text),
    }
}

/// A Status answer (code, reason, message), made into a response where it is returned.
pub(crate) struct Failure(pub StatusCode, pub &'static str, pub String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        status(self.0, self.1, self.2)
    }
}

/// The query's values: the first of a key, or all of them.
struct Params(Vec<(String, String)>);

impl Params {
    fn first(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, key: &str) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// apimachinery's query conversion of a bool: anything but `false` and `0` is true.
    fn flag(&self, key: &str) -> bool {
        self.first(key)
            .is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"))
    }

    fn int(&self, key: &str) -> Result<Option<i64>, Failure> {
        self.first(key)
            .map(|v| {
                v.parse().map_err(|_| {
                    Failure(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("strconv.ParseInt: parsing {v:?}: invalid syntax"),
                    )
                })
            })
            .transpose()
    }
}

fn locate(state: &ApiState, target: &Proxied, req: &Request) -> Result<Option<Location>, Failure> {
    let params = Params(
        Query::<Vec<(String, String)>>::try_from_uri(req.uri())
            .map(|q| q.0)
            .map_err(|e| Failure(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()))?,
    );
    let (namespace, name, sub) = match target {
        Proxied::Node { name, port, path } => {
            let path_and_query = match req.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            return Ok(Some(Location {
                node: name.clone(),
                port: *port,
                path_and_query,
            }));
        }
        Proxied::Pod {
            namespace,
            name,
            sub,
        } => (namespace, name, *sub),
    };
    let pod = state
        .objects("pods")
        .into_iter()
        .find(|p| {
            p["metadata"]["namespace"] == namespace.as_str()
                && p["metadata"]["name"] == name.as_str()
        })
        .ok_or_else(|| {
            Failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("pods \"{name}\" not found"),
            )
        })?;
    let node = pod["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut query: Vec<(&str, String)> = Vec::new();
    let path = match sub {
        PodSubresource::PortForward => {
            let ports: Vec<&str> = params.all("ports").collect();
            if !ports.is_empty() {
                query.push(("port", ports.join(",")));
            }
            format!("/portForward/{namespace}/{name}")
        }
        PodSubresource::Log => {
            let container = container(&pod, params.first("container").unwrap_or_default())?;
            log_query(&params, name, &mut query)?;
            format!("/containerLogs/{namespace}/{name}/{container}")
        }
        PodSubresource::Exec | PodSubresource::Attach => {
            let container = container(&pod, params.first("container").unwrap_or_default())?;
            for stream in ["stdin", "stdout", "stderr", "tty"] {
                if params.flag(stream) {
                    query.push((stream, "1".into()));
                }
            }
            let verb = match sub {
                PodSubresource::Exec => {
                    query.extend(params.all("command").map(|c| ("command", c.to_string())));
                    "exec"
                }
                _ => "attach",
            };
            format!("/{verb}/{namespace}/{name}/{container}")
        }
    };
    if node.is_empty() {
        return match sub {
            PodSubresource::Log => Ok(None),
            _ => Err(Failure(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("pod {name} does not have a host assigned"),
            )),
        };
    }
    let query: Vec<String> = query
        .iter()
        .map(|(k, v)| format!("{k}={}", escape(v)))
        .collect();
    let path_and_query = match query.is_empty() {
        true => path,
        false => format!("{path}?{}", query.join("&")),
    };
    Ok(Some(Location {
        node,
        port: None,
        path_and_query,
    }))
}

/// PodLogOptions, checked as upstream's `ValidatePodLogOptions`, into the kubelet's query.
fn log_query(params: &Params, pod: &str, query: &mut Vec<(&str, String)>) -> Result<(), Failure> {
    for flag in ["follow", "previous", "timestamps"] {
        if params.flag(flag) {
            query.push((flag, "true".into()));
        }
    }
    let mut invalid = Vec::new();
    let since_seconds = params.int("sinceSeconds")?;
    if let Some(s) = since_seconds {
        if s < 1 {
            invalid.push(format!(
                "sinceSeconds: Invalid value: {s}: must be greater than 0"
            ));
        }
        query.push(("sinceSeconds", s.to_string()));
    }
    if let Some(t) = params.first("sinceTime") {
        if t.parse::<k8s_openapi::jiff::Timestamp>().is_err() {
            return Err(Failure(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("parsing time {t:?} as RFC3339: cannot parse"),
            ));
        }
        if since_seconds.is_some() {
            invalid.push("at most one of `sinceTime` or `sinceSeconds` may be specified".into());
        }
        query.push(("sinceTime", t.to_string()));
    }
    if let Some(n) = params.int("tailLines")? {
        if n < 0 {
            invalid.push(format!(
                "tailLines: Invalid value: {n}: must be greater than or equal to 0"
            ));
        }
        query.push(("tailLines", n.to_string()));
    }
    if let Some(n) = params.int("limitBytes")? {
        if n < 1 {
            invalid.push(format!(
                "limitBytes: Invalid value: {n}: must be greater than 0"
            ));
        }
        query.push(("limitBytes", n.to_string()));
    }
    if invalid.is_empty() {
        return Ok(());
    }
    Err(Failure(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("PodLogOptions \"{pod}\" is invalid: {}", invalid.join(", ")),
    ))
}

/// upstream's `validateContainer`: the named container must be the pod's; no name is the
/// pod's only container.
fn container(pod: &Value, name: &str) -> Result<String, Failure> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let names: Vec<&str> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| pod["spec"][list].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let bad = |message: String| Failure(StatusCode::BAD_REQUEST, "BadRequest", message);
    if !name.is_empty() {
        return match names.contains(&name) {
            true => Ok(name.to_string()),
            false => Err(bad(format!(
                "container {name} is not valid for pod {pod_name}"
            ))),
        };
    }
    let containers = pod["spec"]["containers"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    match containers {
        [only] => Ok(only["name"].as_str().unwrap_or_default().to_string()),
        [] => Err(bad(format!(
            "a container name must be specified for pod {pod_name}"
        ))),
        _ => Err(bad(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            names.join(" ")
        ))),
    }
}

/// Percent-encodes a query value (everything but RFC 3986's unreserved characters).
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths() {
        assert_eq!(
            Proxied::parse("/api/v1/namespaces/default/pods/web/log"),
            Some(Proxied::Pod {
                namespace: "default".into(),
                name: "web".into(),
                sub: PodSubresource::Log
            })
        );
        assert_eq!(
            Proxied::parse("/api/v1/nodes/n1/proxy/stats/summary"),
            Some(Proxied::Node {
                name: "n1".into(),
                port: None,
                path: "/stats/summary".into()
            })
        );
        assert_eq!(
            Proxied::parse("/api/v1/nodes/n1:10251/proxy/logs/"),
            Some(Proxied::Node {
                name: "n1".into(),
                port: Some(10251),
                path: "/logs/".into()
            })
        );
        assert_eq!(
            Proxied::parse("/api/v1/nodes/n1/proxy"),
            Some(Proxied::Node {
                name: "n1".into(),
                port: None,
                path: "/".into()
            })
        );
        assert_eq!(
            Proxied::parse("/api/v1/namespaces/default/pods/web/status"),
            None
        );
        assert_eq!(Proxied::parse("/api/v1/namespaces/default/pods/web"), None);
    }

    #[test]
    fn containers_default_and_are_checked() {
        let one = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}});
        assert_eq!(container(&one, "").ok(), Some("c".to_string()));
        let two = json!({"metadata": {"name": "web"}, "spec": {
            "initContainers": [{"name": "i"}], "containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(container(&two, "i").ok(), Some("i".to_string()));
        assert!(container(&two, "").is_err());
        assert!(container(&two, "x").is_err());
    }

    #[test]
    fn log_options_become_the_kubelet_query() {
        let params = Params(vec![
            ("follow".into(), "true".into()),
            ("tailLines".into(), "5".into()),
            ("previous".into(), "false".into()),
        ]);
        let mut query = Vec::new();
        assert!(log_query(&params, "web", &mut query).is_ok());
        assert_eq!(
            query,
            vec![
                ("follow", "true".to_string()),
                ("tailLines", "5".to_string())
            ]
        );
        let bad = Params(vec![("tailLines".into(), "-1".into())]);
        assert!(log_query(&bad, "web", &mut Vec::new()).is_err());
        assert_eq!(escape("sh -c"), "sh%20-c");
    }
}
