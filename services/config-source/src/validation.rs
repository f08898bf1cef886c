//! The upstream validation rules that matter on a node, with upstream's error wording
//! (`field.ErrorList`: "<path>: <type>: <detail>").

use k8s_openapi::api::core::v1::Pod;
use std::collections::HashSet;

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Whether `q` is a valid resource quantity ("100m", "1.5", "128Mi", "1e3").
pub fn is_quantity(q: &str) -> bool {
    let q = q.strip_prefix(['+', '-']).unwrap_or(q);
    let digits_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(digits_end);
    let number_ok = !number.is_empty() && number != "." && number.matches('.').count() <= 1;
    let suffix_ok = matches!(
        suffix,
        "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
    ) || (suffix.len() > 1
        && suffix.starts_with(['e', 'E'])
        && suffix[1..]
            .strip_prefix(['+', '-'])
            .unwrap_or(&suffix[1..])
            .chars()
            .all(|c| c.is_ascii_digit())
        && suffix.len() > 1 + usize::from(suffix[1..].starts_with(['+', '-'])));
    number_ok && suffix_ok
}

/// Validates a pod; the error lists every problem found, separated by "; ".
pub fn validate_pod(pod: &Pod) -> Result<(), String> {
    let mut errs = Vec::new();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if !is_dns1123_subdomain(name) {
        errs.push(format!(
            "metadata.name: Invalid value: {name:?}: {DNS1123_SUBDOMAIN_MSG}"
        ));
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    if !is_dns1123_label(ns) {
        errs.push(format!(
            "metadata.namespace: Invalid value: {ns:?}: {DNS1123_LABEL_MSG}"
        ));
    }
    let Some(spec) = &pod.spec else {
        errs.push("spec: Required value".into());
        return Err(errs.join("; "));
    };
    if spec.containers.is_empty() {
        errs.push("spec.containers: Required value".into());
    }
    let mut names = HashSet::new();
    let groups = [
        (
            "spec.initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
        ("spec.containers", &spec.containers[..]),
    ];
    for (path, containers) in groups {
        for (i, c) in containers.iter().enumerate() {
            let p = format!("{path}[{i}]");
            if c.name.is_empty() {
                errs.push(format!("{p}.name: Required value"));
            } else if !is_dns1123_label(&c.name) {
                errs.push(format!(
                    "{p}.name: Invalid value: {:?}: {DNS1123_LABEL_MSG}",
                    c.name
                ));
            } else if !names.insert(c.name.clone()) {
                errs.push(format!("{p}.name: Duplicate value: {:?}", c.name));
            }
            if c.image.as_deref().unwrap_or_default().trim().is_empty() {
                errs.push(format!("{p}.image: Required value"));
            }
            if let Some(res) = &c.resources {
                for (kind, map) in [("limits", &res.limits), ("requests", &res.requests)] {
                    for (name, q) in map.iter().flatten() {
                        if !is_quantity(&q.0) {
                            errs.push(format!(
                                "{p}.resources.{kind}[{name}]: Invalid value: {:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                                q.0
                            ));
                        } else if q.0.starts_with('-') {
                            errs.push(format!("{p}.resources.{kind}[{name}]: Invalid value: {:?}: must be greater than or equal to 0", q.0));
                        }
                    }
                }
            }
            for (j, port) in c.ports.iter().flatten().enumerate() {
                if !(1..=65535).contains(&port.container_port) {
                    errs.push(format!(
                        "{p}.ports[{j}].containerPort: Invalid value: {}: must be between 1 and 65535, inclusive",
                        port.container_port
                    ));
                }
            }
            if let Some(policy) = c.image_pull_policy.as_deref()
                && !matches!(policy, "Always" | "IfNotPresent" | "Never")
            {
                errs.push(format!("{p}.imagePullPolicy: Unsupported value: {policy:?}: supported values: \"Always\", \"IfNotPresent\", \"Never\""));
            }
        }
    }
    if let Some(policy) = spec.restart_policy.as_deref()
        && !matches!(policy, "Always" | "OnFailure" | "Never")
    {
        errs.push(format!("spec.restartPolicy: Unsupported value: {policy:?}: supported values: \"Always\", \"OnFailure\", \"Never\""));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: &str) -> Pod {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_pod_with_no_containers_is_refused() {
        let err = validate_pod(&pod(
            r#"{"metadata":{"name":"a"},"spec":{"containers":[]}}"#,
        ))
        .unwrap_err();
        assert_eq!(err, "spec.containers: Required value");
    }

    #[test]
    fn duplicate_and_bad_names_are_listed() {
        let err = validate_pod(&pod(
            r#"{"metadata":{"name":"A_b"},"spec":{"restartPolicy":"Sometimes","containers":[
                {"name":"c","image":"i"},{"name":"c","image":"i","ports":[{"containerPort":70000}]}]}}"#,
        ))
        .unwrap_err();
        assert!(
            err.contains("metadata.name: Invalid value: \"A_b\""),
            "{err}"
        );
        assert!(
            err.contains("spec.containers[1].name: Duplicate value: \"c\""),
            "{err}"
        );
        assert!(
            err.contains("spec.containers[1].ports[0].containerPort: Invalid value: 70000"),
            "{err}"
        );
        assert!(
            err.contains("spec.restartPolicy: Unsupported value: \"Sometimes\""),
            "{err}"
        );
    }

    #[test]
    fn quantities() {
        for ok in ["100m", "1", "0.5", "128Mi", "1G", "1e3", "2E+2"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "abc", "1.2.3", "12Zi", "e3", "1e"] {
            assert!(!is_quantity(bad), "{bad}");
        }
        let err = validate_pod(&pod(
            r#"{"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"memory":"lots"}}}]}}"#,
        ))
        .unwrap_err();
        assert!(
            err.starts_with("spec.containers[0].resources.limits[memory]: Invalid value: \"lots\""),
            "{err}"
        );
    }

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("web-1"));
        assert!(!is_dns1123_label("-web"));
        assert!(!is_dns1123_label("Web"));
        assert!(is_dns1123_subdomain("web.node-1"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    }
}
