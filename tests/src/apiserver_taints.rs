//! NoExecute taints, as the control plane acts on them for a cluster of nodes:
//!
//! - **DefaultTolerationSeconds** admission (plugin/pkg/admission/defaulttolerationseconds):
//!   a pod created without a NoExecute toleration for `node.kubernetes.io/not-ready`, or for
//!   `node.kubernetes.io/unreachable`, gets one (`operator: Exists`, `tolerationSeconds:
//!   300`), so that a pod outlives a node's short absence and goes five minutes after it.
//! - the **taint eviction controller** (pkg/controller/tainteviction, `processPodOnNode`):
//!   a pod bound to a node with a NoExecute taint it does not tolerate is deleted at once;
//!   one that tolerates every such taint, the least `tolerationSeconds` among the
//!   tolerations used after this controller first saw it so (forever without any). A
//!   deleted pod gets the `DisruptionTarget` condition (reason `DeletionByTaintManager`,
//!   "Taint manager: deleting due to NoExecute taint"), a graceful deletion with its own
//!   grace period (its kubelet, if it is reachable, completes it) and the event
//!   `TaintManagerEviction` "Marking for deletion Pod ns/name"; a planned deletion whose
//!   taints went away is cancelled ("Cancelling deletion of Pod ns/name").
//!
//! Decisions are pure functions (tested below); `evict` applies them every period.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// Upstream's `--default-not-ready-toleration-seconds` and
/// `--default-unreachable-toleration-seconds`.
pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;
/// The controller's name in its events (since Kubernetes 1.29).
const COMPONENT: &str = "taint-eviction-controller";

/// Upstream's `ToleratesTaint`: whether toleration `t` tolerates `taint`.
pub fn tolerates_taint(t: &Value, taint: &Value) -> bool {
    let effect_ok =
        t["effect"].as_str().is_none_or(|e| e.is_empty()) || t["effect"] == taint["effect"];
    let key = t["key"].as_str().unwrap_or_default();
    let exists = t["operator"] == "Exists";
    let key_ok = (exists && key.is_empty()) || key == taint["key"].as_str().unwrap_or("");
    let value_ok =
        exists || t["value"].as_str().unwrap_or("") == taint["value"].as_str().unwrap_or("");
    effect_ok && key_ok && value_ok
}

/// Whether `pod` has a toleration for `taint`.
pub fn tolerates(pod: &Value, taint: &Value) -> bool {
    tolerations(pod).iter().any(|t| tolerates_taint(t, taint))
}

fn tolerations(pod: &Value) -> Vec<Value> {
    pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// DefaultTolerationSeconds admission on a pod being created.
pub fn default_toleration_seconds(pod: &mut Value) {
    let all = tolerations(pod);
    // Upstream: a toleration with this key, or with no key, and effect NoExecute or none.
    let tolerated = |key: &str| {
        all.iter().any(|t| {
            let k = t["key"].as_str().unwrap_or_default();
            let e = t["effect"].as_str().unwrap_or_default();
            (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
        })
    };
    let mut added = all.clone();
    for key in [NOT_READY_TAINT, UNREACHABLE_TAINT] {
        if !tolerated(key) {
            added.push(
                json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS}),
            );
        }
    }
    if added.len() != all.len() {
        pod["spec"]["tolerations"] = added.into();
    }
}

/// What the taint eviction controller does with a pod on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// No NoExecute taint, or tolerated forever: nothing (a planned deletion is cancelled).
    Keep,
    /// A NoExecute taint it does not tolerate: deleted now.
    Now,
    /// Every NoExecute taint tolerated, the least for this long.
    After(Duration),
}

/// Upstream's `processPodOnNode` for `pod` on `node`.
pub fn eviction(pod: &Value, node: &Value) -> Eviction {
    let taints: Vec<&Value> = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["effect"] == "NoExecute")
        .collect();
    if taints.is_empty() {
        return Eviction::Keep;
    }
    let all = tolerations(pod);
    let mut used: Vec<&Value> = Vec::new();
    for taint in taints {
        match all.iter().find(|t| tolerates_taint(t, taint)) {
            Some(t) => used.push(t),
            None => return Eviction::Now,
        }
    }
    // Upstream's getMinTolerationTime: the least tolerationSeconds (0 or less: now);
    // none set: forever.
    let mut least: Option<i64> = None;
    for t in used {
        if let Some(s) = t["tolerationSeconds"].as_i64() {
            if s <= 0 {
                return Eviction::Now;
            }
            least = Some(least.map_or(s, |l| l.min(s)));
        }
    }
    match least {
        None => Eviction::Keep,
        Some(s) => Eviction::After(Duration::from_secs(s as u64)),
    }
}

/// The controller's memory: pod (namespace/name/uid) -> when its deletion was planned.
#[derive(Default)]
pub struct Planned(HashMap<String, Instant>);

/// One pass of the controller over every bound, live pod.
pub(crate) fn evict(state: &crate::apiserver::ApiState, planned: &mut Planned) {
    let nodes: HashMap<String, Value> = state
        .objects("nodes")
        .into_iter()
        .filter_map(|n| Some((n["metadata"]["name"].as_str()?.to_string(), n)))
        .collect();
    let now = crate::apiserver::now();
    let mut seen = Vec::new();
    for pod in state.objects("pods") {
        let meta = &pod["metadata"];
        let (ns, name) = (
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
        );
        let id = format!("{ns}/{name}/{}", meta["uid"].as_str().unwrap_or_default());
        let Some(node) = pod["spec"]["nodeName"].as_str().and_then(|n| nodes.get(n)) else {
            continue;
        };
        if !meta["deletionTimestamp"].is_null()
            || matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            )
        {
            continue;
        }
        seen.push(id.clone());
        let due = match eviction(&pod, node) {
            Eviction::Keep => {
                if planned.0.remove(&id).is_some() {
                    event(
                        state,
                        &pod,
                        &format!("Cancelling deletion of Pod {ns}/{name}"),
                        &now,
                    );
                }
                continue;
            }
            Eviction::Now => true,
            Eviction::After(wait) => {
                planned
                    .0
                    .entry(id.clone())
                    .or_insert_with(Instant::now)
                    .elapsed()
                    >= wait
            }
        };
        if !due {
            continue;
        }
        planned.0.remove(&id);
        let grace = pod["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30);
        let deleted = state.modify("pods", ns, name, |p| {
            let mut conditions: Vec<Value> = p["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            conditions.retain(|c| c["type"] != "DisruptionTarget");
            conditions.push(json!({"type": "DisruptionTarget", "status": "True",
                "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint",
                "lastTransitionTime": now}));
            p["status"]["conditions"] = conditions.into();
            p["metadata"]["deletionTimestamp"] = now.clone().into();
            p["metadata"]["deletionGracePeriodSeconds"] = grace.into();
        });
        if deleted.is_some() {
            eprintln!("nodeagent-test-apiserver: NoExecute taint: deleting pod {ns}/{name}");
            event(
                state,
                &pod,
                &format!("Marking for deletion Pod {ns}/{name}"),
                &now,
            );
        }
    }
    planned.0.retain(|id, _| seen.contains(id));
}

fn event(state: &crate::apiserver::ApiState, pod: &Value, message: &str, now: &str) {
    crate::apiserver_nodes::event(
        state,
        pod,
        COMPONENT,
        ("Normal", "TaintManagerEviction", message),
        now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(tolerations: Value) -> Value {
        json!({"spec": {"tolerations": tolerations}})
    }

    fn node(taints: Value) -> Value {
        json!({"spec": {"taints": taints}})
    }

    fn unreachable() -> Value {
        json!([{"key": UNREACHABLE_TAINT, "effect": "NoSchedule"},
               {"key": UNREACHABLE_TAINT, "effect": "NoExecute"}])
    }

    /// Upstream's plugin/pkg/admission/defaulttolerationseconds/admission_test.go table,
    /// its cases by their descriptions (the three about the `node.alpha.kubernetes.io`
    /// keys, removed upstream long ago, are left out).
    #[test]
    fn default_toleration_seconds_as_upstream() {
        let both = json!([
            {"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ]);
        // (description, tolerations in, tolerations out)
        let rows = [
            (
                "pod has no tolerations, expect add tolerations for `not-ready:NoExecute` and `unreachable:NoExecute`",
                json!(null),
                both.clone(),
            ),
            (
                "pod has tolerations, but none is for taint `not-ready:NoExecute` or `unreachable:NoExecute`, expect add tolerations for `not-ready:NoExecute` and `unreachable:NoExecute`",
                json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule", "tolerationSeconds": 700}]),
                json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule", "tolerationSeconds": 700},
                       both[0], both[1]]),
            ),
            (
                "pod specified a toleration for taint `not-ready:NoExecute`, expect add toleration for `unreachable:NoExecute`",
                json!([{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700}]),
                json!([{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700},
                       both[1]]),
            ),
            (
                "pod specified a toleration for taint `unreachable:NoExecute`, expect add toleration for `not-ready:NoExecute`",
                json!([{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700}]),
                json!([{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700},
                       both[0]]),
            ),
            (
                "pod specified tolerations for both `not-ready:NoExecute` and `unreachable:NoExecute`, expect no change",
                json!([{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700},
                       {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700}]),
                json!([{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700},
                       {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 700}]),
            ),
            (
                "pod specified toleration for taint `unreachable`, expect add toleration for `not-ready:NoExecute`",
                json!([{"key": UNREACHABLE_TAINT, "operator": "Exists", "tolerationSeconds": 700}]),
                json!([{"key": UNREACHABLE_TAINT, "operator": "Exists", "tolerationSeconds": 700}, both[0]]),
            ),
            (
                "pod has wildcard toleration for all kind of taints, expect no change",
                json!([{"operator": "Exists", "tolerationSeconds": 700}]),
                json!([{"operator": "Exists", "tolerationSeconds": 700}]),
            ),
        ];
        for (what, tolerations, want) in rows {
            let mut p = json!({"spec": {}});
            if !tolerations.is_null() {
                p["spec"]["tolerations"] = tolerations;
            }
            default_toleration_seconds(&mut p);
            assert_eq!(p["spec"]["tolerations"], want, "{what}");
        }
    }

    /// `processPodOnNode`'s cases, as upstream's taint_eviction_test.go
    /// (`TestCreatePod`, `TestUpdateNodeWithMultipleTaints`, `TestGetMinTolerationTime`).
    #[test]
    fn eviction_as_the_taint_eviction_controller() {
        let secs = |s: u64| Eviction::After(Duration::from_secs(s));
        // No NoExecute taint: nothing, whatever the tolerations.
        assert_eq!(
            eviction(&pod(json!(null)), &node(json!(null))),
            Eviction::Keep
        );
        assert_eq!(
            eviction(
                &pod(json!(null)),
                &node(json!([{"key": "a", "effect": "NoSchedule"}]))
            ),
            Eviction::Keep
        );
        // Not tolerated: now.
        assert_eq!(
            eviction(&pod(json!(null)), &node(unreachable())),
            Eviction::Now
        );
        // Tolerated with the defaults: after 300 s.
        let mut p = json!({"spec": {}});
        default_toleration_seconds(&mut p);
        assert_eq!(eviction(&p, &node(unreachable())), secs(300));
        // Tolerated without tolerationSeconds: forever.
        let forever = pod(json!([{"key": UNREACHABLE_TAINT, "operator": "Exists"}]));
        assert_eq!(eviction(&forever, &node(unreachable())), Eviction::Keep);
        // Two taints, both tolerated: the least; one not: now.
        let two = node(json!([{"key": "a", "value": "1", "effect": "NoExecute"},
                               {"key": "b", "value": "1", "effect": "NoExecute"}]));
        let both = pod(json!([
            {"key": "a", "operator": "Equal", "value": "1", "effect": "NoExecute", "tolerationSeconds": 20},
            {"key": "b", "operator": "Exists", "tolerationSeconds": 5}]));
        assert_eq!(eviction(&both, &two), secs(5));
        let one =
            pod(json!([{"key": "a", "operator": "Equal", "value": "1", "tolerationSeconds": 20}]));
        assert_eq!(eviction(&one, &two), Eviction::Now);
        // A value that differs is not tolerated under Equal.
        let other = pod(json!([{"key": "a", "operator": "Equal", "value": "2"},
                                {"key": "b", "operator": "Exists"}]));
        assert_eq!(eviction(&other, &two), Eviction::Now);
        // tolerationSeconds 0 or negative: now (getMinTolerationTime).
        let zero = pod(json!([{"operator": "Exists", "tolerationSeconds": 0}]));
        assert_eq!(eviction(&zero, &node(unreachable())), Eviction::Now);
        // One used toleration with seconds and one without: the seconds.
        let mixed = pod(json!([{"key": "a", "operator": "Exists"},
                                {"key": "b", "operator": "Exists", "tolerationSeconds": 7}]));
        assert_eq!(eviction(&mixed, &two), secs(7));
    }
}
