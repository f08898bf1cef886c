//! Two loops of the control plane that a cluster of several nodes shows to kubectl, as
//! decisions (pure functions, tested below) that the test API server applies every
//! 500 ms once `ApiState::run_cluster_controllers` says so (the standalone
//! `nodeagent-test-apiserver` does; the suite's tests opt in):
//!
//! - **kube-scheduler**, reduced to what a node agent's test needs: a pod created without
//!   `spec.nodeName` (and for the `default-scheduler`) is bound to a node that is Ready,
//!   not `unschedulable`, carries every label of the pod's `nodeSelector` and no
//!   NoSchedule/NoExecute taint the pod does not tolerate; of those, the one with the fewest
//!   bound pods that have not finished (ties: by name). Bound, the pod gets `PodScheduled`
//!   True and upstream's `Scheduled` event ("Successfully assigned ns/name to node", from
//!   default-scheduler); when no node fits, `PodScheduled` False with reason Unschedulable
//!   and upstream's "0/N nodes are available: ..." message, and a FailedScheduling event.
//!   NodeResourcesFit is checked against each node's allocatable (pods, cpu, memory:
//!   `Too many pods`, `Insufficient cpu`); required node affinity as NodeAffinity filters
//!   (`node_affinity_matches`); not considered: preferred affinity, pod (anti-)affinity,
//!   topology spread, preemption (the message says no victims were found, as with pods of
//!   one priority).
//! - **the node lifecycle controller** (pkg/controller/nodelifecycle,
//!   `tryUpdateNodeHealth`): a node whose kubelet renewed neither its status heartbeat
//!   (Ready's `lastHeartbeatTime`) nor its Lease (`kube-node-lease/<node>`'s `renewTime`)
//!   for `--node-monitor-grace-period` (upstream's default 50 s since 1.32), as this
//!   server's clock sees it, gets its Ready, MemoryPressure, DiskPressure and PIDPressure
//!   conditions set Unknown with upstream's reason `NodeStatusUnknown` and message
//!   "Kubelet stopped posting node status." (a node that never posted Ready: after the
//!   startup grace period, 60 s, `NodeStatusNeverUpdated`, "Kubelet never posted node
//!   status."), the `node.kubernetes.io/unreachable` NoSchedule and NoExecute taints, and
//!   its pods' Ready condition False (upstream's `MarkPodsNotReady`). A kubelet that posts
//!   Ready True again gets the taints lifted. The NoExecute taints' evictions are
//!   `apiserver_taints`'.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Upstream's `--node-monitor-grace-period` default (50 s since Kubernetes 1.32).
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(50);
/// Upstream's `--node-startup-grace-period` default.
const NODE_STARTUP_GRACE_PERIOD: Duration = Duration::from_secs(60);
/// How often the loops run (upstream's `--node-monitor-period` is 5 s; a test cluster
/// answers faster).
const PERIOD: Duration = Duration::from_millis(500);

pub use crate::apiserver_taints::UNREACHABLE_TAINT;
use crate::apiserver_taints::{NOT_READY_TAINT, tolerates};
const SCHEDULER: &str = "default-scheduler";
/// The conditions upstream's controller sets Unknown (`nodeConditionTypes`).
const WATCHED_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// The controllers' settings and memory (when each node was last heard from, by this
/// server's clock: upstream's `probeTimestamp`, never the kubelet's own timestamps).
#[derive(Clone, Default)]
pub struct ClusterControllers {
    inner: Arc<Mutex<Controllers>>,
}

#[derive(Default)]
struct Controllers {
    enabled: bool,
    grace: Option<Duration>,
    /// node name -> (heartbeat marker, when it last changed)
    heard: HashMap<String, (String, Instant)>,
}

impl ClusterControllers {
    /// Turns the scheduler and the node lifecycle controller on, with this grace period
    /// (None: upstream's default).
    pub fn enable(&self, node_monitor_grace_period: Option<Duration>) {
        let mut c = self.inner.lock().unwrap();
        c.enabled = true;
        c.grace = node_monitor_grace_period;
    }

    pub(crate) fn enabled(&self) -> bool {
        self.inner.lock().unwrap().enabled
    }
}

/// Runs the loops against `state` until the task is aborted (the server stops).
pub(crate) async fn run(state: crate::apiserver::ApiState) {
    let mut tick = tokio::time::interval(PERIOD);
    let mut changes = state.changes();
    let mut planned = crate::apiserver_taints::Planned::default();
    loop {
        // Every period, and at once when a pod is created (a pod waits for its binding no
        // longer than the write takes).
        tokio::select! {
            _ = tick.tick() => {}
            change = changes.recv() => match change {
                Ok(c) if c.plural == "pods" && c.kind == "ADDED" => {}
                Ok(_) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
        if state.cluster.enabled() {
            sync_nodes(&state);
            crate::apiserver_taints::evict(&state, &mut planned);
            schedule(&state);
        }
    }
}

/// What the heartbeat of a node is made of: its Ready heartbeat and its Lease's renewal.
fn heartbeat(node: &Value, lease: Option<&Value>) -> String {
    let ready = condition(node, "Ready")
        .map(|c| c["lastHeartbeatTime"].to_string())
        .unwrap_or_default();
    let renew = lease
        .map(|l| l["spec"]["renewTime"].to_string())
        .unwrap_or_default();
    format!("{ready}|{renew}")
}

/// The condition of type `ty` in an object's `status.conditions` (a pod's or a node's).
pub fn condition<'a>(object: &'a Value, ty: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

fn has_unreachable_taint(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == UNREACHABLE_TAINT))
}

/// The node as the lifecycle controller leaves it after `silent_for` without a heartbeat
/// (None: nothing to change). `now` is the RFC 3339 time written into what changes.
pub(crate) fn node_health(
    node: &Value,
    silent_for: Duration,
    grace: Duration,
    now: &str,
) -> Option<Value> {
    let ready = condition(node, "Ready");
    let ready_true = ready.is_some_and(|c| c["status"] == "True");
    let mut next = node.clone();
    if ready_true {
        if silent_for <= grace {
            // Healthy: lift the taints this controller put on while it was silent.
            if !has_unreachable_taint(node) {
                return None;
            }
            let taints: Vec<Value> = node["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["key"] != UNREACHABLE_TAINT)
                .cloned()
                .collect();
            if taints.is_empty() {
                next["spec"].as_object_mut()?.remove("taints");
            } else {
                next["spec"]["taints"] = taints.into();
            }
            return Some(next);
        }
    } else if ready.is_some() {
        // NotReady or already Unknown: the kubelet's own word (or ours) stands, but the
        // NoSchedule taint follows an Unknown Ready (upstream's taint-by-condition).
        let unknown = ready.is_some_and(|c| c["status"] == "Unknown");
        if !unknown || has_unreachable_taint(node) {
            return None;
        }
        add_unreachable_taints(&mut next, now);
        return Some(next);
    } else if silent_for <= NODE_STARTUP_GRACE_PERIOD {
        return None;
    }
    let (reason, message) = if ready.is_none() {
        (
            "NodeStatusNeverUpdated",
            "Kubelet never posted node status.",
        )
    } else {
        ("NodeStatusUnknown", "Kubelet stopped posting node status.")
    };
    let conditions = next["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for ty in WATCHED_CONDITIONS {
        let mut c = conditions
            .iter()
            .find(|c| c["type"] == ty)
            .cloned()
            .unwrap_or_else(|| json!({"type": ty, "lastHeartbeatTime": now}));
        if c["status"] != "Unknown" {
            c["status"] = "Unknown".into();
            c["reason"] = reason.into();
            c["message"] = message.into();
            c["lastTransitionTime"] = now.into();
        }
        out.push(c);
    }
    // Conditions the controller does not own (NetworkUnavailable, ...) keep their place
    // after its own.
    out.extend(
        conditions
            .into_iter()
            .filter(|c| !WATCHED_CONDITIONS.iter().any(|w| c["type"] == *w)),
    );
    next["status"]["conditions"] = out.into();
    add_unreachable_taints(&mut next, now);
    Some(next)
}

fn add_unreachable_taints(node: &mut Value, now: &str) {
    let mut taints: Vec<Value> = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !taints.iter().any(|t| t["key"] == UNREACHABLE_TAINT) {
        taints.push(json!({"key": UNREACHABLE_TAINT, "effect": "NoSchedule"}));
        taints.push(json!({"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": now}));
    }
    node["spec"]["taints"] = taints.into();
}

/// A pod on a node that went Unknown, as upstream's `MarkPodsNotReady` leaves it (None:
/// already not Ready).
pub(crate) fn pod_not_ready(pod: &Value, now: &str) -> Option<Value> {
    let ready = condition(pod, "Ready")?;
    if ready["status"] == "False" {
        return None;
    }
    let mut next = pod.clone();
    for c in next["status"]["conditions"].as_array_mut()? {
        if c["type"] == "Ready" {
            c["status"] = "False".into();
            c["lastTransitionTime"] = now.into();
        }
    }
    Some(next)
}

fn sync_nodes(state: &crate::apiserver::ApiState) {
    let grace = state.cluster.inner.lock().unwrap().grace;
    let grace = grace.unwrap_or(NODE_MONITOR_GRACE_PERIOD);
    let now = crate::apiserver::now();
    for node in state.objects("nodes") {
        let Some(name) = node["metadata"]["name"].as_str().map(str::to_string) else {
            continue;
        };
        let lease = state.object("leases", "kube-node-lease", &name);
        let beat = heartbeat(&node, lease.as_ref());
        let silent_for = {
            let mut c = state.cluster.inner.lock().unwrap();
            let entry = c
                .heard
                .entry(name.clone())
                .or_insert_with(|| (beat.clone(), Instant::now()));
            if entry.0 != beat {
                *entry = (beat, Instant::now());
            }
            entry.1.elapsed()
        };
        let Some(next) = node_health(&node, silent_for, grace, &now) else {
            continue;
        };
        let went_unknown = condition(&next, "Ready").is_some_and(|c| c["status"] == "Unknown")
            && condition(&node, "Ready").is_none_or(|c| c["status"] != "Unknown");
        state.modify("nodes", "", &name, |n| *n = next);
        if went_unknown {
            eprintln!(
                "nodeagent-test-apiserver: node {name} silent for {silent_for:?}: Ready Unknown"
            );
            for pod in state.objects("pods") {
                if pod["spec"]["nodeName"] != name.as_str() {
                    continue;
                }
                if let Some(next) = pod_not_ready(&pod, &now) {
                    let (ns, pod_name) = (
                        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                        pod["metadata"]["name"].as_str().unwrap_or_default(),
                    );
                    state.modify("pods", ns, pod_name, |p| *p = next);
                }
            }
        }
    }
}

/// What the pods bound to a node (and not finished) take of it: their count and the
/// cpu (millicores) and memory (bytes) they request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Load {
    pub pods: usize,
    pub cpu_millis: i64,
    pub memory: i64,
}

impl Load {
    fn add(&mut self, pod: &Value) {
        let (cpu, memory) = requests(pod);
        self.pods += 1;
        self.cpu_millis += cpu;
        self.memory += memory;
    }
}

/// A pod's cpu (millicores) and memory (bytes) requests as the scheduler counts them
/// (upstream's `PodRequests`): its containers and restartable init containers (sidecars)
/// together, or its largest other init container with the sidecars before it if that is
/// more, plus `overhead`. A request left out is its limit (the API's defaulting).
fn requests(pod: &Value) -> (i64, i64) {
    let amount = |c: &Value, resource: &str| -> i64 {
        let resources = &c["resources"];
        let q = resources["requests"][resource]
            .as_str()
            .or(resources["limits"][resource].as_str());
        let parse = |q: &str| match resource {
            "cpu" => nodeagent_config::quantity::cpu_millis(q),
            _ => nodeagent_config::quantity::bytes(q),
        };
        q.and_then(parse).unwrap_or(0).max(0)
    };
    let spec = &pod["spec"];
    let each = |resource: &str| -> i64 {
        let mut running: i64 = spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| amount(c, resource))
            .sum();
        let (mut sidecars, mut init_peak) = (0i64, 0i64);
        for c in spec["initContainers"].as_array().into_iter().flatten() {
            if c["restartPolicy"] == "Always" {
                sidecars += amount(c, resource);
                init_peak = init_peak.max(sidecars);
            } else {
                init_peak = init_peak.max(sidecars + amount(c, resource));
            }
        }
        running += sidecars;
        let overhead = spec["overhead"][resource]
            .as_str()
            .and_then(|q| match resource {
                "cpu" => nodeagent_config::quantity::cpu_millis(q),
                _ => nodeagent_config::quantity::bytes(q),
            })
            .unwrap_or(0);
        running.max(init_peak) + overhead
    };
    (each("cpu"), each("memory"))
}

/// NodeResourcesFit's reasons for `node` (pkg/scheduler/framework/plugins/noderesources
/// `fitsRequest`): `Too many pods` past its allocatable pods, `Insufficient <resource>`
/// for a request (a positive one) above what is left of its allocatable.
fn resource_misfits(pod: &Value, node: &Value, load: Load) -> Vec<&'static str> {
    let allocatable = &node["status"]["allocatable"];
    let get = |resource: &str| {
        allocatable[resource].as_str().and_then(|q| match resource {
            "cpu" => nodeagent_config::quantity::cpu_millis(q),
            _ => nodeagent_config::quantity::bytes(q),
        })
    };
    let mut misfits = Vec::new();
    if let Some(pods) = get("pods")
        && load.pods as i64 + 1 > pods
    {
        misfits.push("Too many pods");
    }
    let (cpu, memory) = requests(pod);
    if let Some(free) = get("cpu")
        && cpu > 0
        && cpu > free - load.cpu_millis
    {
        misfits.push("Insufficient cpu");
    }
    if let Some(free) = get("memory")
        && memory > 0
        && memory > free - load.memory
    {
        misfits.push("Insufficient memory");
    }
    misfits
}

/// Where the scheduler binds `pod`: the name of the fitting node with the fewest pods
/// (`load`), or upstream's FailedScheduling message.
/// Upstream's NodeAffinity filter (component-helpers' `nodeaffinity`): every label of the
/// pod's `nodeSelector`, and, when it has one, a term of its required node affinity
/// (`requiredDuringSchedulingIgnoredDuringExecution`: the terms ORed, each term's
/// `matchExpressions` on labels and `matchFields` on `metadata.name` ANDed; a term with
/// neither, or a selector with no term, matches no node).
pub fn node_affinity_matches(pod: &Value, node: &Value) -> bool {
    let labels = &node["metadata"]["labels"];
    let selected = pod["spec"]["nodeSelector"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels[k] == *v);
    let required =
        &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if !selected {
        return false;
    }
    if required.is_null() {
        return true;
    }
    let terms = required["nodeSelectorTerms"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let fields = json!({"metadata.name": node["metadata"]["name"]});
    terms.iter().any(|term| {
        let exprs = term["matchExpressions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let on_fields = term["matchFields"].as_array().cloned().unwrap_or_default();
        (!exprs.is_empty() || !on_fields.is_empty())
            && exprs.iter().all(|e| requirement_matches(e, labels))
            && on_fields.iter().all(|e| requirement_matches(e, &fields))
    })
}

/// One `NodeSelectorRequirement` against `labels` (a label map, or the fields).
fn requirement_matches(req: &Value, labels: &Value) -> bool {
    let key = req["key"].as_str().unwrap_or_default();
    let value = labels[key].as_str();
    let values: Vec<&str> = req["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    // An invalid value makes the selector unparsable: it matches nothing (upstream's
    // label selector parse error).
    if !values.iter().all(|v| valid_label_value(v)) {
        return false;
    }
    // Gt and Lt: one integer value, compared with the label's, both parsed as integers.
    let compare = |ord: std::cmp::Ordering| {
        let (Some(have), [want]) = (value.and_then(|v| v.parse::<i64>().ok()), values.as_slice())
        else {
            return false;
        };
        want.parse::<i64>().is_ok_and(|w| have.cmp(&w) == ord)
    };
    match req["operator"].as_str().unwrap_or_default() {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

/// A label value as apimachinery's `IsValidLabelValue` allows: at most 63 characters,
/// alphanumerics, `-`, `_` and `.`, beginning and ending with an alphanumeric (or empty).
fn valid_label_value(v: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(alnum)
            && v.ends_with(alnum)
            && v.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.')))
}

pub(crate) fn pick_node(
    pod: &Value,
    nodes: &[Value],
    load: &HashMap<String, Load>,
) -> Result<String, String> {
    let mut unschedulable = 0;
    let mut selector = 0;
    let mut taints: std::collections::BTreeMap<String, usize> = Default::default();
    let mut misfits: std::collections::BTreeMap<&str, usize> = Default::default();
    // Nodes that failed only for resources: preemption could have freed them.
    let mut short_of_resources = 0;
    let mut fits: Vec<&str> = Vec::new();
    for node in nodes {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        if node["spec"]["unschedulable"] == true {
            unschedulable += 1;
            continue;
        }
        // A node that is not Ready carries upstream's not-ready taint (the lifecycle
        // controller's taint-by-condition), unless it is already tainted unreachable.
        let mut node_taints: Vec<Value> = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if condition(node, "Ready").is_none_or(|c| c["status"] != "True")
            && !has_unreachable_taint(node)
        {
            node_taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
        }
        let untolerated = node_taints.iter().find(|t| {
            matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")) && !tolerates(pod, t)
        });
        if let Some(t) = untolerated {
            let shown = format!(
                "{{{}: {}}}",
                t["key"].as_str().unwrap_or_default(),
                t["value"].as_str().unwrap_or_default()
            );
            *taints.entry(shown).or_default() += 1;
            continue;
        }
        if !node_affinity_matches(pod, node) {
            selector += 1;
            continue;
        }
        let short = resource_misfits(pod, node, load.get(name).copied().unwrap_or_default());
        if !short.is_empty() {
            short_of_resources += 1;
            for reason in short {
                *misfits.entry(reason).or_default() += 1;
            }
            continue;
        }
        fits.push(name);
    }
    if let Some(best) = fits
        .iter()
        .min_by_key(|n| (load.get(**n).map_or(0, |l| l.pods), n.to_string()))
    {
        return Ok(best.to_string());
    }
    // Upstream's reasons, "<count> <reason>" sorted as text, as the scheduler's
    // FitError.Error prints them (pkg/scheduler/framework/types.go), each part closed by
    // its `SeparatorFormat` " %v.", so that the preemption part, which ends with its own
    // period, ends with two (as kube-scheduler's messages do since 1.27).
    let mut reasons: Vec<String> = Vec::new();
    if selector > 0 {
        reasons.push(format!(
            "{selector} node(s) didn't match Pod's node affinity/selector"
        ));
    }
    for (taint, n) in taints {
        reasons.push(format!("{n} node(s) had untolerated taint {taint}"));
    }
    if unschedulable > 0 {
        reasons.push(format!("{unschedulable} node(s) were unschedulable"));
    }
    for (misfit, n) in misfits {
        reasons.push(format!("{n} {misfit}"));
    }
    reasons.sort();
    let mut message = format!("0/{} nodes are available:", nodes.len());
    if !reasons.is_empty() {
        message.push_str(&format!(" {}.", reasons.join(", ")));
    }
    if !nodes.is_empty() {
        // DefaultPreemption's word per node: victims could not be found where only
        // resources were short, preemption cannot help elsewhere.
        let mut verdicts = Vec::new();
        if short_of_resources > 0 {
            verdicts.push(format!(
                "{short_of_resources} No preemption victims found for incoming pod"
            ));
        }
        let unhelpful = nodes.len() - short_of_resources;
        if unhelpful > 0 {
            verdicts.push(format!(
                "{unhelpful} Preemption is not helpful for scheduling"
            ));
        }
        verdicts.sort();
        message.push_str(&format!(
            " preemption: 0/{} nodes are available: {}..",
            nodes.len(),
            verdicts.join(", ")
        ));
    }
    Err(message)
}

fn finished(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

fn schedule(state: &crate::apiserver::ApiState) {
    let pods = state.objects("pods");
    let pending: Vec<&Value> = pods
        .iter()
        .filter(|p| {
            p["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
                && p["metadata"]["deletionTimestamp"].is_null()
                && p["spec"]["schedulerName"]
                    .as_str()
                    .is_none_or(|s| s.is_empty() || s == SCHEDULER)
                && !finished(p)
        })
        .collect();
    if pending.is_empty() {
        return;
    }
    let nodes = state.objects("nodes");
    let mut load: HashMap<String, Load> = HashMap::new();
    for p in &pods {
        if let Some(n) = p["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())
            && !finished(p)
        {
            load.entry(n.to_string()).or_default().add(p);
        }
    }
    let now = crate::apiserver::now();
    for pod in pending {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        match pick_node(pod, &nodes, &load) {
            Ok(node) => {
                let bound = state.modify("pods", ns, name, |p| {
                    p["spec"]["nodeName"] = node.clone().into();
                    set_scheduled(
                        p,
                        json!({"type": "PodScheduled", "status": "True",
                        "lastProbeTime": null, "lastTransitionTime": now}),
                    );
                });
                if bound.is_some() {
                    load.entry(node.clone()).or_default().add(pod);
                    let message = format!("Successfully assigned {ns}/{name} to {node}");
                    event(
                        state,
                        pod,
                        SCHEDULER,
                        ("Normal", "Scheduled", &message),
                        &now,
                    );
                }
            }
            Err(message) => {
                let same = condition(pod, "PodScheduled")
                    .is_some_and(|c| c["status"] == "False" && c["message"] == message.as_str());
                if same {
                    continue;
                }
                state.modify("pods", ns, name, |p| {
                    set_scheduled(
                        p,
                        json!({"type": "PodScheduled", "status": "False",
                        "reason": "Unschedulable", "message": message,
                        "lastProbeTime": null, "lastTransitionTime": now}),
                    );
                    if p["status"]["phase"].is_null() {
                        p["status"]["phase"] = "Pending".into();
                    }
                });
                let what = ("Warning", "FailedScheduling", message.as_str());
                event(state, pod, SCHEDULER, what, &now);
            }
        }
    }
}

fn set_scheduled(pod: &mut Value, cond: Value) {
    let mut conditions: Vec<Value> = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c["type"] != "PodScheduled");
    conditions.push(cond);
    pod["status"]["conditions"] = conditions.into();
}

/// A core/v1 Event about `pod` from `component`: (type, reason, message).
pub(crate) fn event(
    state: &crate::apiserver::ApiState,
    pod: &Value,
    component: &str,
    (ty, reason, message): (&str, &str, &str),
    now: &str,
) {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let event = json!({
        "metadata": {"generateName": format!("{name}.")},
        "involvedObject": {
            "kind": "Pod", "apiVersion": "v1", "namespace": ns, "name": name,
            "uid": pod["metadata"]["uid"], "resourceVersion": pod["metadata"]["resourceVersion"],
        },
        "reason": reason, "message": message, "type": ty,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    state.add("events", ns, event);
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-11-26T12:00:00Z";
    const GRACE: Duration = NODE_MONITOR_GRACE_PERIOD;

    fn node(name: &str, ready: &str) -> Value {
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "DiskPressure", "status": "False"},
                {"type": "PIDPressure", "status": "False"},
                {"type": "Ready", "status": ready, "reason": "KubeletReady",
                 "lastHeartbeatTime": "2026-11-26T11:00:00Z"},
            ]},
        })
    }

    fn cond<'a>(n: &'a Value, ty: &str) -> &'a Value {
        condition(n, ty).unwrap()
    }

    // pkg/controller/nodelifecycle/node_lifecycle_controller_test.go,
    // TestMonitorNodeHealthUpdateStatus: "Node created long time ago, and kubelet posted
    // NotReady/Ready status long time ago" -> every condition Unknown, NodeStatusUnknown,
    // "Kubelet stopped posting node status.".
    #[test]
    fn a_silent_ready_node_goes_unknown_with_upstream_reason_and_taints() {
        let n = node("a", "True");
        assert_eq!(
            node_health(&n, GRACE, GRACE, NOW),
            None,
            "within the grace period"
        );
        let next = node_health(&n, GRACE + Duration::from_secs(1), GRACE, NOW).unwrap();
        for ty in WATCHED_CONDITIONS {
            let c = cond(&next, ty);
            assert_eq!(c["status"], "Unknown", "{ty}");
            assert_eq!(c["reason"], "NodeStatusUnknown");
            assert_eq!(c["message"], "Kubelet stopped posting node status.");
            assert_eq!(c["lastTransitionTime"], NOW);
        }
        // The heartbeat is left as the kubelet last posted it.
        assert_eq!(
            cond(&next, "Ready")["lastHeartbeatTime"],
            "2026-11-26T11:00:00Z"
        );
        let taints = next["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 2);
        assert!(taints.iter().any(|t| t["effect"] == "NoSchedule"));
        assert!(
            taints
                .iter()
                .any(|t| t["effect"] == "NoExecute" && t["timeAdded"] == NOW)
        );
        // Once Unknown and tainted, nothing more changes.
        assert_eq!(node_health(&next, GRACE * 3, GRACE, NOW), None);
    }

    // Same table: "Node created long time ago, with status updated by kubelet exceeds
    // grace period, and never posted" -> NodeStatusNeverUpdated.
    #[test]
    fn a_node_that_never_posted_ready_goes_unknown_after_the_startup_grace() {
        let n = json!({"metadata": {"name": "a"}, "spec": {}, "status": {}});
        assert_eq!(node_health(&n, NODE_STARTUP_GRACE_PERIOD, GRACE, NOW), None);
        let next = node_health(&n, NODE_STARTUP_GRACE_PERIOD * 2, GRACE, NOW).unwrap();
        let ready = cond(&next, "Ready");
        assert_eq!(ready["status"], "Unknown");
        assert_eq!(ready["reason"], "NodeStatusNeverUpdated");
        assert_eq!(ready["message"], "Kubelet never posted node status.");
    }

    #[test]
    fn a_node_back_to_ready_loses_the_unreachable_taints_and_keeps_others() {
        let mut n = node("a", "True");
        n["spec"]["taints"] = json!([
            {"key": "dedicated", "value": "x", "effect": "NoSchedule"},
            {"key": UNREACHABLE_TAINT, "effect": "NoSchedule"},
            {"key": UNREACHABLE_TAINT, "effect": "NoExecute"},
        ]);
        let next = node_health(&n, Duration::ZERO, GRACE, NOW).unwrap();
        assert_eq!(
            next["spec"]["taints"],
            json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
        );
        // A NotReady the kubelet posted itself stands (not Unknown), and is not tainted
        // unreachable.
        assert_eq!(
            node_health(&node("b", "False"), GRACE * 2, GRACE, NOW),
            None
        );
    }

    #[test]
    fn pods_on_an_unknown_node_are_marked_not_ready_once() {
        let pod = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}});
        let next = pod_not_ready(&pod, NOW).unwrap();
        assert_eq!(cond(&next, "Ready")["status"], "False");
        assert_eq!(cond(&next, "PodScheduled")["status"], "True");
        assert_eq!(pod_not_ready(&next, NOW), None);
    }

    fn pod(selector: Value, tolerations: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"},
               "spec": {"nodeSelector": selector, "tolerations": tolerations}})
    }

    /// Upstream's component-helpers nodeaffinity_test.go
    /// `TestPodMatchesNodeSelectorAndAffinityTerms`, every case by its name.
    #[test]
    fn test_pod_matches_node_selector_and_affinity_terms() {
        fn req(key: &str, op: &str, values: &[&str]) -> Value {
            json!({"key": key, "operator": op, "values": values})
        }
        fn terms(terms: Value) -> Value {
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": terms}}}})
        }
        fn exprs(e: Vec<Value>) -> Value {
            json!({"matchExpressions": e})
        }
        fn with_selector(mut spec: Value) -> Value {
            spec["nodeSelector"] = json!({"foo": "bar"});
            spec
        }
        let name = |n: &str| req("metadata.name", "In", &[n]);
        // (name, pod spec, node labels, node name, want)
        let rows: Vec<(&str, Value, Value, &str, bool)> = vec![
            ("no selector", json!({}), json!(null), "", true),
            (
                "missing labels",
                json!({"nodeSelector": {"foo": "bar"}}),
                json!(null),
                "",
                false,
            ),
            (
                "same labels",
                json!({"nodeSelector": {"foo": "bar"}}),
                json!({"foo": "bar"}),
                "",
                true,
            ),
            (
                "node labels are superset",
                json!({"nodeSelector": {"foo": "bar"}}),
                json!({"foo": "bar", "baz": "blah"}),
                "",
                true,
            ),
            (
                "node labels are subset",
                json!({"nodeSelector": {"foo": "bar", "baz": "blah"}}),
                json!({"foo": "bar"}),
                "",
                false,
            ),
            (
                "Pod with matchExpressions using In operator that matches the existing node",
                terms(json!([exprs(vec![req("foo", "In", &["bar", "value2"])])])),
                json!({"foo": "bar"}),
                "",
                true,
            ),
            (
                "Pod with matchExpressions using Gt operator that matches the existing node",
                terms(json!([exprs(vec![req("kernel-version", "Gt", &["0204"])])])),
                json!({"kernel-version": "0206"}),
                "",
                true,
            ),
            (
                "Pod with matchExpressions using NotIn operator that matches the existing node",
                terms(json!([exprs(vec![req(
                    "mem-type",
                    "NotIn",
                    &["DDR", "DDR2"]
                )])])),
                json!({"mem-type": "DDR3"}),
                "",
                true,
            ),
            (
                "Pod with matchExpressions using Exists operator that matches the existing node",
                terms(json!([exprs(vec![req("GPU", "Exists", &[])])])),
                json!({"GPU": "NVIDIA-GRID-K1"}),
                "",
                true,
            ),
            (
                "Pod with affinity that don't match node's labels won't schedule onto the node",
                terms(json!([exprs(vec![req(
                    "foo",
                    "In",
                    &["value1", "value2"]
                )])])),
                json!({"foo": "bar"}),
                "",
                false,
            ),
            (
                "Pod with a nil []NodeSelectorTerm in affinity, can't match the node's labels and won't schedule onto the node",
                terms(json!(null)),
                json!({"foo": "bar"}),
                "",
                false,
            ),
            (
                "Pod with an empty []NodeSelectorTerm in affinity, can't match the node's labels and won't schedule onto the node",
                terms(json!([])),
                json!({"foo": "bar"}),
                "",
                false,
            ),
            (
                "Pod with empty MatchExpressions is not a valid value will match no objects and won't schedule onto the node",
                terms(json!([exprs(vec![])])),
                json!({"foo": "bar"}),
                "",
                false,
            ),
            (
                "Pod with no Affinity will schedule onto a node",
                json!({}),
                json!({"foo": "bar"}),
                "",
                true,
            ),
            (
                "Pod with Affinity but nil NodeSelector will schedule onto a node",
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": null}}}),
                json!({"foo": "bar"}),
                "",
                true,
            ),
            (
                "Pod with multiple matchExpressions ANDed that matches the existing node",
                terms(json!([exprs(vec![
                    req("GPU", "Exists", &[]),
                    req("GPU", "NotIn", &["AMD", "INTER"])
                ])])),
                json!({"GPU": "NVIDIA-GRID-K1"}),
                "",
                true,
            ),
            (
                "Pod with multiple matchExpressions ANDed that doesn't match the existing node",
                terms(json!([exprs(vec![
                    req("GPU", "Exists", &[]),
                    req("GPU", "In", &["AMD", "INTER"])
                ])])),
                json!({"GPU": "NVIDIA-GRID-K1"}),
                "",
                false,
            ),
            (
                "Pod with multiple NodeSelectorTerms ORed in affinity, matches the node's labels and will schedule onto the node",
                terms(json!([
                    exprs(vec![req("foo", "In", &["bar", "value2"])]),
                    exprs(vec![req("diffkey", "In", &["wrong", "value2"])])
                ])),
                json!({"foo": "bar"}),
                "",
                true,
            ),
            (
                "Pod with an Affinity and a PodSpec.NodeSelector(the old thing that we are deprecating) both are satisfied, will schedule onto the node",
                with_selector(terms(json!([exprs(vec![req("foo", "Exists", &[])])]))),
                json!({"foo": "bar"}),
                "",
                true,
            ),
            (
                "Pod with an Affinity matches node's labels but the PodSpec.NodeSelector(the old thing that we are deprecating) is not satisfied, won't schedule onto the node",
                with_selector(terms(json!([exprs(vec![req("foo", "Exists", &[])])]))),
                json!({"foo": "barrrrrr"}),
                "",
                false,
            ),
            (
                "Pod with an invalid value in Affinity term won't be scheduled onto the node",
                terms(json!([exprs(vec![req(
                    "foo",
                    "NotIn",
                    &["invalid value: ___@#$%^"]
                )])])),
                json!({"foo": "bar"}),
                "",
                false,
            ),
            (
                "Pod with matchFields using In operator that matches the existing node",
                terms(json!([{"matchFields": [name("node_1")]}])),
                json!(null),
                "node_1",
                true,
            ),
            (
                "Pod with matchFields using In operator that does not match the existing node",
                terms(json!([{"matchFields": [name("node_1")]}])),
                json!(null),
                "node_2",
                false,
            ),
            (
                "Pod with two terms: matchFields does not match, but matchExpressions matches",
                terms(
                    json!([{"matchFields": [name("node_1")]}, exprs(vec![req("foo", "In", &["bar"])])]),
                ),
                json!({"foo": "bar"}),
                "node_2",
                true,
            ),
            (
                "Pod with one term: matchFields does not match, but matchExpressions matches",
                terms(
                    json!([{"matchFields": [name("node_1")], "matchExpressions": [req("foo", "In", &["bar"])]}]),
                ),
                json!({"foo": "bar"}),
                "node_2",
                false,
            ),
            (
                "Pod with one term: both matchFields and matchExpressions match",
                terms(
                    json!([{"matchFields": [name("node_1")], "matchExpressions": [req("foo", "In", &["bar"])]}]),
                ),
                json!({"foo": "bar"}),
                "node_1",
                true,
            ),
            (
                "Pod with two terms: both matchFields and matchExpressions do not match",
                terms(
                    json!([{"matchFields": [name("node_1")]}, exprs(vec![req("foo", "In", &["not-match-to-bar"])])]),
                ),
                json!({"foo": "bar"}),
                "node_2",
                false,
            ),
        ];
        for (what, spec, labels, node_name, want) in rows {
            let pod = json!({"spec": spec});
            let node = json!({"metadata": {"name": node_name, "labels": labels}});
            assert_eq!(node_affinity_matches(&pod, &node), want, "{what}");
        }
    }

    #[test]
    fn the_scheduler_spreads_by_load_and_follows_the_node_selector() {
        let nodes = [node("a", "True"), node("b", "True"), node("c", "True")];
        let pods = |n| Load {
            pods: n,
            ..Load::default()
        };
        let load: HashMap<String, Load> = [("a".into(), pods(2)), ("b".into(), pods(1))].into();
        assert_eq!(
            pick_node(&pod(json!(null), json!(null)), &nodes, &load),
            Ok("c".into())
        );
        let pinned = pod(json!({"kubernetes.io/hostname": "a"}), json!(null));
        assert_eq!(pick_node(&pinned, &nodes, &load), Ok("a".into()));
        let nowhere = pod(json!({"kubernetes.io/hostname": "z"}), json!(null));
        // Upstream's FitError text (pkg/scheduler/framework/types.go).
        assert_eq!(
            pick_node(&nowhere, &nodes, &load),
            Err(
                "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. \
                 preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.."
                    .into()
            )
        );
    }

    /// NodeResourcesFit against allocatable, in kube-scheduler's words as users see them
    /// (`0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available:
    /// 1 No preemption victims found for incoming pod..`; with a tainted control plane
    /// beside: `1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint
    /// {node-role.kubernetes.io/control-plane: }. preemption: 0/2 nodes are available: 1 No
    /// preemption victims found for incoming pod, 1 Preemption is not helpful for
    /// scheduling..`).
    #[test]
    fn the_scheduler_fits_requests_to_allocatable_in_upstreams_words() {
        let sized = |name: &str| {
            let mut n = node(name, "True");
            n["status"]["allocatable"] = json!({"cpu": "2", "memory": "4Gi", "pods": "3"});
            n
        };
        let wants = |cpu: &str, memory: &str| {
            json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}})
        };
        let busy = Load {
            pods: 1,
            cpu_millis: 1500,
            memory: 1 << 30,
        };
        let load: HashMap<String, Load> = [("a".into(), busy)].into();
        let nodes = [sized("a")];
        assert_eq!(
            pick_node(&wants("500m", "1Gi"), &nodes, &load),
            Ok("a".into())
        );
        assert_eq!(
            pick_node(&wants("1", "1Gi"), &nodes, &load),
            Err(
                "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are \
                 available: 1 No preemption victims found for incoming pod.."
                    .into()
            )
        );
        assert_eq!(
            pick_node(&wants("1", "4Gi"), &nodes, &load),
            Err(
                "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory. \
                 preemption: 0/1 nodes are available: 1 No preemption victims found for \
                 incoming pod.."
                    .into()
            )
        );
        let full: HashMap<String, Load> = [(
            "a".into(),
            Load {
                pods: 3,
                ..Load::default()
            },
        )]
        .into();
        assert_eq!(
            pick_node(&wants("0", "0"), &nodes, &full),
            Err(
                "0/1 nodes are available: 1 Too many pods. preemption: 0/1 nodes are \
                 available: 1 No preemption victims found for incoming pod.."
                    .into()
            )
        );
        let mut control_plane = sized("cp");
        control_plane["spec"]["taints"] =
            json!([{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]);
        assert_eq!(
            pick_node(&wants("1", "1Gi"), &[control_plane, sized("a")], &load),
            Err(
                "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint \
                 {node-role.kubernetes.io/control-plane: }. preemption: 0/2 nodes are \
                 available: 1 No preemption victims found for incoming pod, 1 Preemption is not \
                 helpful for scheduling.."
                    .into()
            )
        );
    }

    /// `PodRequests`: the larger of the running containers (sidecars included) and the
    /// largest init container with the sidecars started before it, plus overhead; a
    /// request left out is its limit.
    #[test]
    fn pod_requests_count_init_containers_sidecars_and_overhead() {
        let pod = json!({"spec": {
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "init", "resources": {"limits": {"cpu": "3", "memory": "1Gi"}}},
            ],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"}}},
            ],
            "overhead": {"cpu": "10m", "memory": "1Mi"},
        }});
        assert_eq!(requests(&pod), (3100 + 10, (1 << 30) + (1 << 20)));
        let small = json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}}}]}});
        assert_eq!(requests(&small), (500, 64 << 20));
    }

    #[test]
    fn the_scheduler_skips_unready_unschedulable_and_tainted_nodes_unless_tolerated() {
        let mut tainted = node("a", "True");
        tainted["spec"]["taints"] = json!([{"key": UNREACHABLE_TAINT, "effect": "NoSchedule"}]);
        let mut cordoned = node("b", "True");
        cordoned["spec"]["unschedulable"] = true.into();
        let nodes = [tainted, cordoned, node("c", "Unknown")];
        let none = HashMap::new();
        assert_eq!(
            pick_node(&pod(json!(null), json!(null)), &nodes, &none),
            Err("0/3 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, \
                 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }, 1 node(s) were unschedulable. \
                 preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.."
                .into())
        );
        let tolerant = pod(
            json!(null),
            json!([{"key": UNREACHABLE_TAINT, "operator": "Exists"}]),
        );
        assert_eq!(pick_node(&tolerant, &nodes, &none), Ok("a".into()));
        let all = pod(json!(null), json!([{"operator": "Exists"}]));
        assert_eq!(pick_node(&all, &nodes, &none), Ok("a".into()));
        let wrong_effect = pod(
            json!(null),
            json!([{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute"}]),
        );
        assert!(pick_node(&wrong_effect, &nodes, &none).is_err());
    }
}
