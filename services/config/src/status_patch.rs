//! The status patch upstream sends for a pod (its status manager's
//! `statusutil.PatchPodStatus`) and for the Node (`nodeutil.PatchNodeStatus`): a two-way
//! strategic merge patch from the status the API server has to the new one. Only
//! what changed is sent: maps name the keys that changed (a key that went is set to
//! null), the lists the API merges by key (those upstream's types.go tags
//! `patchStrategy:"merge"`: conditions by `type`, pod and host IPs by `ip`, resource claim
//! statuses by `name`) carry only the entries that changed (an entry that went is
//! `{"<key>": …, "$patch": "delete"}`), and every other list, when it changed, is sent
//! whole, since the API server replaces it whole: container statuses (init, regular and
//! ephemeral) and the Node's `volumesAttached` are atomic lists upstream (no patch
//! strategy in types.go; `+listType=atomic` in the OpenAPI schema k8s-openapi is made
//! from), so a patch with only the changed container would leave the pod with only that
//! one. A condition another writer set and this node left alone is never in the patch,
//! and cannot be overwritten.

use serde_json::{Map, Value};

/// The merge key of a status list the API server merges (the rest are replaced): the
/// `patchMergeKey` of PodStatus's and NodeStatus's lists tagged `patchStrategy:"merge"`
/// in upstream's types.go (NodeStatus's `addresses` is handled apart, see `diff_value`).
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "podIPs" | "hostIPs" => Some("ip"),
        "resourceClaimStatuses" => Some("name"),
        _ => None,
    }
}

/// The patch from `old` to `new` (two JSON objects); an empty object when they are equal.
pub fn two_way(old: &Value, new: &Value) -> Value {
    let empty = Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    Value::Object(diff_map(old, new))
}

fn diff_map(old: &Map<String, Value>, new: &Map<String, Value>) -> Map<String, Value> {
    let mut patch = Map::new();
    for (k, n) in new {
        match old.get(k) {
            Some(o) if o == n => {}
            Some(o) => {
                if let Some(d) = diff_value(k, o, n) {
                    patch.insert(k.clone(), d);
                }
            }
            None => {
                patch.insert(k.clone(), n.clone());
            }
        }
    }
    for k in old.keys().filter(|k| !new.contains_key(*k)) {
        patch.insert(k.clone(), Value::Null);
    }
    patch
}

/// The patch of one changed value; None when nothing is left to send.
fn diff_value(field: &str, old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => Some(Value::Object(diff_map(o, n))),
        // NodeStatus.Addresses is annotated `patchMergeKey=type`, yet a node has two
        // InternalIPs when dual-stack: upstream sends the whole new list with a
        // `{"$patch": "replace"}` item when it changed
        // (`fixupPatchForNodeStatusAddresses` in pkg/util/node/node.go).
        (Value::Array(_), Value::Array(n)) if field == "addresses" => {
            let mut items = n.clone();
            items.push(serde_json::json!({"$patch": "replace"}));
            Some(Value::Array(items))
        }
        (Value::Array(o), Value::Array(n)) => match merge_key(field) {
            Some(key) => diff_list(key, o, n),
            None => Some(new.clone()),
        },
        _ => Some(new.clone()),
    }
}

fn diff_list(key: &str, old: &[Value], new: &[Value]) -> Option<Value> {
    let mut items = Vec::new();
    for n in new {
        let id = &n[key];
        match old.iter().find(|o| &o[key] == id) {
            Some(o) if o == n => {}
            Some(Value::Object(o)) => {
                let mut d = diff_map(o, n.as_object()?);
                d.insert(key.to_string(), id.clone());
                items.push(Value::Object(d));
            }
            _ => items.push(n.clone()),
        }
    }
    for o in old {
        let id = &o[key];
        if !new.iter().any(|n| &n[key] == id) {
            items.push(serde_json::json!({ key: id, "$patch": "delete" }));
        }
    }
    (!items.is_empty()).then_some(Value::Array(items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Node's status: a condition and an address another writer set (node-problem-
    /// detector's, a cloud controller's) are not in the patch; changed addresses go whole,
    /// with upstream's replace directive.
    #[test]
    fn a_node_status_patch_leaves_other_writers_alone() {
        let old = json!({
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "t1"},
                {"type": "KernelDeadlock", "status": "False"},
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        });
        let new = json!({
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "t2"},
                {"type": "KernelDeadlock", "status": "False"},
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        });
        assert_eq!(
            two_way(&old, &new),
            json!({"conditions": [{"type": "Ready", "lastHeartbeatTime": "t2"}]})
        );
        let moved = json!({
            "conditions": old["conditions"],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.2"},
                {"type": "InternalIP", "address": "fd00::2"},
            ],
        });
        assert_eq!(
            two_way(&old, &moved),
            json!({"addresses": [
                {"type": "InternalIP", "address": "10.0.0.2"},
                {"type": "InternalIP", "address": "fd00::2"},
                {"$patch": "replace"},
            ]})
        );
    }

    #[test]
    fn only_what_changed_and_what_went_is_sent() {
        let old = json!({
            "phase": "Running",
            "podIPs": [{"ip": "10.0.0.1"}],
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "example.com/gate", "status": "True"}
            ],
            "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "t1"}}}]
        });
        let new = json!({
            "phase": "Running",
            "podIPs": [{"ip": "10.0.0.2"}],
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                {"type": "example.com/gate", "status": "True"}
            ],
            "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1}}}]
        });
        assert_eq!(
            two_way(&old, &new),
            json!({
                "podIPs": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.1", "$patch": "delete"}],
                "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
                "containerStatuses": new["containerStatuses"]
            })
        );
        assert_eq!(two_way(&new, &new), json!({}));
        // From nothing: everything.
        assert_eq!(two_way(&Value::Null, &new), new);
    }

    /// One container of two changed: the whole list goes, both containers in it, as
    /// upstream's `CreateTwoWayMergePatch` sends a list without a patch strategy
    /// (types.go's `ContainerStatuses`, `InitContainerStatuses`,
    /// `EphemeralContainerStatuses`; k8s-openapi's `list::atomic` for them), because the
    /// API server replaces such a list with what the patch holds: a patch with only `b`
    /// would leave the pod without `a`'s status.
    #[test]
    fn a_changed_container_status_list_is_sent_whole() {
        for field in [
            "containerStatuses",
            "initContainerStatuses",
            "ephemeralContainerStatuses",
        ] {
            let a = json!({"name": "a", "ready": true, "image": "busybox:1.36",
                "state": {"running": {"startedAt": "t1"}}});
            let old = json!({field: [a.clone(), {"name": "b", "ready": false,
                "image": "busybox:1.36", "state": {"running": {"startedAt": "t1"}}}]});
            let new = json!({field: [a, {"name": "b", "ready": true,
                "image": "busybox:1.36", "state": {"running": {"startedAt": "t1"}}}]});
            assert_eq!(two_way(&old, &new), json!({field: new[field]}), "{field}");
            assert_eq!(two_way(&new, &new), json!({}), "{field}");
        }
        // The Node's volumesAttached (atomic too), were it ever sent.
        let old = json!({"volumesAttached": [{"name": "v1", "devicePath": ""}]});
        let new = json!({"volumesAttached": [{"name": "v1", "devicePath": ""},
                                             {"name": "v2", "devicePath": ""}]});
        assert_eq!(two_way(&old, &new), new);
    }

    /// A claim status the DRA controller wrote and the kubelet left alone: merged by
    /// `name` (types.go's `patchMergeKey:"name"`), so only what changed goes.
    #[test]
    fn resource_claim_statuses_merge_by_name() {
        let old = json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"},
                                                   {"name": "nic", "resourceClaimName": "p-nic"}]});
        let new = json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"},
                                                   {"name": "nic", "resourceClaimName": "p-nic2"}]});
        assert_eq!(
            two_way(&old, &new),
            json!({"resourceClaimStatuses": [{"name": "nic", "resourceClaimName": "p-nic2"}]})
        );
    }
}
