//! Server-side printing for the test API server: `kubectl get` asks for
//! `application/json;as=Table;v=v1;g=meta.k8s.io` and prints the cells the server
//! computes. Pods and nodes get upstream's columns and cell logic
//! (pkg/printers/internalversion: `printPod`, `printNode`); other kinds get upstream's
//! default columns, Name and Created At. Without a Table a kubectl prints only NAME and
//! AGE, so a pod's READY and STATUS would be invisible.

use serde_json::{Value, json};

/// Whether an `Accept` header asks for a `meta.k8s.io` Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        params.contains(&"as=Table") && params.contains(&"g=meta.k8s.io")
    })
}

/// The Table of a list (`<Kind>List`) or of one object; `include_object` is the request's
/// `includeObject` (None, Metadata (the default) or Object).
pub fn to_table(body: &Value, include_object: Option<&str>) -> Value {
    let (items, resource_version) = match body["items"].as_array() {
        Some(items) => (items.clone(), body["metadata"]["resourceVersion"].clone()),
        None => (
            vec![body.clone()],
            body["metadata"]["resourceVersion"].clone(),
        ),
    };
    let kind = match body["items"].is_array() {
        true => body["kind"]
            .as_str()
            .unwrap_or_default()
            .trim_end_matches("List")
            .to_string(),
        false => body["kind"].as_str().unwrap_or_default().to_string(),
    };
    let now = now();
    let rows: Vec<Value> = items
        .iter()
        .map(|item| {
            let cells = match kind.as_str() {
                "Pod" => pod_cells(item, now),
                "Node" => node_cells(item, now),
                _ => vec![
                    item["metadata"]["name"].clone(),
                    item["metadata"]["creationTimestamp"].clone(),
                ],
            };
            let object = match include_object {
                Some("None") => Value::Null,
                Some("Object") => item.clone(),
                _ => json!({
                    "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": item["metadata"],
                }),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns(&kind), "rows": rows,
    })
}

fn column(name: &str, ty: &str, format: &str, priority: u8, description: &str) -> Value {
    json!({"name": name, "type": ty, "format": format, "priority": priority, "description": description})
}

fn columns(kind: &str) -> Vec<Value> {
    let name = column(
        "Name",
        "string",
        "name",
        0,
        "Name must be unique within a namespace.",
    );
    let age = column(
        "Age",
        "string",
        "",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    match kind {
        "Pod" => vec![
            name,
            column(
                "Ready",
                "string",
                "",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            column(
                "Status",
                "string",
                "",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            column(
                "Restarts",
                "string",
                "",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            age,
            column(
                "IP",
                "string",
                "",
                1,
                "IP address allocated to the pod. Routable at least within the cluster.",
            ),
            column(
                "Node",
                "string",
                "",
                1,
                "NodeName is a request to schedule this pod onto a specific node.",
            ),
        ],
        "Node" => vec![
            name,
            column("Status", "string", "", 0, "The status of the node"),
            column("Roles", "string", "", 0, "The roles of the node"),
            age,
            column(
                "Version",
                "string",
                "",
                0,
                "Kubelet Version reported by the node.",
            ),
            column(
                "Internal-IP",
                "string",
                "",
                1,
                "List of internal IPs for the node.",
            ),
            column(
                "OS-Image",
                "string",
                "",
                1,
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
            ),
            column(
                "Kernel-Version",
                "string",
                "",
                1,
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
            ),
            column(
                "Container-Runtime",
                "string",
                "",
                1,
                "Container runtime version reported by the node.",
            ),
        ],
        _ => vec![
            name,
            column(
                "Created At",
                "date",
                "",
                0,
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
            ),
        ],
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

fn seconds(timestamp: &Value) -> Option<i64> {
    timestamp
        .as_str()?
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

/// upstream's `translateTimestampSince`: "<unknown>" for no time, else a human duration.
fn since(timestamp: &Value, now: i64) -> String {
    match seconds(timestamp) {
        Some(t) => human_duration(now - t),
        None => "<unknown>".into(),
    }
}

/// apimachinery's `duration.HumanDuration`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    let y = d / 365;
    if s < 60 * 2 {
        format!("{s}s")
    } else if m < 10 {
        match s % 60 {
            0 => format!("{m}m"),
            rest => format!("{m}m{rest}s"),
        }
    } else if m < 60 * 3 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            rest => format!("{h}h{rest}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        match h % 24 {
            0 => format!("{d}d"),
            rest => format!("{d}d{rest}h"),
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else if d < 365 * 8 {
        match d % 365 {
            0 => format!("{y}y"),
            rest => format!("{y}y{rest}d"),
        }
    } else {
        format!("{y}y")
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// A terminated state's reason, or `<prefix>Signal:N` / `<prefix>ExitCode:N`.
fn terminated_reason(terminated: &Value, prefix: &str) -> String {
    match text(&terminated["reason"]) {
        "" => match terminated["signal"].as_i64().unwrap_or(0) {
            0 => format!(
                "{prefix}ExitCode:{}",
                terminated["exitCode"].as_i64().unwrap_or(0)
            ),
            signal => format!("{prefix}Signal:{signal}"),
        },
        reason => format!("{prefix}{reason}"),
    }
}

fn condition_true(status: &Value, ty: &str) -> bool {
    status["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

/// upstream's `printPod`: Name, Ready, Status, Restarts, Age, IP, Node.
fn pod_cells(pod: &Value, now: i64) -> Vec<Value> {
    let status = &pod["status"];
    let empty = Vec::new();
    let statuses = status["containerStatuses"].as_array().unwrap_or(&empty);
    let init_statuses = status["initContainerStatuses"].as_array().unwrap_or(&empty);
    let init_count = pod["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let mut reason = match text(&status["reason"]) {
        "" => text(&status["phase"]).to_string(),
        r => r.to_string(),
    };
    let mut restarts = 0;
    let mut last_restart: Option<i64> = None;
    let mut note_restart = |c: &Value| {
        restarts += c["restartCount"].as_i64().unwrap_or(0);
        if let Some(t) = seconds(&c["lastState"]["terminated"]["finishedAt"]) {
            last_restart = Some(last_restart.map_or(t, |l| l.max(t)));
        }
    };
    let mut initializing = false;
    for (i, c) in init_statuses.iter().enumerate() {
        note_restart(c);
        let state = &c["state"];
        let terminated = &state["terminated"];
        if terminated.is_object() && terminated["exitCode"].as_i64() == Some(0) {
            continue;
        }
        initializing = true;
        let waiting = text(&state["waiting"]["reason"]);
        reason = if terminated.is_object() {
            terminated_reason(terminated, "Init:")
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            format!("Init:{waiting}")
        } else {
            format!("Init:{i}/{init_count}")
        };
        break;
    }
    let mut ready = 0;
    if !initializing || condition_true(status, "Initialized") {
        let mut running = false;
        for c in statuses.iter().rev() {
            note_restart(c);
            let state = &c["state"];
            let waiting = text(&state["waiting"]["reason"]);
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if state["terminated"].is_object() {
                reason = terminated_reason(&state["terminated"], "");
            } else if c["ready"] == true && state["running"].is_object() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            reason = match condition_true(status, "Ready") {
                true => "Running".into(),
                false => "NotReady".into(),
            };
        }
    }
    let phase = text(&status["phase"]);
    if pod["metadata"]["deletionTimestamp"].is_string() {
        if text(&status["reason"]) == "NodeLost" {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }
    let restarts = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", human_duration(now - t)),
        _ => restarts.to_string(),
    };
    let or_none = |v: &str| match v {
        "" => "<none>".to_string(),
        v => v.to_string(),
    };
    vec![
        pod["metadata"]["name"].clone(),
        format!("{ready}/{total}").into(),
        reason.into(),
        restarts.into(),
        since(&pod["metadata"]["creationTimestamp"], now).into(),
        or_none(text(&status["podIP"])).into(),
        or_none(text(&pod["spec"]["nodeName"])).into(),
    ]
}

/// upstream's `printNode`: Name, Status, Roles, Age, Version and the wide columns.
fn node_cells(node: &Value, now: i64) -> Vec<Value> {
    let status = &node["status"];
    let ready = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
    let mut state = match ready {
        Some(c) if c["status"] == "True" => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if node["spec"]["unschedulable"] == true {
        state.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = node["metadata"]["labels"]
        .as_object()
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
                    Some(role) if !role.is_empty() => Some(role.to_string()),
                    _ if k == "kubernetes.io/role" => v.as_str().map(str::to_string),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    let roles = match roles.is_empty() {
        true => "<none>".to_string(),
        false => roles.join(","),
    };
    let internal_ip = status["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .map_or("<none>", |a| text(&a["address"]));
    let info = &status["nodeInfo"];
    vec![
        node["metadata"]["name"].clone(),
        state.into(),
        roles.into(),
        since(&node["metadata"]["creationTimestamp"], now).into(),
        info["kubeletVersion"].clone(),
        internal_ip.into(),
        info["osImage"].clone(),
        info["kernelVersion"].clone(),
        info["containerRuntimeVersion"].clone(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_kubectl_prints_them() {
        for (s, want) in [
            (5, "5s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 3600, "3d1h"),
            (100 * 86400, "100d"),
        ] {
            assert_eq!(human_duration(s), want);
        }
    }

    #[test]
    fn running_and_crashing_pods() {
        let running = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "c", "ready": true, "restartCount": 0, "state": {"running": {}}}]}});
        let cells = pod_cells(&running, 0);
        assert_eq!(cells[1], "1/1");
        assert_eq!(cells[2], "Running");
        assert_eq!(cells[3], "0");
        let crashing = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "c", "ready": false, "restartCount": 2,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        let cells = pod_cells(&crashing, 0);
        assert_eq!(
            (cells[1].clone(), cells[2].clone()),
            ("0/1".into(), "CrashLoopBackOff".into())
        );
        let table = to_table(
            &json!({"kind": "PodList", "items": [running], "metadata": {}}),
            None,
        );
        assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(table["columnDefinitions"][2]["name"], "Status");
    }

    #[test]
    fn accept_headers() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
