//! A container's environment: `env` with `$(VAR)` expansion, the downward API's field and
//! resource references, and what `envFrom` and `valueFrom` ask of config maps and secrets.

use super::*;

/// The value a `fieldRef` names, for the fields upstream supports in env.
pub(crate) fn field_ref(pod: &Pod, path: &str, node: &NodeContext, pod_ip: &str) -> Option<String> {
    let meta = &pod.metadata;
    let lookup = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref().and_then(|m| m.get(key).cloned())
    };
    if let Some(key) = path
        .strip_prefix("metadata.labels['")
        .and_then(|k| k.strip_suffix("']"))
    {
        return lookup(&meta.labels, key);
    }
    if let Some(key) = path
        .strip_prefix("metadata.annotations['")
        .and_then(|k| k.strip_suffix("']"))
    {
        return lookup(&meta.annotations, key);
    }
    let spec = pod.spec.clone().unwrap_or_default();
    Some(match path {
        "metadata.name" => k8s::pod_name(pod).into(),
        "metadata.namespace" => k8s::pod_namespace(pod).into(),
        "metadata.uid" => k8s::pod_uid(pod).into(),
        "spec.nodeName" => spec.node_name.unwrap_or_else(|| node.node_name.clone()),
        "spec.serviceAccountName" => spec.service_account_name.unwrap_or_default(),
        "status.hostIP" => node.ips.host_ip().to_string(),
        // Upstream joins them with commas.
        "status.hostIPs" => node.ips.host_ips.join(","),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        _ => return None,
    })
}

pub(crate) fn resource_field_ref(
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Option<String> {
    let res = c.resources.clone().unwrap_or_default();
    let (kind, name) = resource.split_once('.')?;
    let map = if kind == "limits" {
        res.limits
    } else {
        res.requests
    };
    let q = map.unwrap_or_default().get(name).map(|q| q.0.clone());
    let is_cpu = name == "cpu";
    // Without a limit upstream reports the node's allocatable; we report 0 (documented gap).
    let q = q.unwrap_or_else(|| "0".into());
    let value = if is_cpu {
        let div = divisor
            .and_then(quantity::cpu_millis)
            .filter(|d| *d > 0)
            .unwrap_or(1000);
        let m = quantity::cpu_millis(&q)?;
        (m + div - 1) / div
    } else {
        let div = divisor
            .and_then(quantity::bytes)
            .filter(|d| *d > 0)
            .unwrap_or(1);
        let b = quantity::bytes(&q)?;
        (b + div - 1) / div
    };
    Some(value.to_string())
}

/// The container's environment, in order, with `$(VAR)` expanded against earlier entries.
/// The ConfigMaps and Secrets a container's env refers to (name -> key -> value), fetched
/// from the API server beforehand; `None` where the node has no API server.
#[derive(Debug, Clone, Default)]
pub struct EnvRefs {
    pub connected: bool,
    pub config_maps: HashMap<String, BTreeMap<String, String>>,
    pub secrets: HashMap<String, BTreeMap<String, String>>,
}

impl EnvRefs {
    fn lookup(
        &self,
        secret: bool,
        name: &str,
        key: &str,
        optional: bool,
        env: &str,
    ) -> Result<Option<String>, String> {
        let (kind, maps) = if secret {
            ("secret", &self.secrets)
        } else {
            ("configmap", &self.config_maps)
        };
        if !self.connected {
            return Err(format!(
                "env {env:?}: {kind} {name:?} is needed but this node has no API server connection"
            ));
        }
        match maps.get(name) {
            None if optional => Ok(None),
            None => Err(format!("{kind} {name:?} not found")),
            Some(data) => match data.get(key) {
                Some(v) => Ok(Some(v.clone())),
                None if optional => Ok(None),
                None => Err(format!("couldn't find key {key} in {kind} {name}")),
            },
        }
    }
}

/// The names of the ConfigMaps and Secrets a container's env and envFrom use.
pub fn env_references(c: &Container) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for e in c.env.iter().flatten() {
        if let Some(from) = &e.value_from {
            if let Some(r) = &from.config_map_key_ref {
                cms.push(r.name.clone());
            }
            if let Some(r) = &from.secret_key_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    for f in c.env_from.iter().flatten() {
        if let Some(r) = &f.config_map_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &f.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// The container's environment: `envFrom` first, then `env` in order (overriding), with
/// `$(VAR)` expanded against the entries before it.
pub fn container_env(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
    pod_ip: &str,
    refs: &EnvRefs,
) -> Result<Vec<(String, String)>, String> {
    let mut vars: HashMap<String, String> = HashMap::new();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut budget = Budget::default();
    let mut set = |name: String, v: String, vars: &mut HashMap<String, String>| {
        vars.insert(name.clone(), v.clone());
        out.retain(|(n, _)| n != &name);
        out.push((name, v));
    };
    for f in c.env_from.iter().flatten() {
        let prefix = f.prefix.clone().unwrap_or_default();
        let (secret, name, optional) = match (&f.config_map_ref, &f.secret_ref) {
            (Some(r), _) => (false, r.name.clone(), r.optional.unwrap_or(false)),
            (_, Some(r)) => (true, r.name.clone(), r.optional.unwrap_or(false)),
            _ => continue,
        };
        let kind = if secret { "secret" } else { "configmap" };
        if !refs.connected {
            return Err(format!(
                "envFrom: {kind} {name:?} is needed but this node has no API server connection"
            ));
        }
        let maps = if secret {
            &refs.secrets
        } else {
            &refs.config_maps
        };
        match maps.get(&name) {
            None if optional => {}
            None => return Err(format!("{kind} {name:?} not found")),
            Some(data) => {
                for (k, v) in data {
                    // Keys that are not valid variable names are skipped, as upstream.
                    let var = format!("{prefix}{k}");
                    if !var.is_empty()
                        && !var.starts_with(|ch: char| ch.is_ascii_digit())
                        && var
                            .chars()
                            .all(|ch| ch.is_ascii_alphanumeric() || "_-.".contains(ch))
                    {
                        set(var, v.clone(), &mut vars);
                    }
                }
            }
        }
    }
    for EnvVar {
        name,
        value,
        value_from,
    } in c.env.clone().unwrap_or_default()
    {
        let v = match (value, value_from) {
            (Some(v), _) => Some(budget.expand(&format!("env {name:?}"), &v, &vars)?),
            (None, Some(from)) => {
                if let Some(f) = from.field_ref {
                    Some(field_ref(pod, &f.field_path, node, pod_ip).ok_or_else(|| {
                        format!("env {name:?}: unsupported fieldRef {:?}", f.field_path)
                    })?)
                } else if let Some(r) = from.resource_field_ref {
                    Some(
                        resource_field_ref(
                            c,
                            &r.resource,
                            r.divisor.as_ref().map(|d| d.0.as_str()),
                        )
                        .ok_or_else(|| {
                            format!(
                                "env {name:?}: unsupported resourceFieldRef {:?}",
                                r.resource
                            )
                        })?,
                    )
                } else if let Some(r) = from.config_map_key_ref {
                    refs.lookup(false, &r.name, &r.key, r.optional.unwrap_or(false), &name)?
                } else if let Some(r) = from.secret_key_ref {
                    refs.lookup(true, &r.name, &r.key, r.optional.unwrap_or(false), &name)?
                } else {
                    Some(String::new())
                }
            }
            (None, None) => Some(String::new()),
        };
        if let Some(v) = v {
            set(name, v, &mut vars);
        }
    }
    Ok(out)
}
