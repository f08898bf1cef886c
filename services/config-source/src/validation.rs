//! The upstream validation rules that matter on a node, with upstream's error wording
//! (`field.ErrorList`: "<path>: <type>: <detail>").

use k8s_openapi::api::core::v1::{
    Container, Pod, Probe, ResourceRequirements, Volume, VolumeMount,
};
use nodeagent_transport::MAX_POD_JSON_BYTES;
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
    errs.extend(size_error(pod));
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
    if let Some(uid) = pod.metadata.uid.as_deref()
        && let Err(e) = nodeagent_hostpath::uid(uid)
    {
        errs.push(format!("metadata.uid: Invalid value: {e}"));
    }
    let Some(spec) = &pod.spec else {
        errs.push("spec: Required value".into());
        return Err(errs.join("; "));
    };
    let volumes = validate_volumes(spec.volumes.as_deref().unwrap_or_default(), &mut errs);
    // The volumes a container may use as a block device.
    let claimable: HashSet<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
        .map(|v| v.name.clone())
        .collect();
    if spec.containers.is_empty() {
        errs.push("spec.containers: Required value".into());
    }
    let mut names = HashSet::new();
    let ephemeral = spec.ephemeral_containers.as_deref().unwrap_or_default();
    let ephemeral_as_containers: Vec<Container> = ephemeral
        .iter()
        .map(nodeagent_proto::k8s::ephemeral_as_container)
        .collect();
    let groups = [
        (
            "spec.initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
        ("spec.containers", &spec.containers[..]),
        // Last, so that a name taken by another container is the ephemeral one's error.
        ("spec.ephemeralContainers", &ephemeral_as_containers[..]),
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
            validate_volume_mounts(c, &p, &volumes, &claimable, &mut errs);
            if let Some(res) = &c.resources {
                validate_quantities(res, &format!("{p}.resources"), &mut errs);
            }
            for (j, port) in c.ports.iter().flatten().enumerate() {
                if !(1..=65535).contains(&port.container_port) {
                    errs.push(format!(
                        "{p}.ports[{j}].containerPort: Invalid value: {}: must be between 1 and 65535, inclusive",
                        port.container_port
                    ));
                }
            }
            for (field, probe) in [
                ("livenessProbe", &c.liveness_probe),
                ("readinessProbe", &c.readiness_probe),
                ("startupProbe", &c.startup_probe),
            ] {
                if let Some(probe) = probe {
                    validate_probe_handler(probe, &format!("{p}.{field}"), &mut errs);
                }
            }
            validate_restart_rules(c, &p, &mut errs);
            if let Some(policy) = c.image_pull_policy.as_deref()
                && !matches!(policy, "Always" | "IfNotPresent" | "Never")
            {
                errs.push(format!("{p}.imagePullPolicy: Unsupported value: {policy:?}: supported values: \"Always\", \"IfNotPresent\", \"Never\""));
            }
        }
    }
    validate_ephemeral_containers(spec, &mut errs);
    validate_pod_resources(pod, &mut errs);
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

/// The quantities of a `resources` at `path`: well-formed and not negative.
fn validate_quantities(res: &ResourceRequirements, path: &str, errs: &mut Vec<String>) {
    for (kind, map) in [("limits", &res.limits), ("requests", &res.requests)] {
        for (name, q) in map.iter().flatten() {
            if !is_quantity(&q.0) {
                errs.push(format!(
                    "{path}.{kind}[{name}]: Invalid value: {:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                    q.0
                ));
            } else if q.0.starts_with('-') {
                errs.push(format!(
                    "{path}.{kind}[{name}]: Invalid value: {:?}: must be greater than or equal to 0",
                    q.0
                ));
            }
        }
    }
}

/// Pod-level `spec.resources` as upstream's `validatePodResources` checks them (after the
/// defaulting of pod-level requests, as the API server validates a defaulted pod): no
/// claims, only cpu, memory and hugepages, each request at most its limit, each pod-level
/// request at least what the containers request together, and no container limited above
/// the pod (upstream's own odd path for that one, `spec.resources.containers[i][name]`).
fn validate_pod_resources(pod: &Pod, errs: &mut Vec<String>) {
    use nodeagent_config::pod_level::{self, PodLevel, Resource};
    let Some(spec) = &pod.spec else { return };
    let Some(res) = &spec.resources else { return };
    let path = "spec.resources";
    if res.claims.is_some() {
        errs.push(format!(
            "{path}.claims: Forbidden: claims cannot be set for Resources at pod-level"
        ));
    }
    let before = errs.len();
    validate_quantities(res, path, errs);
    for (kind, map) in [("limits", &res.limits), ("requests", &res.requests)] {
        for name in map.iter().flatten().map(|(k, _)| k) {
            if !pod_level::is_supported(name) {
                let supported: Vec<String> = pod_level::SUPPORTED
                    .iter()
                    .map(|s| format!("{s:?}"))
                    .collect();
                errs.push(format!(
                    "{path}.{kind}[{name}]: Unsupported value: {name:?}: supported values: {}",
                    supported.join(", ")
                ));
            }
        }
    }
    if errs.len() > before {
        return;
    }
    let Some(pod_level) = PodLevel::of(pod) else {
        return;
    };
    for r in Resource::ALL {
        let (request, limit) = (pod_level.request(r), pod_level.limit(r));
        if let (Some(request), Some(limit)) = (request, limit)
            && request > limit
        {
            errs.push(format!(
                "{path}.requests[{name}]: Invalid value: {:?}: must be less than or equal to {name} limit of {}",
                pod_level.requests()[r.name()].0,
                pod_level.limits()[r.name()].0,
                name = r.name(),
            ));
        }
        if let Some(request) = request {
            let claimed =
                nodeagent_config::aggregate::aggregate(pod, |c| pod_level::container_request(c, r))
                    .total;
            if claimed > request {
                errs.push(format!(
                    "{path}.requests[{}]: Invalid value: {:?}: must be greater than or equal to aggregate container requests of {}",
                    r.name(),
                    pod_level.requests()[r.name()].0,
                    r.format(claimed)
                ));
            }
        }
        if let Some(limit) = limit {
            for (i, c) in spec.containers.iter().enumerate() {
                if let Some(own) = pod_level::container_limit(c, r)
                    && own > limit
                {
                    let q = c.resources.as_ref().and_then(|x| x.limits.as_ref());
                    errs.push(format!(
                        "{path}.containers[{i}][{name}].limits: Invalid value: {:?}: must be less than or equal to pod limits of {}",
                        q.and_then(|l| l.get(r.name())).map_or("", |q| q.0.as_str()),
                        pod_level.limits()[r.name()].0,
                        name = r.name(),
                    ));
                }
            }
        }
    }
}

/// A container's own `restartPolicy` and `restartPolicyRules` (ContainerRestartRules, on
/// by default since 1.35), as enums upstream's way. The `RestartAllContainers` action
/// (alpha in 1.35, off by default) is not carried out by this node: refused, saying so.
fn validate_restart_rules(c: &Container, p: &str, errs: &mut Vec<String>) {
    if let Some(policy) = c.restart_policy.as_deref()
        && !matches!(policy, "Always" | "OnFailure" | "Never")
    {
        errs.push(format!("{p}.restartPolicy: Unsupported value: {policy:?}: supported values: \"Always\", \"Never\", \"OnFailure\""));
    }
    for (i, rule) in c.restart_policy_rules.iter().flatten().enumerate() {
        let rp = format!("{p}.restartPolicyRules[{i}]");
        match rule.action.as_str() {
            "Restart" => {}
            "RestartAllContainers" => errs.push(format!(
                "{rp}.action: Unsupported value: \"RestartAllContainers\": this node does not restart all of a pod's containers in place (the RestartAllContainersOnContainerExits feature); supported values: \"Restart\""
            )),
            other => errs.push(format!(
                "{rp}.action: Unsupported value: {other:?}: supported values: \"Restart\""
            )),
        }
        match &rule.exit_codes {
            None => errs.push(format!("{rp}.exitCodes: Required value")),
            Some(codes) if !matches!(codes.operator.as_str(), "In" | "NotIn") => {
                errs.push(format!(
                    "{rp}.exitCodes.operator: Unsupported value: {:?}: supported values: \"In\", \"NotIn\"",
                    codes.operator
                ))
            }
            Some(_) => {}
        }
    }
}

/// What upstream's `validateEphemeralContainers` adds to the common container checks: the
/// target is a regular or init container of the pod, and the fields that would make an
/// ephemeral container part of the workload (`allowedEphemeralContainerFields` leaves them
/// out) are forbidden, subPath mounts included.
fn validate_ephemeral_containers(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    errs: &mut Vec<String>,
) {
    const FORBIDDEN: &str = "Forbidden: cannot be set for an Ephemeral Container";
    let others: HashSet<&str> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    for (i, e) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let p = format!("spec.ephemeralContainers[{i}]");
        if let Some(target) = e.target_container_name.as_deref()
            && !target.is_empty()
            && !others.contains(target)
        {
            errs.push(format!("{p}.targetContainerName: Not found: {target:?}"));
        }
        // Go's zero value test: an empty list or an empty resources object is unset.
        let resources_set = e.resources.as_ref().is_some_and(|r| {
            r.limits.as_ref().is_some_and(|l| !l.is_empty())
                || r.requests.as_ref().is_some_and(|l| !l.is_empty())
                || r.claims.as_ref().is_some_and(|l| !l.is_empty())
        });
        let set = [
            ("ports", e.ports.as_ref().is_some_and(|v| !v.is_empty())),
            ("resources", resources_set),
            (
                "resizePolicy",
                e.resize_policy.as_ref().is_some_and(|v| !v.is_empty()),
            ),
            ("restartPolicy", e.restart_policy.is_some()),
            ("livenessProbe", e.liveness_probe.is_some()),
            ("readinessProbe", e.readiness_probe.is_some()),
            ("startupProbe", e.startup_probe.is_some()),
            ("lifecycle", e.lifecycle.is_some()),
        ];
        for (field, _) in set.iter().filter(|(_, set)| *set) {
            errs.push(format!("{p}.{field}: {FORBIDDEN}"));
        }
        for (j, m) in e.volume_mounts.iter().flatten().enumerate() {
            for (field, value) in [("subPath", &m.sub_path), ("subPathExpr", &m.sub_path_expr)] {
                if value.as_deref().is_some_and(|v| !v.is_empty()) {
                    errs.push(format!("{p}.volumeMounts[{j}].{field}: {FORBIDDEN}"));
                }
            }
        }
    }
}

/// A probe has exactly one handler (upstream `validateHandler`): none would leave the
/// prober nothing to run, two would leave it guessing.
fn validate_probe_handler(probe: &Probe, path: &str, errs: &mut Vec<String>) {
    let set = [
        ("exec", probe.exec.is_some()),
        ("httpGet", probe.http_get.is_some()),
        ("tcpSocket", probe.tcp_socket.is_some()),
        ("grpc", probe.grpc.is_some()),
    ];
    let mut seen = 0;
    for (name, present) in set {
        if !present {
            continue;
        }
        if seen > 0 {
            errs.push(format!(
                "{path}.{name}: Forbidden: may not specify more than 1 handler type"
            ));
        }
        seen += 1;
    }
    if seen == 0 {
        errs.push(format!(
            "{path}: Required value: must specify a handler type"
        ));
    }
    if let Some(g) = &probe.grpc
        && !(1..=65535).contains(&g.port)
    {
        errs.push(format!(
            "{path}.grpc.port: Invalid value: {}: must be between 1 and 65535, inclusive",
            g.port
        ));
    }
}

/// Volume names are unique DNS-1123 labels (upstream `validateVolumes`); returns them.
fn validate_volumes(volumes: &[Volume], errs: &mut Vec<String>) -> HashSet<String> {
    let mut names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let p = format!("spec.volumes[{i}].name");
        if v.name.is_empty() {
            errs.push(format!("{p}: Required value"));
        } else if !is_dns1123_label(&v.name) {
            errs.push(format!(
                "{p}: Invalid value: {:?}: {DNS1123_LABEL_MSG}",
                v.name
            ));
        } else if !names.insert(v.name.clone()) {
            errs.push(format!("{p}: Duplicate value: {:?}", v.name));
        }
    }
    names
}

/// upstream `validateMountPropagation`: one of the three modes, and `Bidirectional` (whose
/// mounts reach the host) only in a privileged container.
fn validate_mount_propagation(c: &Container, m: &VolumeMount, path: &str, errs: &mut Vec<String>) {
    let Some(mode) = m.mount_propagation.as_deref() else {
        return;
    };
    if !matches!(mode, "Bidirectional" | "HostToContainer" | "None") {
        errs.push(format!(
            "{path}: Unsupported value: {mode:?}: supported values: \"Bidirectional\", \"HostToContainer\", \"None\""
        ));
    }
    let privileged = c
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    if mode == "Bidirectional" && !privileged {
        errs.push(format!(
            "{path}: Forbidden: Bidirectional mount propagation is available only to privileged containers"
        ));
    }
}

/// Every mount names a volume, mount paths are unique and have no ':', subPaths stay in
/// their volume (upstream `ValidateVolumeMounts`, `ValidateVolumeDevices`).
fn validate_volume_mounts(
    c: &Container,
    p: &str,
    volumes: &HashSet<String>,
    claimable: &HashSet<String>,
    errs: &mut Vec<String>,
) {
    let mut paths = HashSet::new();
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mp = format!("{p}.volumeMounts[{j}]");
        if m.name.is_empty() {
            errs.push(format!("{mp}.name: Required value"));
        } else if !volumes.contains(&m.name) {
            errs.push(format!("{mp}.name: Not found: {:?}", m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(format!("{mp}.mountPath: Required value"));
        } else if !paths.insert(m.mount_path.clone()) {
            errs.push(format!(
                "{mp}.mountPath: Invalid value: {:?}: must be unique",
                m.mount_path
            ));
        }
        if m.mount_path.contains(':') {
            errs.push(format!(
                "{mp}.mountPath: Invalid value: {:?}: must not contain ':'",
                m.mount_path
            ));
        }
        let sub = m.sub_path.as_deref().unwrap_or_default();
        let expr = m.sub_path_expr.as_deref().unwrap_or_default();
        local_descending_path(sub, &format!("{mp}.subPath"), errs);
        if !expr.is_empty() && !sub.is_empty() {
            errs.push(format!(
                "{mp}.subPathExpr: Invalid value: {expr:?}: subPathExpr and subPath are mutually exclusive"
            ));
        }
        local_descending_path(expr, &format!("{mp}.subPathExpr"), errs);
        validate_mount_propagation(c, m, &format!("{mp}.mountPropagation"), errs);
    }
    let (mut device_names, mut device_paths) = (HashSet::new(), HashSet::new());
    for (j, d) in c.volume_devices.iter().flatten().enumerate() {
        let dp = format!("{p}.volumeDevices[{j}]");
        if !d.name.is_empty() && !device_names.insert(d.name.clone()) {
            errs.push(format!(
                "{dp}.name: Invalid value: {:?}: must be unique",
                d.name
            ));
        }
        if d.name.is_empty() {
            errs.push(format!("{dp}.name: Required value"));
        } else if !volumes.contains(&d.name) {
            errs.push(format!("{dp}.name: Not found: {:?}", d.name));
        } else if !claimable.contains(&d.name) {
            errs.push(format!(
                "{dp}.name: Invalid value: {:?}: can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode",
                d.name
            ));
        }
        if c.volume_mounts.iter().flatten().any(|m| m.name == d.name) {
            errs.push(format!(
                "{dp}.name: Invalid value: {:?}: must not already exist in volumeMounts",
                d.name
            ));
        }
        if d.device_path.is_empty() {
            errs.push(format!("{dp}.devicePath: Required value"));
        } else if !device_paths.insert(d.device_path.clone()) {
            errs.push(format!(
                "{dp}.devicePath: Invalid value: {:?}: must be unique",
                d.device_path
            ));
        }
        if d.device_path.split('/').any(|c| c == "..") {
            errs.push(format!(
                "{dp}.devicePath: Invalid value: {:?}: can not contain backsteps ('..')",
                d.device_path
            ));
        }
        if paths.contains(&d.device_path) {
            errs.push(format!(
                "{dp}.devicePath: Invalid value: {:?}: must not already exist as a path in volumeMounts",
                d.device_path
            ));
        }
    }
}

/// upstream `validateLocalDescendingPath`: relative, no '..' component.
fn local_descending_path(path: &str, field: &str, errs: &mut Vec<String>) {
    if path.starts_with('/') {
        errs.push(format!(
            "{field}: Invalid value: {path:?}: must be a relative path"
        ));
    }
    if path.split('/').any(|p| p == "..") {
        errs.push(format!(
            "{field}: Invalid value: {path:?}: must not contain '..'"
        ));
    }
}

/// A pod larger than the API server would accept is refused at the source, before it can
/// reach a stream: every message must stay under the transport's limit.
fn size_error(pod: &Pod) -> Option<String> {
    let len = serde_json::to_vec(pod).map_or(usize::MAX, |json| json.len());
    (len > MAX_POD_JSON_BYTES).then(|| {
        format!(
            "the pod is {len} bytes as JSON; the limit is {MAX_POD_JSON_BYTES} bytes (the API \
             server's request size limit)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: &str) -> Pod {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_probe_has_exactly_one_handler() {
        let with = |probe: &str| {
            validate_pod(&pod(&format!(
                r#"{{"metadata":{{"name":"a"}},"spec":{{"containers":[{{"name":"c","image":"i",
                   "livenessProbe":{probe}}}]}}}}"#
            )))
        };
        assert_eq!(with(r#"{"grpc":{"port":9090}}"#), Ok(()));
        assert_eq!(
            with(r#"{"periodSeconds":1}"#).unwrap_err(),
            "spec.containers[0].livenessProbe: Required value: must specify a handler type"
        );
        assert_eq!(
            with(r#"{"tcpSocket":{"port":1},"grpc":{"port":2}}"#).unwrap_err(),
            "spec.containers[0].livenessProbe.grpc: Forbidden: may not specify more than 1 handler type"
        );
        assert_eq!(
            with(r#"{"grpc":{"port":70000}}"#).unwrap_err(),
            "spec.containers[0].livenessProbe.grpc.port: Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
    }

    /// Pod-level `spec.resources` (upstream's `validatePodResources` and
    /// `validatePodResourceConsistency`). The texts are a real API server's: a 422 that
    /// kube-apiserver answered for a pod asking 1 cpu and 576Mi for containers that request
    /// 1500m and 6Gi together reads "spec.resources.requests[cpu]: Invalid value: \"1\": must
    /// be greater than or equal to aggregate container requests of 1500m,
    /// spec.resources.requests[memory]: Invalid value: \"576Mi\": must be greater than or
    /// equal to aggregate container requests of 6Gi".
    #[test]
    fn pod_level_resources_are_validated_as_upstream() {
        let with = |resources: &str, containers: &[&str]| {
            let containers: Vec<String> = containers
                .iter()
                .enumerate()
                .map(|(i, r)| format!(r#"{{"name":"c{i}","image":"i","resources":{r}}}"#))
                .collect();
            validate_pod(&pod(&format!(
                r#"{{"metadata":{{"name":"a"}},"spec":{{"resources":{resources},"containers":[{}]}}}}"#,
                containers.join(",")
            )))
        };
        assert_eq!(
            with(
                r#"{"requests":{"cpu":"1","memory":"576Mi"}}"#,
                &[
                    r#"{"requests":{"cpu":"1","memory":"2Gi"}}"#,
                    r#"{"requests":{"cpu":"500m","memory":"4Gi"}}"#
                ]
            )
            .unwrap_err(),
            "spec.resources.requests[cpu]: Invalid value: \"1\": must be greater than or equal to aggregate container requests of 1500m; \
             spec.resources.requests[memory]: Invalid value: \"576Mi\": must be greater than or equal to aggregate container requests of 6Gi"
        );
        // Fits: requests at or above the containers', limits at or above each container's.
        assert_eq!(
            with(
                r#"{"requests":{"cpu":"2"},"limits":{"cpu":"2","memory":"1Gi"}}"#,
                &[
                    r#"{"requests":{"cpu":"1"},"limits":{"memory":"1Gi"}}"#,
                    "{}"
                ]
            ),
            Ok(())
        );
        // Only cpu, memory and hugepages (`validatePodResourceName`'s NotSupported).
        assert_eq!(
            with(r#"{"requests":{"ephemeral-storage":"1Gi"}}"#, &["{}"]).unwrap_err(),
            "spec.resources.requests[ephemeral-storage]: Unsupported value: \"ephemeral-storage\": supported values: \"cpu\", \"hugepages-\", \"memory\""
        );
        // A request above its limit (`validateResourceRequirements`); a request left out is
        // defaulted first, here from the containers' 2 cpu, above the pod's limit of 1.
        assert_eq!(
            with(
                r#"{"requests":{"memory":"2Gi"},"limits":{"memory":"1Gi"}}"#,
                &["{}"]
            )
            .unwrap_err(),
            "spec.resources.requests[memory]: Invalid value: \"2Gi\": must be less than or equal to memory limit of 1Gi"
        );
        assert_eq!(
            with(
                r#"{"limits":{"cpu":"1"}}"#,
                &[r#"{"requests":{"cpu":"2"}}"#]
            )
            .unwrap_err(),
            "spec.resources.requests[cpu]: Invalid value: \"2\": must be less than or equal to cpu limit of 1"
        );
        // A container limited above the pod, with upstream's path.
        assert_eq!(
            with(
                r#"{"limits":{"memory":"100Mi"}}"#,
                &[r#"{"limits":{"memory":"200Mi"}}"#]
            )
            .unwrap_err(),
            "spec.resources.requests[memory]: Invalid value: \"200Mi\": must be less than or equal to memory limit of 100Mi; \
             spec.resources.containers[0][memory].limits: Invalid value: \"200Mi\": must be less than or equal to pod limits of 100Mi"
        );
        assert_eq!(
            with(r#"{"claims":[{"name":"gpu"}]}"#, &["{}"]).unwrap_err(),
            "spec.resources.claims: Forbidden: claims cannot be set for Resources at pod-level"
        );
        assert_eq!(
            with(r#"{"limits":{"cpu":"lots"}}"#, &["{}"]).unwrap_err(),
            "spec.resources.limits[cpu]: Invalid value: \"lots\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
    }

    /// upstream: pkg/apis/core/validation/validation_test.go TestValidateMountPropagation,
    /// every case (a nil container is the API server's defaulting pass, not a pod we get).
    #[test]
    fn mount_propagation_is_validated_as_upstream() {
        let with = |mode: &str, privileged: bool| {
            validate_pod(&pod(&format!(
                r#"{{"metadata":{{"name":"a"}},"spec":{{
                   "volumes":[{{"name":"v","hostPath":{{"path":"/tmp"}}}}],
                   "containers":[{{"name":"c","image":"i",
                     "securityContext":{{"privileged":{privileged}}},
                     "volumeMounts":[{{"name":"v","mountPath":"/v","mountPropagation":"{mode}"}}]}}]}}}}"#
            )))
        };
        let path = "spec.containers[0].volumeMounts[0].mountPropagation";
        // "default" (None) and HostToContainer, privileged or not: valid.
        assert_eq!(with("None", false), Ok(()));
        assert_eq!(with("HostToContainer", false), Ok(()));
        assert_eq!(with("HostToContainer", true), Ok(()));
        // "privileged container + Bidirectional": valid.
        assert_eq!(with("Bidirectional", true), Ok(()));
        // "non-privileged container + Bidirectional": forbidden.
        assert_eq!(
            with("Bidirectional", false),
            Err(format!(
                "{path}: Forbidden: Bidirectional mount propagation is available only to privileged containers"
            ))
        );
        // "invalid propagation mode".
        assert_eq!(
            with("something", true),
            Err(format!(
                "{path}: Unsupported value: \"something\": supported values: \"Bidirectional\", \"HostToContainer\", \"None\""
            ))
        );
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
    fn volumes_that_would_leave_the_pod_dir_are_refused() {
        let err = validate_pod(&pod(
            r#"{"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i",
                "volumeMounts":[{"name":"../../../../tmp/x","mountPath":"/d"}]}],
                "volumes":[{"name":"../../../../tmp/x","emptyDir":{}}]}}"#,
        ))
        .unwrap_err();
        assert!(
            err.starts_with("spec.volumes[0].name: Invalid value: \"../../../../tmp/x\": a lowercase RFC 1123 label"),
            "{err}"
        );
    }

    #[test]
    fn volume_names_and_mounts_are_checked() {
        let err = validate_pod(&pod(r#"{"metadata":{"name":"a"},"spec":{
                "volumes":[{"name":"d","emptyDir":{}},{"name":"d","emptyDir":{}}],
                "containers":[{"name":"c","image":"i",
                "volumeMounts":[{"name":"d","mountPath":"/a"},{"name":"nope","mountPath":"/a"},
                    {"name":"d","mountPath":"/b:c","subPath":"../x"},
                    {"name":"d","mountPath":"/e","subPath":"s","subPathExpr":"/$(X)"}],
                "volumeDevices":[{"name":"gone","devicePath":"/dev/x"}]}]}}"#))
        .unwrap_err();
        for want in [
            "spec.volumes[1].name: Duplicate value: \"d\"",
            "spec.containers[0].volumeMounts[1].name: Not found: \"nope\"",
            "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/a\": must be unique",
            "spec.containers[0].volumeMounts[2].mountPath: Invalid value: \"/b:c\": must not contain ':'",
            "spec.containers[0].volumeMounts[2].subPath: Invalid value: \"../x\": must not contain '..'",
            "spec.containers[0].volumeMounts[3].subPathExpr: Invalid value: \"/$(X)\": subPathExpr and subPath are mutually exclusive",
            "spec.containers[0].volumeMounts[3].subPathExpr: Invalid value: \"/$(X)\": must be a relative path",
            "spec.containers[0].volumeDevices[0].name: Not found: \"gone\"",
        ] {
            assert!(err.contains(want), "missing {want}\n in {err}");
        }
    }

    /// upstream's `ValidateVolumeDevices`: a device's volume must be a claim (or a generic
    /// ephemeral one), not also mounted, with a devicePath without backsteps.
    #[test]
    fn volume_devices_are_checked_as_upstream() {
        let err = validate_pod(&pod(r#"{"metadata":{"name":"a"},"spec":{
                "volumes":[{"name":"d","emptyDir":{}},
                    {"name":"c","persistentVolumeClaim":{"claimName":"x"}},
                    {"name":"e","ephemeral":{"volumeClaimTemplate":{"spec":{}}}},
                    {"name":"f","ephemeral":{"volumeClaimTemplate":{"spec":{}}}}],
                "containers":[{"name":"c","image":"i",
                "volumeMounts":[{"name":"c","mountPath":"/m"}],
                "volumeDevices":[{"name":"d","devicePath":"/dev/a"},{"name":"c","devicePath":"/dev/b"},
                    {"name":"e","devicePath":"/dev/../x"},{"name":"f","devicePath":""},
                    {"name":"e","devicePath":"/m"},{"name":"f","devicePath":"/dev/a"}]}]}}"#))
        .unwrap_err();
        for want in [
            "spec.containers[0].volumeDevices[0].name: Invalid value: \"d\": can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode",
            "spec.containers[0].volumeDevices[1].name: Invalid value: \"c\": must not already exist in volumeMounts",
            "spec.containers[0].volumeDevices[2].devicePath: Invalid value: \"/dev/../x\": can not contain backsteps ('..')",
            "spec.containers[0].volumeDevices[3].devicePath: Required value",
            "spec.containers[0].volumeDevices[4].name: Invalid value: \"e\": must be unique",
            "spec.containers[0].volumeDevices[4].devicePath: Invalid value: \"/m\": must not already exist as a path in volumeMounts",
            "spec.containers[0].volumeDevices[5].devicePath: Invalid value: \"/dev/a\": must be unique",
        ] {
            assert!(err.contains(want), "missing {want}\n in {err}");
        }
        assert!(!err.contains("volumeDevices[2].name"), "{err}");
        validate_pod(&pod(r#"{"metadata":{"name":"a"},"spec":{
                "volumes":[{"name":"c","persistentVolumeClaim":{"claimName":"x"}}],
                "containers":[{"name":"c","image":"i",
                "volumeDevices":[{"name":"c","devicePath":"/dev/xvda"}]}]}}"#))
        .unwrap();
    }

    #[test]
    fn uids_must_be_one_safe_path_component() {
        for bad in ["../../x", "..", "a/b", "a\0b"] {
            let json = serde_json::json!({"metadata":{"name":"a","uid":bad},
                "spec":{"containers":[{"name":"c","image":"i"}]}});
            let err = validate_pod(&serde_json::from_value(json).unwrap()).unwrap_err();
            assert!(
                err.starts_with("metadata.uid: Invalid value: "),
                "{bad:?}: {err}"
            );
        }
        let long = "u".repeat(129);
        let json = serde_json::json!({"metadata":{"name":"a","uid":long},
            "spec":{"containers":[{"name":"c","image":"i"}]}});
        assert!(validate_pod(&serde_json::from_value(json).unwrap()).is_err());
        assert!(validate_pod(&pod(
            r#"{"metadata":{"name":"a","uid":"6f0c6f1e-8a2b-4c1d-9e3f-0a1b2c3d4e5f"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#
        )).is_ok());
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

    #[test]
    fn container_restart_rules_take_upstreams_enums_and_no_restart_all() {
        let check = |container: &str| {
            let pod: Pod = serde_json::from_str(&format!(
                r#"{{"metadata":{{"name":"a"}},"spec":{{"restartPolicy":"Never","containers":[{container}]}}}}"#
            ))
            .unwrap();
            validate_pod(&pod)
        };
        let ok = r#"{"name":"c","image":"i","restartPolicy":"Never","restartPolicyRules":[
            {"action":"Restart","exitCodes":{"operator":"In","values":[42]}}]}"#;
        assert_eq!(check(ok), Ok(()));
        let err = check(
            r#"{"name":"c","image":"i","restartPolicy":"Sometimes","restartPolicyRules":[
            {"action":"RestartAllContainers","exitCodes":{"operator":"Maybe","values":[1]}}]}"#,
        )
        .unwrap_err();
        for want in [
            "spec.containers[0].restartPolicy: Unsupported value: \"Sometimes\"",
            "spec.containers[0].restartPolicyRules[0].action: Unsupported value: \"RestartAllContainers\"",
            "spec.containers[0].restartPolicyRules[0].exitCodes.operator: Unsupported value: \"Maybe\"",
        ] {
            assert!(err.contains(want), "{want} not in {err}");
        }
    }

    // upstream: pkg/apis/core/validation validateEphemeralContainers and its
    // TestValidateEphemeralContainers rows: a name taken by another container, a target
    // that is not a container of the pod, and the fields an ephemeral container may not set.
    #[test]
    fn ephemeral_containers_as_upstream_validates_them() {
        let base = r#"{"metadata":{"name":"a"},"spec":{"containers":[{"name":"app","image":"i"}],
            "initContainers":[{"name":"init","image":"i"}],"ephemeralContainers":EPH}}"#;
        let check = |eph: &str| {
            let pod: Pod = serde_json::from_str(&base.replace("EPH", eph)).unwrap();
            validate_pod(&pod)
        };
        assert_eq!(
            check(r#"[{"name":"debug","image":"i","targetContainerName":"app","resources":{}}]"#),
            Ok(())
        );
        assert_eq!(
            check(r#"[{"name":"debug","image":"i","targetContainerName":"init"}]"#),
            Ok(())
        );
        assert_eq!(
            check(r#"[{"name":"app","image":"i"}]"#),
            Err("spec.ephemeralContainers[0].name: Duplicate value: \"app\"".into())
        );
        assert_eq!(
            check(r#"[{"name":"debug","image":"i","targetContainerName":"bogus"}]"#),
            Err("spec.ephemeralContainers[0].targetContainerName: Not found: \"bogus\"".into())
        );
        let err = check(
            r#"[{"name":"debug","image":"i","ports":[{"containerPort":80}],
                "resources":{"limits":{"cpu":"1"}},"lifecycle":{},"livenessProbe":{"exec":{"command":["true"]}},
                "readinessProbe":{"exec":{"command":["true"]}},"startupProbe":{"exec":{"command":["true"]}},
                "restartPolicy":"Always"}]"#,
        )
        .unwrap_err();
        for field in [
            "ports",
            "resources",
            "restartPolicy",
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
            "lifecycle",
        ] {
            let want = format!(
                "spec.ephemeralContainers[0].{field}: Forbidden: cannot be set for an Ephemeral Container"
            );
            assert!(err.contains(&want), "{want} not in {err}");
        }
        let err = check(
            r#"[{"name":"debug","image":"i","volumeMounts":[{"name":"v","mountPath":"/v","subPath":"x"}]}]"#,
        )
        .unwrap_err();
        assert!(
            err.contains("spec.ephemeralContainers[0].volumeMounts[0].subPath: Forbidden: cannot be set for an Ephemeral Container"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    #[test]
    fn a_pod_over_the_size_limit_is_refused_naming_the_limit() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "big", "namespace": "default", "annotations": {}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
        .unwrap();
        let mut annotate = |value: String| {
            let annotations = pod.metadata.annotations.as_mut().unwrap();
            annotations.insert("a".into(), value);
            pod.clone()
        };
        assert_eq!(
            size_error(&annotate("x".repeat(MAX_POD_JSON_BYTES - 1024))),
            None
        );
        let pod = annotate("x".repeat(MAX_POD_JSON_BYTES));
        let err = validate_pod(&pod).unwrap_err();
        assert!(err.contains("the limit is 1572864 bytes"), "{err}");
    }
}
