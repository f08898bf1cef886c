//! The `pods/resize` subresource, as kube-apiserver serves it for in-place resize
//! (`kubectl patch --subresource resize`): upstream's `ResizeStrategy` keeps of the
//! incoming pod only its containers' and init containers' `resources` and
//! `resizePolicy` (`dropNonResizeUpdates`), then `ValidatePodResize` refuses, in its
//! words, a pod with pod-level resources, a mirror (static) pod, a change of QoS class, a
//! removed request or limit, a change of anything but cpu and memory, a change to a
//! non-sidecar init container and renamed or reordered containers. A spec change bumps
//! `metadata.generation` (`updatePodGeneration`).

use serde_json::Value;

const MIRROR: &str = "kubernetes.io/config.mirror";

fn containers<'a>(pod: &'a Value, list: &str) -> &'a [Value] {
    pod["spec"][list].as_array().map_or(&[], |l| l.as_slice())
}

fn is_sidecar(c: &Value) -> bool {
    c["restartPolicy"] == "Always"
}

/// What the store keeps through the subresource: `current`, with each container's
/// resources and resize policy from `incoming` where the containers are the same ones in
/// the same order (otherwise `incoming` as is, for the validation to refuse).
pub fn merge(current: &Value, incoming: Value) -> Value {
    let names = |p: &Value, list: &str| -> Vec<Value> {
        containers(p, list)
            .iter()
            .map(|c| c["name"].clone())
            .collect()
    };
    for list in ["containers", "initContainers"] {
        if names(current, list) != names(&incoming, list) {
            return incoming;
        }
    }
    let mut next = current.clone();
    for list in ["containers", "initContainers"] {
        let from = containers(&incoming, list).to_vec();
        // `get_mut`, not indexing: an index would add the list as null.
        if let Some(to) = next["spec"].get_mut(list).and_then(Value::as_array_mut) {
            for (c, new) in to.iter_mut().zip(from) {
                for field in ["resources", "resizePolicy"] {
                    match new.get(field) {
                        Some(v) => c[field] = v.clone(),
                        None => {
                            if let Some(o) = c.as_object_mut() {
                                o.remove(field);
                            }
                        }
                    }
                }
            }
        }
    }
    if next["spec"] != current["spec"] {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
        next["metadata"]["generation"] = (generation + 1).into();
    }
    next
}

/// upstream's `ComputePodQOS` over a pod's JSON (init containers count; requests default
/// to limits; only cpu and memory decide).
pub fn qos_class(pod: &Value) -> &'static str {
    let all: Vec<&Value> = containers(pod, "initContainers")
        .iter()
        .chain(containers(pod, "containers"))
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in all {
        let limits = &c["resources"]["limits"];
        let requests = &c["resources"]["requests"];
        for r in ["cpu", "memory"] {
            let limit = limits.get(r).and_then(Value::as_str);
            let request = requests.get(r).and_then(Value::as_str).or(limit);
            any |= limit.is_some_and(|q| !is_zero(q)) || request.is_some_and(|q| !is_zero(q));
            let same = match (limit, request) {
                (Some(l), Some(q)) => amount(l) == amount(q),
                _ => false,
            };
            guaranteed &= same;
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

fn is_zero(q: &str) -> bool {
    amount(q) == Some(0.0)
}

/// A quantity as a number (enough to compare two of them).
fn amount(q: &str) -> Option<f64> {
    let suffixes: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("Pi", 1024f64.powi(5)),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (s, f) in suffixes {
        if let Some(n) = q.strip_suffix(s) {
            return n.parse::<f64>().ok().map(|n| n * f);
        }
    }
    q.parse().ok()
}

/// Each resource list of `c` with cpu and memory left out.
fn without_cpu_memory(c: &Value) -> Value {
    let mut c = c.clone();
    if let Some(resources) = c.get_mut("resources").and_then(Value::as_object_mut) {
        for list in ["requests", "limits"] {
            if let Some(l) = resources.get_mut(list).and_then(Value::as_object_mut) {
                l.remove("cpu");
                l.remove("memory");
                if l.is_empty() {
                    resources.remove(list);
                }
            }
        }
    }
    c
}

/// upstream's `ValidatePodResize`: the errors (`<field>: <type>: <detail>`, or the bare
/// detail where upstream gives no field), none when `next` is a valid resize of
/// `current`.
pub fn validate(current: &Value, next: &Value) -> Option<Vec<String>> {
    let has_pod_resources = |p: &Value| {
        p["spec"]["resources"].as_object().is_some_and(|r| {
            r.values()
                .any(|l| l.as_object().is_some_and(|l| !l.is_empty()))
        })
    };
    if has_pod_resources(current) || has_pod_resources(next) {
        return Some(vec![
            "Forbidden: pods with pod-level resources cannot be resized".into(),
        ]);
    }
    if current["metadata"]["annotations"].get(MIRROR).is_some() {
        return Some(vec!["Forbidden: static pods cannot be resized".into()]);
    }
    let mut errors = Vec::new();
    for list in ["containers", "initContainers"] {
        let (old, new) = (containers(current, list), containers(next, list));
        let renamed =
            old.len() != new.len() || old.iter().zip(new).any(|(a, b)| a["name"] != b["name"]);
        if renamed {
            errors.push(format!(
                "spec.{list}[0].name: Forbidden: containers may not be renamed or reordered on resize"
            ));
        }
    }
    if !errors.is_empty() {
        return Some(errors);
    }
    let old_qos = current["status"]["qosClass"]
        .as_str()
        .unwrap_or_else(|| qos_class(current));
    if qos_class(next) != old_qos {
        return Some(vec![format!(
            "spec: Invalid value: {old_qos:?}: Pod QOS Class may not change as a result of resizing"
        )]);
    }
    for list in ["containers", "initContainers"] {
        for (i, (a, b)) in containers(current, list)
            .iter()
            .zip(containers(next, list))
            .enumerate()
        {
            let path = format!("spec.{list}[{i}].resources");
            if list == "initContainers" && !is_sidecar(a) {
                if a != b {
                    errors.push(format!(
                        "{path}: Forbidden: resources for non-sidecar init containers are immutable"
                    ));
                }
                continue;
            }
            for kind in ["requests", "limits"] {
                let had = a["resources"][kind].as_object();
                let has = b["resources"][kind].as_object();
                let removed =
                    had.is_some_and(|h| h.keys().any(|k| has.is_none_or(|n| !n.contains_key(k))));
                if removed {
                    errors.push(format!(
                        "{path}.{kind}: Forbidden: resource {kind} cannot be removed"
                    ));
                }
            }
            if without_cpu_memory(a)["resources"] != without_cpu_memory(b)["resources"] {
                let what = if list == "initContainers" {
                    "only cpu and memory resources for sidecar containers are mutable"
                } else {
                    "only cpu and memory resources are mutable"
                };
                errors.push(format!("{path}: Forbidden: {what}"));
            }
        }
    }
    (!errors.is_empty()).then_some(errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(cpu: &str, mem: &str) -> Value {
        json!({"metadata": {"name": "p", "generation": 1}, "spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}}}]}})
    }

    #[test]
    fn only_resources_and_resize_policy_pass_and_the_generation_moves() {
        let current = pod("100m", "64Mi");
        let mut incoming = pod("200m", "128Mi");
        incoming["spec"]["containers"][0]["image"] = "other".into();
        incoming["spec"]["containers"][0]["resizePolicy"] =
            json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
        let next = merge(&current, incoming);
        assert_eq!(next["spec"]["containers"][0]["image"], "busybox");
        assert_eq!(
            next["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "200m"
        );
        assert_eq!(
            next["spec"]["containers"][0]["resizePolicy"][0]["resourceName"],
            "memory"
        );
        assert_eq!(next["metadata"]["generation"], 2);
        assert_eq!(validate(&current, &next), None);
        // Nothing changed: no new generation.
        assert_eq!(
            merge(&current, current.clone())["metadata"]["generation"],
            1
        );
    }

    #[test]
    fn refusals_in_upstreams_words() {
        let current = pod("100m", "64Mi");
        // Guaranteed to Burstable.
        let mut burstable = current.clone();
        burstable["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "50m".into();
        assert_eq!(
            validate(&current, &burstable).unwrap(),
            [
                r#"spec: Invalid value: "Guaranteed": Pod QOS Class may not change as a result of resizing"#
            ]
        );
        let mut storage = current.clone();
        storage["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "1Gi".into();
        assert_eq!(
            validate(&current, &storage).unwrap(),
            ["spec.containers[0].resources: Forbidden: only cpu and memory resources are mutable"]
        );
        let renamed = json!({"spec": {"containers": [{"name": "d"}]}});
        assert!(
            validate(&current, &renamed).unwrap()[0].contains("may not be renamed or reordered")
        );
        let mut mirror = current.clone();
        mirror["metadata"]["annotations"] = json!({MIRROR: "x"});
        assert_eq!(
            validate(&mirror, &current).unwrap(),
            ["Forbidden: static pods cannot be resized"]
        );
        let burst = json!({"spec": {"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}]}});
        let no_limit = json!({"spec": {"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "100m"}}}]}});
        assert_eq!(
            validate(&burst, &no_limit).unwrap(),
            ["spec.containers[0].resources.limits: Forbidden: resource limits cannot be removed"]
        );
        let init = json!({"spec": {"containers": [{"name": "c"}], "initContainers": [{"name": "i",
            "resources": {"requests": {"cpu": "100m"}}}]}});
        let mut init_changed = init.clone();
        init_changed["spec"]["initContainers"][0]["resources"]["requests"]["cpu"] = "200m".into();
        assert_eq!(
            validate(&init, &init_changed).unwrap(),
            [
                "spec.initContainers[0].resources: Forbidden: resources for non-sidecar init containers are immutable"
            ]
        );
    }

    #[test]
    fn qos_classes_as_upstream_computes_them() {
        assert_eq!(qos_class(&pod("1", "1Gi")), "Guaranteed");
        assert_eq!(
            qos_class(&json!({"spec": {"containers": [{"name": "c"}]}})),
            "BestEffort"
        );
        let limits_only = json!({"spec": {"containers": [{"name": "c",
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        assert_eq!(qos_class(&limits_only), "Guaranteed");
        let same_amount = json!({"spec": {"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        assert_eq!(qos_class(&same_amount), "Guaranteed");
    }
}
