//! A pod's requests and limits summed over its containers as upstream sums them
//! (`k8s.io/component-helpers/resource` `AggregateContainerRequests`/`Limits`), with the
//! sidecar rules: what the pod cgroup is sized by.

use k8s_openapi::api::core::v1::{Container, Pod};

/// One resource of a pod, aggregated over its containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aggregate {
    /// What the pod needs at its peak: the regular containers and every sidecar together,
    /// or any one regular init container with the sidecars already running, whichever is
    /// larger (init containers run one at a time, before the regular ones).
    pub total: i64,
    /// Whether every container sets a non-zero value (a regular init container counts
    /// the sidecars before it, as upstream's `ContainerFn` sees it): a pod limit only means
    /// something when nothing in the pod is unlimited.
    pub every_container: bool,
}

/// A sidecar: an init container with `restartPolicy: Always`, which keeps running next to
/// the regular containers.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Aggregates `value` (a container's request or limit of one resource, absent = 0) over
/// the pod's containers.
pub fn aggregate(pod: &Pod, value: impl Fn(&Container) -> Option<i64>) -> Aggregate {
    let Some(spec) = &pod.spec else {
        return Aggregate {
            total: 0,
            every_container: false,
        };
    };
    let mut every_container = !spec.containers.is_empty();
    let mut total = 0i64;
    for c in &spec.containers {
        let v = value(c).unwrap_or(0);
        every_container &= v != 0;
        total = total.saturating_add(v);
    }
    // Sidecars declared so far: they run while each later init container does.
    let mut sidecars = 0i64;
    let mut init_peak = 0i64;
    for c in spec.init_containers.iter().flatten() {
        let v = value(c).unwrap_or(0);
        let in_use = if is_sidecar(c) {
            total = total.saturating_add(v);
            sidecars = sidecars.saturating_add(v);
            sidecars
        } else {
            v.saturating_add(sidecars)
        };
        every_container &= in_use != 0;
        init_peak = init_peak.max(in_use);
    }
    Aggregate {
        total: total.max(init_peak),
        every_container,
    }
}

/// The pod's `overhead` of one resource (RuntimeClass overhead), parsed with `parse`.
pub fn overhead(pod: &Pod, name: &str, parse: impl Fn(&str) -> Option<i64>) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .and_then(|o| o.get(name))
        .and_then(|q| parse(&q.0))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::bytes;

    /// An init container: (name, memory limit, sidecar?); "" = no limit.
    type Init<'a> = (&'a str, &'a str, bool);

    /// A pod from its init containers and the memory limits of its regular containers.
    fn pod(init: &[Init], regular: &[&str]) -> Pod {
        let container = |name: String, limit: &str, sidecar: bool| {
            let mut c = serde_json::json!({"name": name, "image": "i"});
            if !limit.is_empty() {
                c["resources"] = serde_json::json!({"limits": {"memory": limit}});
            }
            if sidecar {
                c["restartPolicy"] = "Always".into();
            }
            c
        };
        let init: Vec<_> = init
            .iter()
            .map(|(n, l, s)| container(n.to_string(), l, *s))
            .collect();
        let regular: Vec<_> = regular
            .iter()
            .enumerate()
            .map(|(i, l)| container(format!("c{i}"), l, false))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"initContainers": init, "containers": regular}
        }))
        .unwrap()
    }

    fn memory_limit(c: &Container) -> Option<i64> {
        let limits = c.resources.as_ref()?.limits.as_ref()?;
        bytes(&limits.get("memory")?.0)
    }

    #[test]
    fn init_containers_and_sidecars_as_upstream() {
        const MI: i64 = 1 << 20;
        // (what, init containers, regular containers, total, every container limited)
        type Row<'a> = (&'a str, &'a [Init<'a>], &'a [&'a str], i64, bool);
        let rows: &[Row] = &[
            (
                "regular containers add up",
                &[],
                &["16Mi", "32Mi"],
                48 * MI,
                true,
            ),
            (
                "a big init container raises the pod's peak",
                &[("init", "64Mi", false)],
                &["16Mi"],
                64 * MI,
                true,
            ),
            (
                "a small init container does not",
                &[("init", "8Mi", false)],
                &["16Mi"],
                16 * MI,
                true,
            ),
            (
                "a sidecar adds to the regular sum",
                &[("side", "8Mi", true)],
                &["16Mi"],
                24 * MI,
                true,
            ),
            (
                "an init container after a sidecar runs next to it",
                &[("side", "8Mi", true), ("init", "64Mi", false)],
                &["16Mi"],
                72 * MI,
                true,
            ),
            (
                "an init container before the sidecar runs alone",
                &[("init", "64Mi", false), ("side", "8Mi", true)],
                &["16Mi"],
                64 * MI,
                true,
            ),
            (
                "sidecars before an init container all count",
                &[
                    ("s1", "8Mi", true),
                    ("s2", "8Mi", true),
                    ("init", "40Mi", false),
                ],
                &["16Mi"],
                56 * MI,
                true,
            ),
            (
                "an unlimited regular container",
                &[("init", "64Mi", false)],
                &["16Mi", ""],
                64 * MI,
                false,
            ),
            (
                "an unlimited init container",
                &[("init", "", false)],
                &["16Mi"],
                16 * MI,
                false,
            ),
            (
                "an unlimited init container after a limited sidecar counts as limited",
                &[("side", "8Mi", true), ("init", "", false)],
                &["16Mi"],
                24 * MI,
                true,
            ),
        ];
        for (what, init, regular, total, every) in rows {
            let got = aggregate(&pod(init, regular), memory_limit);
            assert_eq!(
                got,
                Aggregate {
                    total: *total,
                    every_container: *every
                },
                "{what}"
            );
        }
    }

    #[test]
    fn no_containers_is_not_limited() {
        let got = aggregate(&pod(&[], &[]), memory_limit);
        assert!(!got.every_container);
        assert_eq!(got.total, 0);
    }
}
