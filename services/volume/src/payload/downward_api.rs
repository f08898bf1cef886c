//! downwardAPI files: pod fields (upstream `fieldpath.ExtractFieldPathAsString`, with
//! labels and annotations as `fieldpath.FormatMap`) and container resources (upstream
//! `resource.ExtractResourceValueByContainerNameAndNodeAllocatable`), with upstream's
//! error wording.

use super::{FileProjection, Payload, PayloadError, aggregate, clean, mode};
use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use nodeagent_config::names::qualified_name_errors;
use nodeagent_config::quantity::{bytes, cpu_millis};
pub(crate) use nodeagent_telemetry::go_quote;
use std::collections::BTreeMap;

/// Upstream `downwardapi.CollectData`: one file per item; every failing item is reported.
pub(super) fn collect(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    node_allocatable: &BTreeMap<String, Quantity>,
    default_mode: u32,
) -> Result<Payload, PayloadError> {
    let mut payload = Payload::new();
    let mut errs = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let mode = match mode(&format!("items[{i}].mode"), item.mode, default_mode) {
            Ok(m) => m,
            Err(e) => {
                errs.push(e);
                continue;
            }
        };
        let value = if let Some(field) = &item.field_ref {
            field_value(pod, &field.field_path)
        } else if let Some(resource) = &item.resource_field_ref {
            resource_value(resource, pod, node_allocatable)
        } else {
            Ok(String::new())
        };
        match value {
            Ok(v) => {
                payload.insert(clean(&item.path), FileProjection::new(v, mode));
            }
            Err(e) => errs.push(PayloadError::DownwardApi(e)),
        }
    }
    aggregate(errs)?;
    Ok(payload)
}

/// A pod field as a string: `metadata.name`, `.namespace`, `.uid`, `.labels`,
/// `.annotations`, and one label or annotation as `metadata.labels['key']`.
pub fn field_value(pod: &Pod, field_path: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    if let Some((path, subscript)) = split_maybe_subscripted_path(field_path) {
        let (map, key_errors) = match path {
            "metadata.annotations" => (
                &meta.annotations,
                qualified_name_errors(&subscript.to_lowercase()),
            ),
            "metadata.labels" => (&meta.labels, qualified_name_errors(subscript)),
            _ => {
                return Err(format!(
                    "fieldPath {} does not support subscript",
                    go_quote(field_path)
                ));
            }
        };
        if !key_errors.is_empty() {
            return Err(format!(
                "invalid key subscript in {field_path}: {}",
                key_errors.join(";")
            ));
        }
        return Ok(map
            .as_ref()
            .and_then(|m| m.get(subscript))
            .cloned()
            .unwrap_or_default());
    }
    match field_path {
        "metadata.annotations" => Ok(format_map(meta.annotations.as_ref())),
        "metadata.labels" => Ok(format_map(meta.labels.as_ref())),
        "metadata.name" => Ok(meta.name.clone().unwrap_or_default()),
        "metadata.namespace" => Ok(meta.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Ok(meta.uid.clone().unwrap_or_default()),
        _ => Err(format!("unsupported fieldPath: {field_path}")),
    }
}

/// `metadata.labels['app']` -> (`metadata.labels`, `app`).
fn split_maybe_subscripted_path(field_path: &str) -> Option<(&str, &str)> {
    let inner = field_path.strip_suffix("']")?;
    let (path, subscript) = inner.split_once("['")?;
    (!path.is_empty()).then_some((path, subscript))
}

/// Upstream `fieldpath.FormatMap`: `key="value"` lines sorted by key, values quoted as Go's
/// `%q`, no trailing newline.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A container resource as a string, in units of the selector's `divisor` (default 1),
/// rounded up. An unset or zero cpu, memory or ephemeral-storage limit is the node's
/// allocatable (upstream `MergeContainerResourceLimits`); an unset request is 0.
pub fn resource_value(
    selector: &ResourceFieldSelector,
    pod: &Pod,
    node_allocatable: &BTreeMap<String, Quantity>,
) -> Result<String, String> {
    let name = selector.container_name.as_deref().unwrap_or_default();
    let container =
        find_container(pod, name).ok_or_else(|| format!("container {name} not found"))?;
    let resources = container.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let request = |r: &str| requests.and_then(|m| m.get(r)).map(|q| q.0.as_str());
    let limit = |r: &str| limits.and_then(|m| m.get(r)).map(|q| q.0.as_str());
    let merged_limit = |r: &str| match limit(r) {
        Some(q) if cpu_millis(q) != Some(0) => Some(q),
        set => node_allocatable.get(r).map(|q| q.0.as_str()).or(set),
    };
    let divisor = match selector.divisor.as_ref().map(|q| q.0.as_str()) {
        Some(d) if cpu_millis(d) != Some(0) => d,
        _ => "1",
    };
    let resource = selector.resource.as_str();
    let value = match resource {
        "limits.cpu" => in_millis(merged_limit("cpu"), divisor),
        "limits.memory" => in_units(merged_limit("memory"), divisor),
        "limits.ephemeral-storage" => in_units(merged_limit("ephemeral-storage"), divisor),
        "requests.cpu" => in_millis(request("cpu"), divisor),
        "requests.memory" => in_units(request("memory"), divisor),
        "requests.ephemeral-storage" => in_units(request("ephemeral-storage"), divisor),
        other => match other.split_once('.') {
            Some(("requests", r)) if r.starts_with("hugepages-") => in_units(request(r), divisor),
            Some(("limits", r)) if r.starts_with("hugepages-") => in_units(limit(r), divisor),
            _ => return Err(format!("unsupported container resource : {resource}")),
        },
    };
    value.ok_or_else(|| format!("{resource}: invalid quantity or divisor {divisor:?}"))
}

/// Containers, then init containers, as upstream `findContainerInPod`.
fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// `ceil(value.MilliValue() / divisor.MilliValue())`; an unset value is 0.
fn in_millis(value: Option<&str>, divisor: &str) -> Option<String> {
    let v = value.map_or(Some(0), cpu_millis)?;
    let d = cpu_millis(divisor)?;
    Some((((v as f64) / (d as f64)).ceil() as i64).to_string())
}

/// `ceil(value.Value() / divisor.Value())`; an unset value is 0.
fn in_units(value: Option<&str>, divisor: &str) -> Option<String> {
    let v = value.map_or(Some(0), bytes)?;
    let d = bytes(divisor)?;
    Some((((v as f64) / (d as f64)).ceil() as i64).to_string())
}
