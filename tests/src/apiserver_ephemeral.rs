//! The `pods/ephemeralcontainers` subresource, as kube-apiserver serves it to
//! `kubectl debug`: GET, PUT and PATCH change `spec.ephemeralContainers` and nothing else;
//! ephemeral containers may be added, never changed or removed
//! (`ValidatePodEphemeralContainersUpdate`); a pod may not be created with any
//! (`ValidatePodCreate`), and the main resource never changes them.

use serde_json::Value;

const FIELD: &str = "ephemeralContainers";

/// Upstream's create rule: the error, if `pod` brings ephemeral containers.
pub fn create_error(pod: &Value) -> Option<Vec<String>> {
    let any = pod["spec"][FIELD].as_array().is_some_and(|l| !l.is_empty());
    any.then(|| vec![format!("spec.{FIELD}: Forbidden: cannot be set on create")])
}

/// Upstream's update rule: every ephemeral container `current` has is in `next`, unchanged.
pub fn update_error(current: &Value, next: &Value) -> Option<Vec<String>> {
    let empty = Vec::new();
    let new = next["spec"][FIELD].as_array().unwrap_or(&empty);
    let errors: Vec<String> = current["spec"][FIELD]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|old| {
            let name = old["name"].as_str().unwrap_or_default();
            match new.iter().find(|n| n["name"] == old["name"]) {
                None => Some(format!(
                    "spec.{FIELD}: Forbidden: existing ephemeral containers {name:?} may not be removed"
                )),
                Some(n) if n != old => Some(format!(
                    "spec.{FIELD}: Forbidden: existing ephemeral containers {name:?} may not be changed"
                )),
                Some(_) => None,
            }
        })
        .collect();
    (!errors.is_empty()).then_some(errors)
}

/// What the store keeps: through the subresource, `current` with `incoming`'s ephemeral
/// containers; through the main resource, `incoming` with `current`'s.
pub fn merge(current: &Value, incoming: Value, subresource: bool) -> Value {
    let (mut next, from) = if subresource {
        (current.clone(), &incoming)
    } else {
        (incoming.clone(), current)
    };
    match from["spec"].get(FIELD) {
        Some(list) if next["spec"].is_object() => next["spec"][FIELD] = list.clone(),
        _ => {
            if let Some(spec) = next["spec"].as_object_mut() {
                spec.remove(FIELD);
            }
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ephemeral_containers_are_added_never_changed_or_removed() {
        let pod = json!({"spec": {"containers": [{"name": "app"}],
            "ephemeralContainers": [{"name": "d1", "image": "busybox"}]}});
        let added = json!({"spec": {"containers": [{"name": "app"}],
            "ephemeralContainers": [{"name": "d1", "image": "busybox"}, {"name": "d2", "image": "busybox"}]}});
        assert_eq!(update_error(&pod, &added), None);
        let removed = json!({"spec": {"ephemeralContainers": []}});
        assert_eq!(
            update_error(&pod, &removed).unwrap(),
            [
                r#"spec.ephemeralContainers: Forbidden: existing ephemeral containers "d1" may not be removed"#
            ]
        );
        let changed = json!({"spec": {"ephemeralContainers": [{"name": "d1", "image": "other"}]}});
        assert!(update_error(&pod, &changed).unwrap()[0].contains("may not be changed"));
        assert!(create_error(&pod).is_some());
        assert!(create_error(&json!({"spec": {"containers": []}})).is_none());
    }

    #[test]
    fn only_the_subresource_changes_them_and_it_changes_nothing_else() {
        let current = json!({"spec": {"containers": [{"name": "app"}]}});
        let incoming = json!({"spec": {"containers": [{"name": "other"}],
            "ephemeralContainers": [{"name": "d1"}]}});
        let via_sub = merge(&current, incoming.clone(), true);
        assert_eq!(via_sub["spec"]["containers"][0]["name"], "app");
        assert_eq!(via_sub["spec"]["ephemeralContainers"][0]["name"], "d1");
        let via_main = merge(&current, incoming, false);
        assert_eq!(via_main["spec"]["containers"][0]["name"], "other");
        assert!(via_main["spec"].get("ephemeralContainers").is_none());
    }
}
