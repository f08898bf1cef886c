//! Reading one pod manifest: decode (YAML or JSON), apply the defaults the upstream
//! kubelet applies to static pods, and validate what matters on a node.

use crate::validation::validate_pod;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use nodeagent_proto::k8s::labels;
use sha2::{Digest, Sha256};

/// Largest manifest we read; anything bigger is refused rather than parsed.
pub const MAX_MANIFEST_BYTES: usize = 10 << 20;

/// Where a static pod came from: decides its UID hash and its config.source annotation.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    File(&'a str),
    Url(&'a str),
}

impl Origin<'_> {
    pub fn source_name(&self) -> &'static str {
        match self {
            Origin::File(_) => "file",
            Origin::Url(_) => "http",
        }
    }
}

/// Decodes a body holding one Pod or a PodList (the HTTP source accepts both).
pub fn decode_pods(data: &[u8]) -> Result<Vec<Pod>, String> {
    let value = decode_value(data)?;
    if value.get("kind").and_then(|k| k.as_str()) == Some("PodList") {
        let items = value
            .get("items")
            .and_then(|i| i.as_array())
            .cloned()
            .unwrap_or_default();
        return items
            .into_iter()
            .enumerate()
            .map(|(i, mut item)| {
                // Indexing a non-object `Value` to insert a key panics: check first.
                let Some(fields) = item.as_object_mut() else {
                    return Err(format!("items[{i}]: the item is not a mapping"));
                };
                fields.insert("apiVersion".into(), "v1".into());
                fields.insert("kind".into(), "Pod".into());
                pod_from_value(item).map_err(|e| format!("items[{i}]: {e}"))
            })
            .collect();
    }
    pod_from_value(value).map(|p| vec![p])
}

/// Decodes one manifest holding a single Pod.
pub fn decode_pod(data: &[u8]) -> Result<Pod, String> {
    pod_from_value(decode_value(data)?)
}

fn decode_value(data: &[u8]) -> Result<serde_json::Value, String> {
    if data.is_empty() {
        return Err("the file is empty".into());
    }
    if data.len() > MAX_MANIFEST_BYTES {
        return Err(format!(
            "the manifest is {} bytes; the limit is {MAX_MANIFEST_BYTES}",
            data.len()
        ));
    }
    let text = std::str::from_utf8(data).map_err(|e| format!("not UTF-8 text: {e}"))?;
    let value: serde_json::Value = serde_saphyr::from_str(text)
        .map_err(|e| format!("invalid YAML or JSON: {}", first_line(&e)))?;
    if !value.is_object() {
        return Err("the document is not a mapping".into());
    }
    Ok(value)
}

fn pod_from_value(value: serde_json::Value) -> Result<Pod, String> {
    let serde_json::Value::Object(map) = &value else {
        return Err("the document is not a mapping".into());
    };
    let kind = map.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    let api_version = map
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    if kind != "Pod" || api_version != "v1" {
        return Err(format!(
            "want apiVersion \"v1\" and kind \"Pod\", got apiVersion {api_version:?} kind {kind:?}"
        ));
    }
    serde_json::from_value(value).map_err(|e| format!("not a valid v1 Pod: {e}"))
}

/// The parser's first line ("line 3 column 11: unclosed bracket") without its source
/// snippet, so that one problem is one log line.
fn first_line(e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.trim_start_matches("error: ").to_string()
}

/// Applies the static-pod defaults (upstream `config/common.go` `applyDefaults`) and the
/// API defaults a pod read from a file never got from an API server; then validates.
pub fn static_pod(mut pod: Pod, origin: Origin<'_>, node_name: &str) -> Result<Pod, String> {
    let uid = match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        _ => content_uid(&pod, origin, node_name),
    };
    pod.metadata.uid = Some(uid.clone());
    let name = pod.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err("metadata.name: Required value: name or generateName is required".into());
    }
    pod.metadata.name = Some(format!("{name}-{node_name}"));
    if pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        pod.metadata.namespace = Some("default".into());
    }
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(labels::CONFIG_HASH.into(), uid);
    annotations.insert(labels::CONFIG_SOURCE.into(), origin.source_name().into());

    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_string());
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    tolerations.push(Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Default::default()
    });
    apply_api_defaults(&mut pod);
    let status = pod.status.get_or_insert_with(Default::default);
    status.phase = Some("Pending".into());
    validate_pod(&pod)?;
    // A static pod is created by its manifest, and upstream's ValidatePodCreate forbids
    // ephemeral containers there (they are added later, through the API).
    if spec_has_ephemeral(&pod) {
        return Err("spec.ephemeralContainers: Forbidden: cannot be set on create".into());
    }
    Ok(pod)
}

fn spec_has_ephemeral(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_ref())
        .is_some_and(|e| !e.is_empty())
}

/// The defaults the API server would have set (`SetObjectDefaults_Pod`), for the fields
/// the node agent reads.
pub fn apply_api_defaults(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.security_context.get_or_insert_with(Default::default);
    spec.enable_service_links.get_or_insert(true);
    let init = spec.init_containers.iter_mut().flatten();
    for c in spec.containers.iter_mut().chain(init) {
        let image = c.image.clone().unwrap_or_default();
        c.image_pull_policy
            .get_or_insert_with(|| default_pull_policy(&image).into());
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".into());
        c.termination_message_policy
            .get_or_insert_with(|| "File".into());
        for p in c.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".into());
        }
    }
}

/// Upstream: `Always` when the tag is `latest` or absent (and there is no digest).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// UID of a pod that has none: a hash of its content, the node and where it came from.
fn content_uid(pod: &Pod, origin: Origin<'_>, node_name: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(serde_json::to_vec(pod).unwrap_or_default());
    match origin {
        Origin::File(path) => {
            hasher.update(format!("host:{node_name}"));
            hasher.update(format!("file:{path}"));
        }
        Origin::Url(url) => hasher.update(format!("url:{url}")),
    }
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n";

    #[test]
    fn static_defaults_follow_upstream() {
        let pod = static_pod(
            decode_pod(WEB.as_bytes()).unwrap(),
            Origin::File("/m/web.yaml"),
            "node-1",
        )
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[labels::CONFIG_HASH], uid);
        assert_eq!(ann[labels::CONFIG_SOURCE], "file");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn uid_follows_content_node_and_path() {
        let uid = |text: &str, path, node| {
            static_pod(
                decode_pod(text.as_bytes()).unwrap(),
                Origin::File(path),
                node,
            )
            .unwrap()
            .metadata
            .uid
            .unwrap()
        };
        let a = uid(WEB, "/m/a.yaml", "n1");
        assert_eq!(a, uid(WEB, "/m/a.yaml", "n1"));
        assert_ne!(a, uid(WEB, "/m/b.yaml", "n1"));
        assert_ne!(a, uid(WEB, "/m/a.yaml", "n2"));
        assert_ne!(a, uid(&WEB.replace("1.36", "1.37"), "/m/a.yaml", "n1"));
    }

    // upstream: ValidatePodCreate, which the kubelet's file and http sources apply
    // ("spec.ephemeralContainers: Forbidden: cannot be set on create").
    #[test]
    fn a_static_pod_may_not_bring_ephemeral_containers() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: e\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n  ephemeralContainers:\n  - name: debug\n    image: busybox:1.36\n";
        let err = static_pod(
            decode_pod(text.as_bytes()).unwrap(),
            Origin::File("/m/e.yaml"),
            "node-1",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "spec.ephemeralContainers: Forbidden: cannot be set on create"
        );
    }

    #[test]
    fn json_manifests_decode() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}}"#;
        assert!(decode_pod(json.as_bytes()).is_ok());
    }

    #[test]
    fn bad_manifests_say_why() {
        let cases: [(&[u8], &str); 5] = [
            (b"", "empty"),
            (b"a: [b", "invalid YAML"),
            (b"apiVersion: v1\nkind: Service\n", "kind \"Service\""),
            (b"<html><body>hi</body></html>", "mapping"),
            (
                b"apiVersion: v1\nkind: Pod\nspec: 3\n",
                "not a valid v1 Pod",
            ),
        ];
        for (data, want) in cases {
            let err = decode_pod(data).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let huge = vec![b'#'; MAX_MANIFEST_BYTES + 1];
        assert!(decode_pod(&huge).unwrap_err().contains("limit"));
    }

    #[test]
    fn pod_lists_decode_item_by_item() {
        let list = r#"{"kind":"PodList","apiVersion":"v1","items":[
            {"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}},
            {"metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}}]}"#;
        let pods = decode_pods(list.as_bytes()).unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(decode_pods(WEB.as_bytes()).unwrap().len(), 1);
        assert!(decode_pods(b"<html>oops</html>").is_err());
    }

    /// Fuzzing found that a list item which is not a mapping panicked the HTTP source.
    #[test]
    fn a_pod_list_item_that_is_not_a_mapping_is_an_error() {
        for item in ["x", "3", "[a]", "null"] {
            let body = format!("kind: PodList\napiVersion: v1\nitems:\n- {item}\n");
            let err = decode_pods(body.as_bytes()).unwrap_err();
            assert_eq!(err, "items[0]: the item is not a mapping", "{item}");
        }
    }

    #[test]
    fn pull_policy_defaults() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("b@sha256:abc"), "IfNotPresent");
    }
}
