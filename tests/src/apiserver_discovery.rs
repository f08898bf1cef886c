//! The test API server's discovery documents, in the legacy (unaggregated) format every
//! kubectl reads: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>` and
//! `/apis/<group>/<version>`. A kubectl ≥ 1.26 asks for aggregated discovery first; a
//! plain `application/json` answer makes it read these, as against an older server.
//!
//! The resources listed are exactly those the storage serves (`apiserver::RESOURCES`)
//! plus the subresources the server answers: `status`, `pods/{log,exec,attach,
//! portforward}` and `nodes/proxy`, which are forwarded to the node's kubelet API
//! (`apiserver_proxy`), `serviceaccounts/token` (`apiserver_serviceaccount`) and
//! `certificatesigningrequests/approval` (`apiserver_csr`). OpenAPI v3 is served as far as
//! kubectl reads it to validate (`apiserver_fields`); `/openapi/v2` is not.

use crate::apiserver::RESOURCES;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The version `/version` reports (the Kubernetes API this server imitates).
pub(crate) const MAJOR: &str = "1";
pub(crate) const MINOR: &str = "32";

/// Verbs of the storage resources (the test server serves all of them, deletecollection
/// excepted).
const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// Short names kubectl resolves (`kubectl get po`).
fn short_names(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &["po"],
        "nodes" => &["no"],
        "configmaps" => &["cm"],
        "events" => &["ev"],
        "serviceaccounts" => &["sa"],
        "persistentvolumes" => &["pv"],
        "persistentvolumeclaims" => &["pvc"],
        "storageclasses" => &["sc"],
        _ => &[],
    }
}

/// The subresources of a resource beyond `status`: name, kind, verbs, and the group
/// version of the kind when it is not the resource's.
type Subresource = (
    &'static str,
    &'static str,
    &'static [&'static str],
    Option<(&'static str, &'static str)>,
);

fn subresources(plural: &str) -> &'static [Subresource] {
    match plural {
        "pods" => &[
            ("log", "Pod", &["get"], None),
            (
                "ephemeralcontainers",
                "Pod",
                &["get", "patch", "update"],
                None,
            ),
            ("resize", "Pod", &["get", "patch", "update"], None),
            ("exec", "PodExecOptions", &["create", "get"], None),
            ("attach", "PodAttachOptions", &["create", "get"], None),
            (
                "portforward",
                "PodPortForwardOptions",
                &["create", "get"],
                None,
            ),
        ],
        "nodes" => &[(
            "proxy",
            "NodeProxyOptions",
            &["create", "delete", "get", "patch", "update"],
            None,
        )],
        "serviceaccounts" => &[(
            "token",
            "TokenRequest",
            &["create"],
            Some(("authentication.k8s.io", "v1")),
        )],
        "certificatesigningrequests" => &[(
            "approval",
            "CertificateSigningRequest",
            &["get", "patch", "update"],
            None,
        )],
        _ => &[],
    }
}

/// The discovery document at `path`, if `path` is a discovery path.
pub fn document(path: &str) -> Option<Response> {
    let path = path.trim_end_matches('/');
    let doc = match path {
        "/version" => version(),
        "/api" => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups()}),
        _ => {
            if let Some(gv) = path.strip_prefix("/api/") {
                resource_list(gv)?
            } else {
                let gv = path.strip_prefix("/apis/")?;
                match gv.split_once('/') {
                    Some(_) => resource_list(gv)?,
                    None => groups().into_iter().find(|g| g["name"] == gv)?,
                }
            }
        }
    };
    Some(
        (
            StatusCode::OK,
            [("content-type", "application/json")],
            doc.to_string(),
        )
            .into_response(),
    )
}

fn version() -> Value {
    json!({
        "major": MAJOR,
        "minor": MINOR,
        "gitVersion": format!("v{MAJOR}.{MINOR}.0-nodeagent-test"),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "",
        "platform": format!("{}/{}", std::env::consts::OS, arch()),
    })
}

/// The architecture in Go's names (kubectl prints it).
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The API groups (other than the legacy core group) the storage serves.
fn groups() -> Vec<Value> {
    let mut names: Vec<&str> = RESOURCES
        .iter()
        .filter_map(|r| r.2.split_once('/').map(|(group, _)| group))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            // Each version once, however many resources it serves (kubectl refuses a
            // group that lists one version twice: "matches multiple kinds").
            let mut versions: Vec<Value> = Vec::new();
            for (g, v) in RESOURCES.iter().filter_map(|r| r.2.split_once('/')) {
                let version = json!({"groupVersion": format!("{g}/{v}"), "version": v});
                if g == name && !versions.contains(&version) {
                    versions.push(version);
                }
            }
            json!({
                "kind": "APIGroup", "apiVersion": "v1", "name": name,
                "preferredVersion": versions[0].clone(), "versions": versions,
            })
        })
        .collect()
}

/// The APIResourceList of one group version ("v1", "coordination.k8s.io/v1").
fn resource_list(group_version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for (plural, kind, _, namespaced) in RESOURCES.iter().filter(|r| r.2 == group_version) {
        resources.push(json!({
            "name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced,
            "kind": kind, "verbs": VERBS, "shortNames": short_names(plural),
        }));
        resources.push(json!({
            "name": format!("{plural}/status"), "singularName": "", "namespaced": namespaced,
            "kind": kind, "verbs": ["get", "patch", "update"],
        }));
        for (sub, sub_kind, verbs, group_version) in subresources(plural) {
            let mut resource = json!({
                "name": format!("{plural}/{sub}"), "singularName": "", "namespaced": namespaced,
                "kind": sub_kind, "verbs": verbs,
            });
            if let Some((group, version)) = group_version {
                resource["group"] = (*group).into();
                resource["version"] = (*version).into();
            }
            resources.push(resource);
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": group_version, "resources": resources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_list_has_the_proxy_subresources() {
        let list = resource_list("v1").unwrap();
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        for want in [
            "pods",
            "pods/status",
            "pods/ephemeralcontainers",
            "pods/resize",
            "pods/log",
            "pods/exec",
            "pods/attach",
            "pods/portforward",
            "nodes",
            "nodes/proxy",
            "serviceaccounts",
            "serviceaccounts/token",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(!names.contains(&"leases"));
    }

    #[test]
    fn a_group_lists_each_of_its_versions_once() {
        let storage = groups()
            .into_iter()
            .find(|g| g["name"] == "storage.k8s.io")
            .unwrap();
        assert_eq!(
            storage["versions"],
            json!([{"groupVersion": "storage.k8s.io/v1", "version": "v1"}])
        );
    }

    #[test]
    fn groups_list_coordination() {
        let groups = groups();
        let coordination = groups
            .iter()
            .find(|g| g["name"] == "coordination.k8s.io")
            .expect("coordination.k8s.io listed");
        assert_eq!(
            coordination["preferredVersion"]["groupVersion"],
            "coordination.k8s.io/v1"
        );
        assert!(groups.iter().any(|g| g["name"] == "certificates.k8s.io"));
        let csrs = resource_list("certificates.k8s.io/v1").expect("certificates.k8s.io/v1");
        assert!(
            csrs["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "certificatesigningrequests/approval"),
            "{csrs}"
        );
        assert!(resource_list("coordination.k8s.io/v1").is_some());
        assert!(resource_list("apps/v1").is_none());
        assert!(document("/apis/apps").is_none());
        assert!(document("/apis/coordination.k8s.io").is_some());
        assert!(document("/openapi/v2").is_none());
    }
}
