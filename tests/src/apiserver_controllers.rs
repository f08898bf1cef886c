//! The controllers of kube-controller-manager whose objects pods rely on, as decisions
//! the test API server applies in the same write that uses a namespace (the first two) or
//! creates a pod (the third):
//!
//! - the service-account controller (pkg/controller/serviceaccount): a `default`
//!   ServiceAccount in every namespace, recreated when deleted;
//! - the root-CA publisher (pkg/controller/certificates/rootcacertpublisher): a ConfigMap
//!   `kube-root-ca.crt` whose `ca.crt` is the API server's CA, recreated when deleted and
//!   put back when changed;
//! - the ephemeral volume controller (pkg/controller/volume/ephemeral): for each generic
//!   ephemeral volume of a new pod, the claim `<pod>-<volume>` from its template, owned by
//!   the pod (binding it is the test's, as the PV controller's would be).
//!
//! The test server has no Namespace objects: a namespace exists once something is written
//! in it, and the four a cluster starts with exist from the start.

use serde_json::{Value, json};

/// The namespaces a new cluster has.
pub(crate) const INITIAL_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

/// Upstream's `kubernetes.io/description` of the root CA ConfigMap.
const ROOT_CA_DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the \
     kube-apiserver when using internal endpoints such as the internal service IP or \
     kubernetes.default.svc. No other usage is guaranteed across distributions of \
     Kubernetes clusters.";

/// A write the controllers want, on a resource (plural) of the namespace.
#[derive(Debug, PartialEq)]
pub(crate) enum Write {
    /// Create this object (metadata.name set; the server fills in the rest).
    Create(&'static str, Value),
    /// Replace the stored object of this name with this one.
    Update(&'static str, Value),
}

/// What the controllers write in a namespace, given its current objects
/// (`current(plural, name)`) and the API server's CA bundle.
pub(crate) fn reconcile(
    root_ca_pem: &str,
    current: impl Fn(&str, &str) -> Option<Value>,
) -> Vec<Write> {
    let mut writes = Vec::new();
    if current("serviceaccounts", DEFAULT_SERVICE_ACCOUNT).is_none() {
        writes.push(Write::Create(
            "serviceaccounts",
            json!({"metadata": {"name": DEFAULT_SERVICE_ACCOUNT}}),
        ));
    }
    let data = json!({"ca.crt": root_ca_pem});
    match current("configmaps", ROOT_CA_CONFIG_MAP) {
        None => writes.push(Write::Create(
            "configmaps",
            json!({
                "metadata": {
                    "name": ROOT_CA_CONFIG_MAP,
                    "annotations": {"kubernetes.io/description": ROOT_CA_DESCRIPTION},
                },
                "data": data,
            }),
        )),
        Some(cm) => {
            let described = cm["metadata"]["annotations"]["kubernetes.io/description"]
                .as_str()
                .is_some_and(|d| !d.is_empty());
            if cm["data"] != data || !described {
                let mut next = cm;
                next["data"] = data;
                if !described {
                    next["metadata"]["annotations"]["kubernetes.io/description"] =
                        ROOT_CA_DESCRIPTION.into();
                }
                writes.push(Write::Update("configmaps", next));
            }
        }
    }
    writes
}

/// The claims the ephemeral volume controller creates for a new pod: for each generic
/// ephemeral volume, `<pod>-<volume>` with the template's labels, annotations and spec,
/// controlled by the pod (upstream's `handleVolume`).
pub(crate) fn ephemeral_claims(pod: &Value) -> Vec<Value> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| {
            let template = v.get("ephemeral")?.get("volumeClaimTemplate")?;
            let volume = v["name"].as_str()?;
            let mut metadata = json!({
                "name": format!("{name}-{volume}"),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                    "uid": uid, "controller": true, "blockOwnerDeletion": true}],
            });
            for field in ["labels", "annotations"] {
                if let Some(value) = template["metadata"].get(field) {
                    metadata[field] = value.clone();
                }
            }
            Some(json!({"metadata": metadata, "spec": template["spec"].clone()}))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_namespace_gets_both_objects_and_a_complete_one_nothing() {
        let writes = reconcile("PEM", |_, _| None);
        assert_eq!(writes.len(), 2);
        assert!(matches!(&writes[0], Write::Create("serviceaccounts", sa)
            if sa["metadata"]["name"] == "default"));
        assert!(matches!(&writes[1], Write::Create("configmaps", cm)
            if cm["data"]["ca.crt"] == "PEM" && cm["metadata"]["name"] == "kube-root-ca.crt"));

        let cm = match &writes[1] {
            Write::Create(_, cm) => cm.clone(),
            other => panic!("{other:?}"),
        };
        let complete = |plural: &str, _: &str| match plural {
            "configmaps" => Some(cm.clone()),
            _ => Some(json!({})),
        };
        assert_eq!(reconcile("PEM", complete), vec![]);
    }

    #[test]
    fn a_changed_bundle_is_put_back() {
        let cm = json!({"metadata": {"name": ROOT_CA_CONFIG_MAP, "uid": "u",
            "annotations": {"kubernetes.io/description": "d"}},
            "data": {"ca.crt": "OLD", "extra": "x"}});
        let writes = reconcile("PEM", |plural, _| {
            (plural == "configmaps")
                .then(|| cm.clone())
                .or(Some(json!({})))
        });
        let [Write::Update("configmaps", next)] = writes.as_slice() else {
            panic!("{writes:?}");
        };
        assert_eq!(next["data"], json!({"ca.crt": "PEM"}));
        assert_eq!(next["metadata"]["uid"], "u");
    }

    /// Upstream's ephemeral controller (`TestSyncHandler`'s "create" case): the claim is
    /// `<pod>-<volume>`, controlled by the pod, with the template's labels and spec; other
    /// volumes get none.
    #[test]
    fn a_pods_generic_ephemeral_volume_gets_its_claim() {
        let pod = json!({
            "metadata": {"name": "web", "uid": "pod-uid"},
            "spec": {"volumes": [
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"accessModes": ["ReadWriteOnce"]}}}},
                {"name": "cfg", "configMap": {"name": "c"}},
            ]},
        });
        assert_eq!(
            ephemeral_claims(&pod),
            vec![json!({
                "metadata": {"name": "web-scratch", "labels": {"app": "web"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web",
                        "uid": "pod-uid", "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"accessModes": ["ReadWriteOnce"]},
            })]
        );
    }
}
