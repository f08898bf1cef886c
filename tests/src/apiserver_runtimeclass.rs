//! The RuntimeClass admission plugin kube-apiserver runs on every pod it creates
//! (plugin/pkg/admission/runtimeclass/admission.go), as far as a node can see it:
//!
//! - a pod naming a RuntimeClass that does not exist is refused (403, `pod rejected:
//!   RuntimeClass "<name>" not found`);
//! - the class's `overhead.podFixed` becomes the pod's `spec.overhead`; a pod that brings
//!   a different overhead of its own is refused, and so is one that brings an overhead
//!   its class (or the lack of one) does not define.
//!
//! Not done: the class's `scheduling` (node selector and tolerations), which only a
//! scheduler reads.

use serde_json::Value;

/// Admits `pod` (its JSON, as sent), where `class(name)` is the RuntimeClass of that name.
/// Err: why the pod is forbidden (the text after `pods "<name>" is forbidden: `).
pub(crate) fn admit_pod(
    pod: &mut Value,
    class: impl Fn(&str) -> Option<Value>,
) -> Result<(), String> {
    let spec = &mut pod["spec"];
    let Some(name) = spec["runtimeClassName"].as_str().filter(|n| !n.is_empty()) else {
        if spec.get("overhead").is_some_and(|o| !o.is_null()) {
            return Err(
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
                    .into(),
            );
        }
        return Ok(());
    };
    let rc = class(name).ok_or_else(|| format!("pod rejected: RuntimeClass {name:?} not found"))?;
    let fixed = &rc["overhead"]["podFixed"];
    let own = spec.get("overhead").filter(|o| !o.is_null()).cloned();
    match (fixed.is_object(), own) {
        (true, None) => spec["overhead"] = fixed.clone(),
        (true, Some(own)) if &own == fixed => {}
        (true, Some(_)) => {
            return Err(
                "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into(),
            );
        }
        (false, Some(_)) => {
            return Err(
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
                    .into(),
            );
        }
        (false, None) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn overhead_comes_from_the_class_and_unknown_classes_are_refused() {
        let classes = |name: &str| {
            (name == "kata")
                .then(|| json!({"handler": "kata", "overhead": {"podFixed": {"memory": "64Mi"}}}))
        };
        let mut pod = json!({"spec": {"runtimeClassName": "kata"}});
        admit_pod(&mut pod, classes).unwrap();
        assert_eq!(pod["spec"]["overhead"], json!({"memory": "64Mi"}));
        let mut unknown = json!({"spec": {"runtimeClassName": "gvisor"}});
        assert_eq!(
            admit_pod(&mut unknown, classes).unwrap_err(),
            "pod rejected: RuntimeClass \"gvisor\" not found"
        );
        let mut wrong = json!({"spec": {"runtimeClassName": "kata", "overhead": {"cpu": "1"}}});
        assert!(
            admit_pod(&mut wrong, classes)
                .unwrap_err()
                .contains("doesn't match")
        );
        let mut plain = json!({"spec": {"overhead": {"cpu": "1"}}});
        assert!(
            admit_pod(&mut plain, classes)
                .unwrap_err()
                .contains("without corresponding")
        );
        let mut none = json!({"spec": {}});
        admit_pod(&mut none, classes).unwrap();
    }
}
