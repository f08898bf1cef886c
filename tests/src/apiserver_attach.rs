//! The two parts of a cluster that attach CSI volumes to nodes, as the test API server
//! runs them (every 500 ms, and at once on a write to pods, nodes, claims or attachments):
//!
//! - **the attach/detach controller** of kube-controller-manager
//!   (pkg/controller/volume/attachdetach), reduced to CSI persistent volumes. It manages a
//!   node only when the Node carries the `volumes.kubernetes.io/controller-managed-attach-detach`
//!   annotation (its `addNodeToDswp` checks that the key exists). Its desired state: every
//!   bound claim (`persistentVolumeClaim`, or a generic ephemeral volume's `<pod>-<volume>`)
//!   of every pod bound to such a node and not terminated (upstream's `IsPodTerminated`:
//!   Succeeded or Failed, or being deleted with no container running), whose PV is a CSI
//!   volume that needs attach (the driver's CSIDriver says `attachRequired: true`, or the
//!   driver has no CSIDriver: csi_plugin's `skipAttach` then attaches). For each it creates
//!   the VolumeAttachment `csi-` + sha256(handle + driver + node) (csi_attacher's
//!   `getAttachmentName`), naming the PV. An attachment no longer desired is detached only
//!   when the node no longer lists the volume in `status.volumesInUse` (the reconciler's
//!   "Cannot detach volume because it is still mounted"), or the node has the
//!   `node.kubernetes.io/out-of-service` taint; before it detaches, the volume leaves the
//!   Node's `status.volumesAttached`, which lists the attached volumes by unique name
//!   (`kubernetes.io/csi/<driver>^<handle>`, device path empty as CSI's `Attach` returns)
//!   as its node status updater writes it. Not modelled: the 6-minute forced detach from
//!   an unhealthy node (`maxWaitForUnmountDuration`), inline volumes migrated from in-tree
//!   plugins, and multi-attach errors.
//! - **an external-attacher** (kubernetes-csi/external-attacher), for each driver a test
//!   deploys one for (`Attachers::deploy`, the driver's CSI socket): for a VolumeAttachment
//!   of that driver not attached yet, `ControllerPublishVolume` with the node's ID for the
//!   driver from its CSINode, the PV's handle, attributes, `readOnly`, access mode and
//!   volume mode; then `status.attached` with the answer's publish context as
//!   `attachmentMetadata`, or `status.attachError` with the error (retried every second).
//!   A detach is `ControllerUnpublishVolume`, then the VolumeAttachment goes (the real one
//!   holds a finalizer until then, which this server does not model: the object is marked
//!   with a `deletionTimestamp` while the attacher works, as the kubelet would see it). A
//!   driver without a deployed attacher has its VolumeAttachments created and never
//!   attached, as in a cluster without the sidecar.

use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Node annotation that hands a node's attach and detach to the controller
/// (`volumeutil.ControllerManagedAttachAnnotation`).
pub const CONTROLLER_MANAGED_ANNOTATION: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";
/// The taint that allows a detach while the node still reports the volume in use
/// (`v1.TaintNodeOutOfService`).
const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// How often an attacher retries a failed attach or detach.
const RETRY: Duration = Duration::from_secs(1);

/// The external-attachers deployed (driver name -> its CSI socket) and their retry clocks.
#[derive(Clone, Default)]
pub struct Attachers {
    inner: Arc<Mutex<AttacherState>>,
}

#[derive(Default)]
struct AttacherState {
    sockets: HashMap<String, PathBuf>,
    /// VolumeAttachment name -> when its last attach or detach failed.
    failed: HashMap<String, Instant>,
}

impl Attachers {
    /// Deploys an external-attacher for `driver`, which serves CSI on `csi_socket`.
    pub fn deploy(&self, driver: &str, csi_socket: &Path) {
        let mut a = self.inner.lock().unwrap();
        a.sockets
            .insert(driver.to_string(), csi_socket.to_path_buf());
    }

    /// Removes the attacher of `driver` (its VolumeAttachments stay as they are).
    pub fn retire(&self, driver: &str) {
        self.inner.lock().unwrap().sockets.remove(driver);
    }

    fn socket(&self, driver: &str) -> Option<PathBuf> {
        self.inner.lock().unwrap().sockets.get(driver).cloned()
    }

    /// Whether `attachment` may be tried now (no failure within [`RETRY`]).
    fn due(&self, attachment: &str) -> bool {
        let a = self.inner.lock().unwrap();
        a.failed
            .get(attachment)
            .is_none_or(|at| at.elapsed() >= RETRY)
    }

    fn outcome(&self, attachment: &str, ok: bool) {
        let mut a = self.inner.lock().unwrap();
        if ok {
            a.failed.remove(attachment);
        } else {
            a.failed.insert(attachment.to_string(), Instant::now());
        }
    }
}

/// One CSI volume attached, or to be attached, to one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Attachment {
    /// The VolumeAttachment's name.
    pub name: String,
    pub node: String,
    pub pv: String,
    pub driver: String,
    pub handle: String,
}

impl Attachment {
    /// The volume's unique name, as `volumesInUse` and `volumesAttached` list it.
    pub fn unique(&self) -> String {
        format!("kubernetes.io/csi/{}^{}", self.driver, self.handle)
    }

    fn object(&self) -> Value {
        json!({
            "metadata": {"name": self.name},
            "spec": {"attacher": self.driver, "nodeName": self.node,
                     "source": {"persistentVolumeName": self.pv}},
        })
    }
}

/// csi_attacher's `getAttachmentName`: `csi-` + sha256 of handle, driver and node.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{handle}{driver}{node}").as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// What the controller reads: the objects of the kinds it watches.
#[derive(Default)]
pub(crate) struct World {
    pub pods: Vec<Value>,
    pub nodes: Vec<Value>,
    pub claims: Vec<Value>,
    pub volumes: Vec<Value>,
    pub drivers: Vec<Value>,
    pub attachments: Vec<Value>,
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// upstream's `notRunning`: every status terminated or waiting (or none).
fn not_running(statuses: &Value) -> bool {
    statuses.as_array().into_iter().flatten().all(|s| {
        s["state"].get("terminated").is_some_and(|t| !t.is_null())
            || s["state"].get("waiting").is_some_and(|w| !w.is_null())
    })
}

/// upstream's `IsPodTerminated` (pkg/volume/util).
pub(crate) fn terminated(pod: &Value) -> bool {
    let status = &pod["status"];
    matches!(status["phase"].as_str(), Some("Succeeded" | "Failed"))
        || (pod["metadata"]["deletionTimestamp"].is_string()
            && not_running(&status["initContainerStatuses"])
            && not_running(&status["containerStatuses"])
            && not_running(&status["ephemeralContainerStatuses"]))
}

impl World {
    fn managed(&self, node: &str) -> Option<&Value> {
        self.nodes.iter().find(|n| {
            name(n) == node
                && n["metadata"]["annotations"]
                    .get(CONTROLLER_MANAGED_ANNOTATION)
                    .is_some()
        })
    }

    fn pv(&self, pv: &str) -> Option<&Value> {
        self.volumes.iter().find(|v| name(v) == pv)
    }

    /// The PV bound to claim `ns/claim`, if the claim is bound.
    fn bound_pv(&self, ns: &str, claim: &str) -> Option<&Value> {
        let claim = self
            .claims
            .iter()
            .find(|c| name(c) == claim && c["metadata"]["namespace"].as_str() == Some(ns))?;
        if claim["status"]["phase"] != "Bound" {
            return None;
        }
        self.pv(claim["spec"]["volumeName"].as_str()?)
    }

    /// csi_plugin's `skipAttach`, negated: attach unless the CSIDriver says it is not
    /// required (a driver without a CSIDriver is attached).
    fn attach_required(&self, driver: &str) -> bool {
        self.drivers
            .iter()
            .find(|d| name(d) == driver)
            .is_none_or(|d| d["spec"]["attachRequired"].as_bool() != Some(false))
    }

    /// The attachment of PV `pv` (a CSI one) to `node`.
    fn attachment_of(&self, pv: &Value, node: &str) -> Option<Attachment> {
        let csi = &pv["spec"]["csi"];
        let driver = csi["driver"].as_str()?;
        let handle = csi["volumeHandle"].as_str()?;
        Some(Attachment {
            name: attachment_name(handle, driver, node),
            node: node.to_string(),
            pv: name(pv).to_string(),
            driver: driver.to_string(),
            handle: handle.to_string(),
        })
    }

    /// The controller's desired state of the world, by VolumeAttachment name.
    pub fn desired(&self) -> BTreeMap<String, Attachment> {
        let mut wanted = BTreeMap::new();
        for pod in &self.pods {
            let Some(node) = pod["spec"]["nodeName"].as_str() else {
                continue;
            };
            if self.managed(node).is_none() || terminated(pod) {
                continue;
            }
            let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
            for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
                let claim = if let Some(c) = v["persistentVolumeClaim"]["claimName"].as_str() {
                    c.to_string()
                } else if v.get("ephemeral").is_some_and(|e| !e.is_null()) {
                    format!("{}-{}", name(pod), v["name"].as_str().unwrap_or_default())
                } else {
                    continue;
                };
                let Some(pv) = self.bound_pv(ns, &claim) else {
                    continue;
                };
                let Some(a) = self.attachment_of(pv, node) else {
                    continue;
                };
                if self.attach_required(&a.driver) {
                    wanted.insert(a.name.clone(), a);
                }
            }
        }
        wanted
    }

    /// The attachments that exist, as the controller knows them (by the PV each names;
    /// `remembered` holds those whose PV is gone).
    pub fn actual(&self, remembered: &HashMap<String, Attachment>) -> Vec<(Attachment, &Value)> {
        self.attachments
            .iter()
            .filter_map(|va| {
                let node = va["spec"]["nodeName"].as_str()?;
                let known = va["spec"]["source"]["persistentVolumeName"]
                    .as_str()
                    .and_then(|pv| self.pv(pv))
                    .and_then(|pv| self.attachment_of(pv, node))
                    .filter(|a| a.name == name(va))
                    .or_else(|| remembered.get(name(va)).cloned())?;
                Some((known, va))
            })
            .collect()
    }
}

/// What the controller does in one pass.
#[derive(Debug, PartialEq)]
pub(crate) enum Action {
    /// Create the VolumeAttachment.
    Attach(Attachment),
    /// Take it off the Node's `volumesAttached`, then detach it.
    Detach(Attachment),
    /// Write the Node's `status.volumesAttached` (node name, the list).
    Report(String, Value),
}

/// One pass of the controller's reconciler over `world` (pure).
pub(crate) fn plan(world: &World, remembered: &HashMap<String, Attachment>) -> Vec<Action> {
    let desired = world.desired();
    let actual = world.actual(remembered);
    let mut actions = Vec::new();
    let mut detaching = Vec::new();
    for (a, va) in &actual {
        if desired.contains_key(&a.name) || va["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let node = world.nodes.iter().find(|n| name(n) == a.node);
        let mounted = node.is_some_and(|n| {
            n["status"]["volumesInUse"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|u| u.as_str() == Some(a.unique().as_str()))
        });
        let out_of_service = node.is_some_and(|n| {
            n["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["key"] == OUT_OF_SERVICE_TAINT && t["effect"] == "NoExecute")
        });
        if !mounted || out_of_service {
            detaching.push(a.name.clone());
            actions.push(Action::Detach(a.clone()));
        }
    }
    for (va_name, a) in &desired {
        if !world.attachments.iter().any(|va| name(va) == va_name) {
            actions.push(Action::Attach(a.clone()));
        }
    }
    // The node status updater: the attached volumes of each managed node, less those
    // being detached, by unique name.
    for node in &world.nodes {
        let node_name = name(node);
        if world.managed(node_name).is_none() {
            continue;
        }
        let mut attached: Vec<String> = actual
            .iter()
            .filter(|(a, va)| {
                a.node == node_name
                    && va["status"]["attached"] == true
                    && va["metadata"]["deletionTimestamp"].is_null()
                    && !detaching.contains(&a.name)
            })
            .map(|(a, _)| a.unique())
            .collect();
        attached.sort();
        attached.dedup();
        let list: Value = attached
            .into_iter()
            .map(|u| json!({"name": u, "devicePath": ""}))
            .collect();
        let current = &node["status"]["volumesAttached"];
        let same = match current.as_array() {
            None => list.as_array().is_some_and(|l| l.is_empty()),
            Some(c) => *c == *list.as_array().unwrap_or(&Vec::new()),
        };
        if !same {
            actions.push(Action::Report(node_name.to_string(), list));
        }
    }
    actions
}

/// The CSI access mode of a PV's first access mode (external-attacher's
/// `GetVolumeCapabilities`).
fn access_mode(pv: &Value) -> i32 {
    use nodeagent_proto::csi::volume_capability::access_mode::Mode;
    match pv["spec"]["accessModes"][0].as_str() {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly as i32,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter as i32,
        Some("ReadWriteOncePod") => Mode::SingleNodeSingleWriter as i32,
        _ => Mode::SingleNodeWriter as i32,
    }
}

fn capability(pv: &Value) -> nodeagent_proto::csi::VolumeCapability {
    use nodeagent_proto::csi::volume_capability::{AccessMode, AccessType};
    use nodeagent_proto::csi::{VolumeCapability, volume_capability};
    let access_type = if pv["spec"]["volumeMode"] == "Block" {
        AccessType::Block(volume_capability::BlockVolume {})
    } else {
        AccessType::Mount(volume_capability::MountVolume {
            fs_type: pv["spec"]["csi"]["fsType"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            ..Default::default()
        })
    };
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: access_mode(pv),
        }),
        access_type: Some(access_type),
    }
}

/// A gRPC error as Go's status prints it (what the attacher stores).
fn go_error(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

/// The node's ID for `driver`, from its CSINode.
fn node_id(state: &crate::apiserver::ApiState, node: &str, driver: &str) -> Result<String, String> {
    let csinode = state
        .object("csinodes", "", node)
        .ok_or_else(|| format!("CSINode {node} not found"))?;
    csinode["spec"]["drivers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == driver)
        .and_then(|d| d["nodeID"].as_str().map(str::to_string))
        .ok_or_else(|| format!("CSINode {node} does not contain driver {driver}"))
}

fn client(
    socket: &Path,
) -> nodeagent_proto::csi::controller_client::ControllerClient<nodeagent_transport::Channel> {
    nodeagent_proto::csi::controller_client::ControllerClient::new(nodeagent_transport::connect(
        &nodeagent_transport::Address::Unix(socket.to_path_buf()),
    ))
}

/// The external-attacher's attach of `va` (not attached yet): its status afterwards.
async fn publish(
    state: &crate::apiserver::ApiState,
    socket: &Path,
    a: &Attachment,
) -> Result<Value, String> {
    let pv = state
        .object("persistentvolumes", "", &a.pv)
        .ok_or_else(|| format!("persistentvolume {:?} not found", a.pv))?;
    let node_id = node_id(state, &a.node, &a.driver)?;
    let csi = &pv["spec"]["csi"];
    let context = csi["volumeAttributes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    let request = nodeagent_proto::csi::ControllerPublishVolumeRequest {
        volume_id: a.handle.clone(),
        node_id,
        volume_capability: Some(capability(&pv)),
        readonly: csi["readOnly"].as_bool().unwrap_or(false),
        secrets: Default::default(),
        volume_context: context,
    };
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        client(socket).controller_publish_volume(request),
    )
    .await
    .map_err(|_| "ControllerPublishVolume timed out".to_string())?
    .map_err(|e| go_error(&e))?;
    Ok(json!(answer.into_inner().publish_context))
}

async fn unpublish(
    state: &crate::apiserver::ApiState,
    socket: &Path,
    a: &Attachment,
) -> Result<(), String> {
    let node_id = node_id(state, &a.node, &a.driver)?;
    let request = nodeagent_proto::csi::ControllerUnpublishVolumeRequest {
        volume_id: a.handle.clone(),
        node_id,
        secrets: Default::default(),
    };
    tokio::time::timeout(
        Duration::from_secs(10),
        client(socket).controller_unpublish_volume(request),
    )
    .await
    .map_err(|_| "ControllerUnpublishVolume timed out".to_string())?
    .map_err(|e| go_error(&e))?;
    Ok(())
}

fn world(state: &crate::apiserver::ApiState) -> World {
    World {
        pods: state.objects("pods"),
        nodes: state.objects("nodes"),
        claims: state.objects("persistentvolumeclaims"),
        volumes: state.objects("persistentvolumes"),
        drivers: state.objects("csidrivers"),
        attachments: state.objects("volumeattachments"),
    }
}

/// Whether a write can change what the controller or the attachers do.
fn relevant(change: &crate::apiserver::WatchEvent) -> bool {
    match change.plural.as_str() {
        "nodes" | "persistentvolumeclaims" | "volumeattachments" | "csinodes" => true,
        "pods" => change.object()["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v.get("persistentVolumeClaim").is_some() || v.get("ephemeral").is_some()),
        _ => false,
    }
}

/// Runs the controller and the attachers against `state` until the task is aborted.
pub(crate) async fn run(state: crate::apiserver::ApiState) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut changes = state.changes();
    // What the controller knows of each attachment it saw (its actual state of the world
    // outlives the PV an attachment names).
    let mut remembered: HashMap<String, Attachment> = HashMap::new();
    loop {
        // Every period, and at once on a change that can matter (a pod only when it has
        // claims: a node with hundreds of pods must not make every status write a pass).
        tokio::select! {
            _ = tick.tick() => {}
            change = changes.recv() => match change {
                Ok(c) if relevant(&c) => {}
                Ok(_) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
        // One pass for a burst of writes.
        while changes.try_recv().is_ok() {}
        let w = world(&state);
        for (a, _) in w.actual(&remembered) {
            remembered.insert(a.name.clone(), a);
        }
        for action in plan(&w, &remembered) {
            match action {
                Action::Attach(a) => {
                    eprintln!(
                        "nodeagent-test-apiserver: attach-detach controller: attaching {} ({}) to {}",
                        a.pv, a.name, a.node
                    );
                    state.add("volumeattachments", "", a.object());
                }
                Action::Report(node, list) => {
                    state.modify("nodes", "", &node, |n| {
                        // An empty list is left out, as Go's `omitempty` writes it.
                        if list.as_array().is_some_and(|l| l.is_empty()) {
                            if let Some(status) = n["status"].as_object_mut() {
                                status.remove("volumesAttached");
                            }
                        } else {
                            n["status"]["volumesAttached"] = list;
                        }
                    });
                }
                Action::Detach(a) => {
                    eprintln!(
                        "nodeagent-test-apiserver: attach-detach controller: detaching {} ({}) from {}",
                        a.pv, a.name, a.node
                    );
                    let now = crate::apiserver::now();
                    state.modify("volumeattachments", "", &a.name, |va| {
                        va["metadata"]["deletionTimestamp"] = now.into();
                    });
                }
            }
        }
        attach_and_detach(&state, &remembered).await;
    }
}

/// The external-attachers' pass: attach what is not attached yet, finish the detaches.
async fn attach_and_detach(
    state: &crate::apiserver::ApiState,
    remembered: &HashMap<String, Attachment>,
) {
    for va in state.objects("volumeattachments") {
        let va_name = name(&va).to_string();
        let Some(a) = remembered.get(&va_name) else {
            continue;
        };
        let being_deleted = va["metadata"]["deletionTimestamp"].is_string();
        let Some(socket) = state.attachers.socket(&a.driver) else {
            if being_deleted {
                // No attacher, no finalizer: the object goes at once.
                state.remove("volumeattachments", "", &va_name);
            }
            continue;
        };
        if !state.attachers.due(&va_name) {
            continue;
        }
        if being_deleted {
            match unpublish(state, &socket, a).await {
                Ok(()) => {
                    state.attachers.outcome(&va_name, true);
                    state.remove("volumeattachments", "", &va_name);
                }
                Err(e) => {
                    state.attachers.outcome(&va_name, false);
                    let now = crate::apiserver::now();
                    state.modify("volumeattachments", "", &va_name, |va| {
                        va["status"]["detachError"] = json!({"message": e, "time": now});
                    });
                }
            }
        } else if va["status"]["attached"] != true {
            let outcome = publish(state, &socket, a).await;
            state.attachers.outcome(&va_name, outcome.is_ok());
            let now = crate::apiserver::now();
            state.modify("volumeattachments", "", &va_name, |va| match outcome {
                Ok(metadata) => {
                    va["status"] = json!({"attached": true, "attachmentMetadata": metadata});
                }
                Err(e) => {
                    va["status"] = json!({"attached": false,
                        "attachError": {"message": e, "time": now}});
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    //! Cases after upstream's attach/detach controller tests
    //! (pkg/controller/volume/attachdetach: reconciler_test.go, the populator's and
    //! `util.IsPodTerminated`'s cases), on this server's objects.
    use super::*;

    const DRIVER: &str = "d.csi";

    fn node(name: &str, managed: bool, in_use: &[&str]) -> Value {
        let mut n = json!({"metadata": {"name": name, "annotations": {}},
                           "status": {"volumesInUse": in_use}});
        if managed {
            n["metadata"]["annotations"][CONTROLLER_MANAGED_ANNOTATION] = "true".into();
        }
        n
    }

    fn pod(name: &str, node: &str, claim: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": node, "volumes": [{"name": "data",
                        "persistentVolumeClaim": {"claimName": claim}}]},
               "status": {"phase": "Running",
                          "containerStatuses": [{"state": {"running": {}}}]}})
    }

    fn world(pods: Vec<Value>, nodes: Vec<Value>) -> World {
        World {
            pods,
            nodes,
            claims: vec![
                json!({"metadata": {"name": "claim", "namespace": "default"},
                                "spec": {"volumeName": "pv"}, "status": {"phase": "Bound"}}),
            ],
            volumes: vec![json!({"metadata": {"name": "pv"},
                                 "spec": {"csi": {"driver": DRIVER, "volumeHandle": "h"}}})],
            ..Default::default()
        }
    }

    fn wanted(node: &str) -> Attachment {
        Attachment {
            name: attachment_name("h", DRIVER, node),
            node: node.into(),
            pv: "pv".into(),
            driver: DRIVER.into(),
            handle: "h".into(),
        }
    }

    fn attached(a: &Attachment) -> Value {
        json!({"metadata": {"name": a.name},
               "spec": {"attacher": DRIVER, "nodeName": a.node,
                        "source": {"persistentVolumeName": a.pv}},
               "status": {"attached": true}})
    }

    #[test]
    fn one_desired_volume_is_attached_once() {
        // reconciler_test.go Test_Run_Positive_OneDesiredVolumeAttach.
        let w = world(vec![pod("p", "n", "claim")], vec![node("n", true, &[])]);
        assert_eq!(plan(&w, &HashMap::new()), vec![Action::Attach(wanted("n"))]);
        // Created: nothing more to do until it is attached.
        let mut w = w;
        let mut va = attached(&wanted("n"));
        va["status"]["attached"] = false.into();
        w.attachments.push(va);
        assert_eq!(plan(&w, &HashMap::new()), vec![]);
    }

    #[test]
    fn an_attached_volume_is_reported_on_the_node_by_unique_name() {
        let mut w = world(vec![pod("p", "n", "claim")], vec![node("n", true, &[])]);
        w.attachments.push(attached(&wanted("n")));
        assert_eq!(
            plan(&w, &HashMap::new()),
            vec![Action::Report(
                "n".into(),
                json!([{"name": format!("kubernetes.io/csi/{DRIVER}^h"), "devicePath": ""}])
            )]
        );
    }

    #[test]
    fn an_unmanaged_node_or_an_unbound_claim_or_no_attach_required_gets_nothing() {
        // The populator skips a node without the annotation (`addNodeToDswp`).
        let w = world(vec![pod("p", "n", "claim")], vec![node("n", false, &[])]);
        assert_eq!(plan(&w, &HashMap::new()), vec![]);
        let mut w = world(vec![pod("p", "n", "claim")], vec![node("n", true, &[])]);
        w.claims[0]["status"]["phase"] = "Pending".into();
        assert_eq!(plan(&w, &HashMap::new()), vec![]);
        let mut w = world(vec![pod("p", "n", "claim")], vec![node("n", true, &[])]);
        w.drivers
            .push(json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}));
        assert_eq!(plan(&w, &HashMap::new()), vec![]);
        // A CSIDriver that requires attach, like none at all.
        w.drivers[0]["spec"]["attachRequired"] = true.into();
        assert_eq!(plan(&w, &HashMap::new()), vec![Action::Attach(wanted("n"))]);
    }

    #[test]
    fn a_volume_still_mounted_is_not_detached_until_the_node_stops_reporting_it() {
        // Test_Run_Positive_OneDesiredVolumeAttachThenDetachWithUnmountedVolume and its
        // mounted counterpart: the pod gone, the volume in use on the node stays attached.
        let a = wanted("n");
        let mut w = world(vec![], vec![node("n", true, &[&a.unique()])]);
        w.nodes[0]["status"]["volumesAttached"] = json!([{"name": a.unique(), "devicePath": ""}]);
        w.attachments.push(attached(&a));
        assert_eq!(plan(&w, &HashMap::new()), vec![]);
        // No longer in use: off the node's list, and detached.
        w.nodes[0]["status"]["volumesInUse"] = json!([]);
        assert_eq!(
            plan(&w, &HashMap::new()),
            vec![
                Action::Detach(a.clone()),
                Action::Report("n".into(), json!([]))
            ]
        );
        // In use, but the node is out of service (Test_Run_OneVolumeDetachOnOutOfServiceTaintedNode).
        w.nodes[0]["status"]["volumesInUse"] = json!([a.unique()]);
        w.nodes[0]["spec"]["taints"] =
            json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]);
        assert_eq!(plan(&w, &HashMap::new())[0], Action::Detach(a));
    }

    #[test]
    fn a_terminated_pod_no_longer_wants_its_volumes() {
        // util.IsPodTerminated: a finished phase, or deleted with nothing running.
        let mut p = pod("p", "n", "claim");
        assert!(!terminated(&p));
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        assert!(!terminated(&p), "deleted but still running");
        p["status"]["containerStatuses"] = json!([{"state": {"terminated": {"exitCode": 0}}}]);
        assert!(terminated(&p));
        let mut p = pod("p", "n", "claim");
        p["status"]["phase"] = "Succeeded".into();
        assert!(terminated(&p));
        let a = wanted("n");
        let mut w = world(vec![p], vec![node("n", true, &[])]);
        w.nodes[0]["status"]["volumesAttached"] = json!([{"name": a.unique(), "devicePath": ""}]);
        w.attachments.push(attached(&a));
        assert_eq!(
            plan(&w, &HashMap::new()),
            vec![Action::Detach(a), Action::Report("n".into(), json!([]))]
        );
    }

    #[test]
    fn a_generic_ephemeral_volume_is_attached_through_its_claim() {
        let mut p = pod("p", "n", "unused");
        p["spec"]["volumes"] =
            json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]);
        let mut w = world(vec![p], vec![node("n", true, &[])]);
        w.claims[0]["metadata"]["name"] = "p-scratch".into();
        assert_eq!(plan(&w, &HashMap::new()), vec![Action::Attach(wanted("n"))]);
    }

    #[test]
    fn the_attachment_name_is_csi_attachers() {
        // csi_attacher.go getAttachmentName: "csi-" + hex sha256 of handle + driver + node
        // (the digest as `sha256sum` prints it).
        assert_eq!(
            attachment_name("vol-1", "hostpath.csi.nodeagent.test", "node-a"),
            "csi-0d6dcf89f99079ba7e2c14a4b27260ed6263443f82d4b62bc7f8a0e253eadb86"
        );
    }
}
