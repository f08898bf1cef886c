//! The ServiceAccount admission plugin that kube-apiserver runs on every pod it creates
//! (plugin/pkg/admission/serviceaccount/admission.go), with the v1 conversion of the
//! deprecated `spec.serviceAccount` alias:
//!
//! - `spec.serviceAccountName` defaults to `default` (an empty one takes the deprecated
//!   `spec.serviceAccount` first, as the v1 conversion does), and `spec.serviceAccount`
//!   is written back with the same name;
//! - that ServiceAccount must exist in the pod's namespace, or the pod is refused (403);
//! - unless the pod's `automountServiceAccountToken`, or else the ServiceAccount's, is
//!   false: every init container and container without a mount at
//!   [`API_TOKEN_MOUNT_PATH`] gets a read-only one of the projected volume
//!   `kube-api-access-<5 random characters>` (token, the namespace's `kube-root-ca.crt`,
//!   the namespace), which is added when some container needed it and the pod has no
//!   `kube-api-access-` volume yet; ephemeral containers are left alone;
//! - a pod naming no image pull secrets gets the ServiceAccount's.
//!
//! Mirror pods (annotation `kubernetes.io/config.mirror`) are left as they are, as
//! upstream leaves them; upstream also refuses a mirror pod that names a service account,
//! a secret or a service-account token projection, which this server does not.
//! Not done either: the `kubernetes.io/enforce-mountable-secrets` check.

use crate::apiserver_controllers::{DEFAULT_SERVICE_ACCOUNT, ROOT_CA_CONFIG_MAP};
use crate::apiserver_serviceaccount::WARN_ONLY_EXPIRATION_SECONDS;
use serde_json::{Value, json};

/// Where the token volume is mounted (upstream's `DefaultAPITokenMountPath`).
pub const API_TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The name prefix of the token volume (upstream's `ServiceAccountVolumeName` + "-").
pub const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";
/// The annotation that marks a mirror pod (upstream's `MirrorPodAnnotationKey`).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// `ProjectedVolumeSourceDefaultMode`, 0644.
const PROJECTED_DEFAULT_MODE: i64 = 0o644;

/// Admits the pod `pod` (its JSON, as sent) created in `namespace`, where
/// `service_account(name)` is the namespace's ServiceAccount of that name, if any.
/// Err: why the pod is forbidden (the text after `pods "<name>" is forbidden: `).
pub(crate) fn admit_pod(
    pod: &mut Value,
    namespace: &str,
    service_account: impl Fn(&str) -> Option<Value>,
) -> Result<(), String> {
    admit_pod_with(pod, namespace, service_account, token_volume_name)
}

fn admit_pod_with(
    pod: &mut Value,
    namespace: &str,
    service_account: impl Fn(&str) -> Option<Value>,
    volume_name: impl FnOnce() -> String,
) -> Result<(), String> {
    if !pod.is_object() {
        return Ok(());
    }
    let mirror = pod["metadata"]["annotations"]
        .get(MIRROR_POD_ANNOTATION)
        .is_some();
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    let spec = &mut pod["spec"];
    // The v1 conversion: the deprecated alias stands in for an empty name.
    let named = |field: &str| {
        spec[field]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(String::from)
    };
    let alias = named("serviceAccountName").or_else(|| named("serviceAccount"));
    if mirror {
        if let Some(name) = alias {
            set_service_account(spec, &name);
        }
        return Ok(());
    }
    let name = alias.unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.to_string());
    set_service_account(spec, &name);
    let sa = service_account(&name).ok_or_else(|| {
        format!(
            "error looking up service account {namespace}/{name}: serviceaccount {name:?} not found"
        )
    })?;
    if should_automount(&sa, spec) {
        mount_token(spec, volume_name);
    }
    let has_pull_secrets = spec["imagePullSecrets"]
        .as_array()
        .is_some_and(|s| !s.is_empty());
    if !has_pull_secrets && let Some(secrets) = sa["imagePullSecrets"].as_array() {
        let names: Vec<Value> = secrets
            .iter()
            .map(|s| json!({"name": s["name"].as_str().unwrap_or_default()}))
            .collect();
        if !names.is_empty() {
            spec["imagePullSecrets"] = names.into();
        }
    }
    Ok(())
}

/// `serviceAccountName` and the deprecated `serviceAccount` the v1 conversion writes.
fn set_service_account(spec: &mut Value, name: &str) {
    spec["serviceAccountName"] = name.into();
    spec["serviceAccount"] = name.into();
}

/// The pod's choice wins, then the ServiceAccount's; true when neither says.
fn should_automount(sa: &Value, spec: &Value) -> bool {
    spec["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| sa["automountServiceAccountToken"].as_bool())
        .unwrap_or(true)
}

/// Upstream's `mountServiceAccountToken`.
fn mount_token(spec: &mut Value, volume_name: impl FnOnce() -> String) {
    let existing = spec["volumes"].as_array().and_then(|volumes| {
        volumes
            .iter()
            .filter_map(|v| v["name"].as_str())
            .find(|n| n.starts_with(TOKEN_VOLUME_PREFIX))
            .map(String::from)
    });
    let has_volume = existing.is_some();
    let name = existing.unwrap_or_else(volume_name);
    let mount = json!({"name": name, "readOnly": true, "mountPath": API_TOKEN_MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec[list].as_array_mut() else {
            continue;
        };
        for c in containers.iter_mut().filter(|c| c.is_object()) {
            let mounted = c["volumeMounts"]
                .as_array()
                .is_some_and(|ms| ms.iter().any(|m| m["mountPath"] == API_TOKEN_MOUNT_PATH));
            if mounted {
                continue;
            }
            if !c["volumeMounts"].is_array() {
                c["volumeMounts"] = json!([]);
            }
            if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                mounts.push(mount.clone());
            }
            needed = true;
        }
    }
    if needed && !has_volume {
        if !spec["volumes"].is_array() {
            spec["volumes"] = json!([]);
        }
        if let Some(volumes) = spec["volumes"].as_array_mut() {
            volumes.push(json!({"name": name, "projected": token_volume_source()}));
        }
    }
}

/// Upstream's `TokenVolumeSource()`.
fn token_volume_source() -> Value {
    json!({
        "defaultMode": PROJECTED_DEFAULT_MODE,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": WARN_ONLY_EXPIRATION_SECONDS, "path": "token"}},
            {"configMap": {"name": ROOT_CA_CONFIG_MAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [
                {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
            ]}},
        ],
    })
}

/// `kube-api-access-` and five random characters of upstream's name generator
/// (`utilrand.String`: lowercase consonants and digits, no look-alikes).
fn token_volume_name() -> String {
    use ring::rand::SecureRandom;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let rng = ring::rand::SystemRandom::new();
    let mut suffix = String::with_capacity(5);
    while suffix.len() < 5 {
        let mut b = [0u8; 1];
        rng.fill(&mut b).expect("the system's random source");
        // Rejection keeps the choice uniform: 243 = 9 × 27.
        if b[0] < 243 {
            suffix.push(ALPHABET[b[0] as usize % ALPHABET.len()] as char);
        }
    }
    format!("{TOKEN_VOLUME_PREFIX}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accounts(name: &str) -> Option<Value> {
        match name {
            "default" => Some(json!({"metadata": {"name": "default"}})),
            "quiet" => {
                Some(json!({"metadata": {"name": "quiet"}, "automountServiceAccountToken": false}))
            }
            "puller" => Some(json!({"metadata": {"name": "puller"},
                "imagePullSecrets": [{"name": "registry"}]})),
            _ => None,
        }
    }

    fn admit(pod: &mut Value) -> Result<(), String> {
        admit_pod_with(pod, "ns", accounts, || "kube-api-access-abcde".to_string())
    }

    fn token_mount() -> Value {
        json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": API_TOKEN_MOUNT_PATH})
    }

    #[test]
    fn init_and_app_containers_mount_the_token_but_ephemeral_ones_and_existing_mounts_do_not() {
        let own = json!({"name": "own", "mountPath": API_TOKEN_MOUNT_PATH});
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "i"}],
            "containers": [
                {"name": "a", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "b", "volumeMounts": [own]},
            ],
            "ephemeralContainers": [{"name": "debug"}],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "own", "emptyDir": {}}],
        }});
        admit(&mut pod).unwrap();
        let spec = &pod["spec"];
        assert_eq!(spec["serviceAccountName"], "default");
        assert_eq!(spec["serviceAccount"], "default");
        assert_eq!(
            spec["initContainers"][0]["volumeMounts"],
            json!([token_mount()])
        );
        assert_eq!(
            spec["containers"][0]["volumeMounts"],
            json!([{"name": "data", "mountPath": "/data"}, token_mount()])
        );
        assert_eq!(spec["containers"][1]["volumeMounts"], json!([own]));
        assert!(spec["ephemeralContainers"][0].get("volumeMounts").is_none());
        let volumes = spec["volumes"].as_array().unwrap();
        assert_eq!(volumes.len(), 3);
        assert_eq!(volumes[2]["name"], "kube-api-access-abcde");
        assert_eq!(volumes[2]["projected"], token_volume_source());
        assert!(spec.get("imagePullSecrets").is_none());
    }

    #[test]
    fn no_volume_when_every_container_has_its_own_mount_and_an_existing_one_is_reused() {
        let own = json!({"name": "own", "mountPath": API_TOKEN_MOUNT_PATH});
        let mut pod = json!({"spec": {"containers": [{"name": "a", "volumeMounts": [own]}]}});
        admit(&mut pod).unwrap();
        assert!(pod["spec"].get("volumes").is_none(), "{pod}");

        let mut pod = json!({"spec": {"containers": [{"name": "a"}],
            "volumes": [{"name": "kube-api-access-zzzzz", "emptyDir": {}}]}});
        admit(&mut pod).unwrap();
        assert_eq!(pod["spec"]["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"][0]["name"],
            "kube-api-access-zzzzz"
        );
    }

    #[test]
    fn automount_follows_the_pod_then_the_service_account() {
        let mounted = |spec: Value| {
            let mut pod = json!({"spec": spec});
            admit(&mut pod).unwrap();
            pod["spec"].get("volumes").is_some()
        };
        let c = json!([{"name": "c"}]);
        assert!(mounted(json!({"containers": c})));
        assert!(!mounted(
            json!({"containers": c, "automountServiceAccountToken": false})
        ));
        assert!(!mounted(
            json!({"containers": c, "serviceAccountName": "quiet"})
        ));
        assert!(mounted(
            json!({"containers": c, "serviceAccountName": "quiet", "automountServiceAccountToken": true})
        ));
    }

    #[test]
    fn the_alias_names_the_account_and_a_missing_one_is_refused() {
        let mut pod = json!({"spec": {"serviceAccount": "puller", "containers": [{"name": "c"}]}});
        admit(&mut pod).unwrap();
        assert_eq!(pod["spec"]["serviceAccountName"], "puller");
        assert_eq!(
            pod["spec"]["imagePullSecrets"],
            json!([{"name": "registry"}])
        );
        let mut mine = json!({"spec": {"serviceAccountName": "puller", "imagePullSecrets": [{"name": "mine"}]}});
        admit(&mut mine).unwrap();
        assert_eq!(mine["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));

        let mut pod = json!({"spec": {"serviceAccountName": "builder"}});
        assert_eq!(
            admit(&mut pod).unwrap_err(),
            "error looking up service account ns/builder: serviceaccount \"builder\" not found"
        );
    }

    #[test]
    fn mirror_pods_are_left_alone() {
        let sent = json!({"metadata": {"annotations": {MIRROR_POD_ANNOTATION: "h"}},
            "spec": {"containers": [{"name": "c"}]}});
        let mut pod = sent.clone();
        admit(&mut pod).unwrap();
        assert_eq!(pod, sent);
        // Even one naming an account that does not exist (upstream refuses it).
        let mut named = json!({"metadata": {"annotations": {MIRROR_POD_ANNOTATION: "h"}},
            "spec": {"serviceAccountName": "builder", "containers": [{"name": "c"}]}});
        admit(&mut named).unwrap();
        assert!(named["spec"].get("volumes").is_none());
    }

    #[test]
    fn volume_names_are_random_and_of_upstreams_alphabet() {
        let a = token_volume_name();
        let b = token_volume_name();
        assert_ne!(a, b);
        let suffix = a.strip_prefix(TOKEN_VOLUME_PREFIX).unwrap();
        assert_eq!(suffix.len(), 5, "{a}");
        assert!(
            suffix
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
            "{a}"
        );
    }
}
