//! Persistent CSI volumes (issue 32): a pod's `persistentVolumeClaim` resolved to its
//! PersistentVolume as upstream's desired-state populator does (`getPVCExtractPV`,
//! `getPVSpec`), its attachment checked as `csi_attacher.go`'s `WaitForAttach` does, staged
//! once per node (`MountDevice`: `NodeStageVolume` at
//! `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`, with
//! `vol_data.json` beside it) and published per pod at
//! `pods/<uid>/volumes/kubernetes.io~csi/<pv name>/mount`.
//!
//! Unstaging (`UnmountDevice`) is decided from disk alone: a staged volume that no pod's
//! `vol_data.json` names any more is unstaged ([`Csi::unstage_unused`]). A pod's record is
//! written before its `NodePublishVolume`, under the volume's stage lock, so a volume a pod
//! uses (or is being set up to use) is never unstaged, whatever was killed when.

use super::block::VOLUME_DEVICES;
use super::{Csi, PREFIX, Publication, VOL_DATA, VOL_DATA_TMP, go_rpc_error};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Secret, Volume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use nodeagent_proto::csi::{NodeStageVolumeRequest, NodeUnstageVolumeRequest};
use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Under the plugins directory: upstream's `GetPluginDir("kubernetes.io/csi")`.
pub const STAGING_DIR: &str = "plugins/kubernetes.io/csi";
const GLOBAL_MOUNT: &str = "globalmount";
/// How often staged volumes no pod uses are looked for, besides at each pod's release
/// (a release interrupted by a kill, a driver that was away).
const UNSTAGE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a claimed volume is not set up, as upstream words it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimError {
    /// The claim or its volume cannot be used yet (`error processing PVC ns/name: ...`);
    /// the volume is not in the desired state at all.
    Process(String),
    /// A step of the mount failed: the volume's plugin (as upstream's operation metrics
    /// name it) and the whole message (`MountVolume.<step> failed for volume "<pv>" :
    /// ...`).
    Mount { plugin: String, message: String },
    /// The volume needs attach and the Node does not list it in `volumesInUse`, or not
    /// in `volumesAttached`, yet (upstream's VerifyControllerAttachedVolume): the pod
    /// waits, with the reason in the log only, as upstream's reconciler logs it and tries
    /// again.
    NotVerifiedAttached(String),
}

/// The operation a claimed volume's set-up is, as upstream's operation metrics
/// (`storage_operation_duration_seconds`) name it: `map_volume` for a block volume's map,
/// `volume_mount` for the others.
pub fn operation(set_up: &Result<ClaimedVolume, ClaimError>) -> &'static str {
    let block = match set_up {
        Ok((_, path)) => super::block::is_pod_link(path),
        Err(ClaimError::Mount { message, .. }) => message.starts_with("MapVolume."),
        Err(_) => false,
    };
    if block { "map_volume" } else { "volume_mount" }
}

/// A claimed volume set up: its plugin (as upstream's operation metrics name it) and the
/// path the containers get.
pub type ClaimedVolume = (String, PathBuf);

/// The staged record beside `globalmount` (upstream writes these two keys).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct DeviceData {
    #[serde(rename = "driverName")]
    driver_name: String,
    #[serde(rename = "volumeHandle")]
    volume_handle: String,
}

/// Upstream's unique name of a CSI volume: the plugin's name, `/`, the driver, `^`, the
/// handle (`GetUniqueVolumeNameFromSpec` over `csiPlugin.GetVolumeName`).
pub fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// Upstream's `makeDeviceMountPath`: the staging path of a volume.
pub fn staging_path(root: &Path, driver: &str, handle: &str) -> PathBuf {
    use sha2::Digest;
    let sha = format!("{:x}", sha2::Sha256::digest(handle.as_bytes()));
    root.join(STAGING_DIR)
        .join(driver)
        .join(sha)
        .join(GLOBAL_MOUNT)
}

/// A kube-rs error as client-go prints the API's answer (`persistentvolumeclaims "x" not
/// found`).
fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

impl Csi {
    /// Upstream's `getPVCExtractPV` and `getPVSpec`: the claim, bound, and its volume,
    /// bound to it.
    async fn claimed_volume(
        &self,
        namespace: &str,
        claim: &str,
    ) -> Result<(PersistentVolumeClaim, PersistentVolume), String> {
        let Some(client) = &self.client else {
            return Err("failed to fetch PVC from API server: no API server".to_string());
        };
        let claims: kube::Api<PersistentVolumeClaim> =
            kube::Api::namespaced(client.clone(), namespace);
        let pvc = claims
            .get(claim)
            .await
            .map_err(|e| format!("failed to fetch PVC from API server: {}", api_error(&e)))?;
        if pvc.metadata.deletion_timestamp.is_some() {
            return Err("PVC is being deleted".to_string());
        }
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Err("PVC is not bound".to_string());
        }
        let volume_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if volume_name.is_empty() {
            return Err("PVC has empty pvc.Spec.VolumeName".to_string());
        }
        let volumes: kube::Api<PersistentVolume> = kube::Api::all(client.clone());
        let pv = volumes.get(&volume_name).await.map_err(|e| {
            format!(
                "failed to fetch PV {volume_name} from API server: {}",
                api_error(&e)
            )
        })?;
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let Some(claim_ref) = claim_ref else {
            return Err(format!(
                "found PV object {volume_name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
            ));
        };
        let claim_uid = pvc.metadata.uid.clone().unwrap_or_default();
        let ref_uid = claim_ref.uid.clone().unwrap_or_default();
        if ref_uid != claim_uid {
            return Err(format!(
                "found PV object {volume_name} but its pv.Spec.ClaimRef.UID {ref_uid} does not point to claim.UID {claim_uid}"
            ));
        }
        Ok((pvc, pv))
    }

    /// Sets up the pod's volume `volume` (a `persistentVolumeClaim`, or a generic
    /// `ephemeral` one, whose claim is `<pod>-<volume>`) unless it is published already;
    /// its target path. None for other kinds.
    pub async fn set_up_claim(
        &self,
        pod: &Pod,
        volume: &Volume,
    ) -> Option<Result<ClaimedVolume, ClaimError>> {
        let claim_name = claim_name(pod, volume)?;
        let (read_only, ephemeral) = match &volume.persistent_volume_claim {
            Some(c) => (c.read_only.unwrap_or(false), false),
            None => (false, true),
        };
        Some(
            self.set_up_claimed(pod, &volume.name, &claim_name, read_only, ephemeral)
                .await,
        )
    }

    async fn set_up_claimed(
        &self,
        pod: &Pod,
        volume_name: &str,
        claim_name: &str,
        claim_read_only: bool,
        ephemeral: bool,
    ) -> Result<ClaimedVolume, ClaimError> {
        let namespace = nodeagent_proto::k8s::pod_namespace(pod);
        let (pvc, pv) = self
            .claimed_volume(namespace, claim_name)
            .await
            .map_err(|e| {
                ClaimError::Process(format!(
                    "error processing PVC {namespace}/{claim_name}: {e}"
                ))
            })?;
        // Upstream's `ephemeral.VolumeIsForPod`: the claim must be controlled by this pod
        // (not wrapped, as upstream's populator does not wrap it).
        if ephemeral {
            let pod_uid = nodeagent_proto::k8s::pod_uid(pod);
            let controlled = pvc
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.uid == pod_uid);
            let claim_ns = pvc.metadata.namespace.as_deref().unwrap_or(namespace);
            if claim_ns != namespace || !controlled {
                return Err(ClaimError::Process(format!(
                    "PVC {claim_ns}/{claim_name} was not created for pod {namespace}/{} (pod is not owner)",
                    nodeagent_proto::k8s::pod_name(pod)
                )));
            }
        }
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let spec = pv.spec.clone().unwrap_or_default();
        // Upstream's `createVolumeSpec`: the PV's mode must be how the containers use it.
        let mode = spec.volume_mode.as_deref().unwrap_or("Filesystem");
        let (in_mounts, in_devices) = used_as(pod, volume_name);
        if in_mounts && mode != "Filesystem" {
            return Err(ClaimError::Process(format!(
                "volume {volume_name} has volumeMode {mode}, but is specified in volumeMounts"
            )));
        }
        if in_devices && mode != "Block" {
            return Err(ClaimError::Process(format!(
                "volume {volume_name} has volumeMode {mode}, but is specified in volumeDevices"
            )));
        }
        if mode == "Block" && spec.csi.is_none() {
            return Err(ClaimError::Process(format!(
                "error processing PVC {namespace}/{claim_name}: volume {pv_name} has volumeMode Block, which this node agent serves for CSI volumes only"
            )));
        }
        let Some(source) = spec.csi.clone() else {
            return host_volume(&pv_name, &spec).unwrap_or_else(|| {
                Err(ClaimError::Process(format!(
                    "error processing PVC {namespace}/{claim_name}: failed to get Plugin from volumeSpec for volume {pv_name:?} err=no volume plugin matched (this node agent serves CSI, hostPath and local persistent volumes only)"
                )))
            });
        };
        let plugin = format!("kubernetes.io/csi:{}", source.driver);
        let uid = nodeagent_proto::k8s::pod_uid(pod);
        self.wanted
            .lock()
            .unwrap()
            .entry(uid.to_string())
            .or_default()
            .insert((source.driver.clone(), source.volume_handle.clone()));
        if mode == "Block" {
            return self
                .map_claimed(super::block::BlockClaim {
                    pod,
                    pv_name: &pv_name,
                    source: &source,
                    read_only: claim_read_only,
                    access_modes: spec.access_modes.clone().unwrap_or_default(),
                    plugin,
                })
                .await;
        }
        let step = |step: &str, e: String| ClaimError::Mount {
            plugin: plugin.clone(),
            message: format!("MountVolume.{step} failed for volume {pv_name:?} : {e}"),
        };
        let dir = self
            .volume_dir(uid, &pv_name)
            .map_err(|e| step("SetUp", e))?;
        // Upstream's `getReadOnlyFromSpec`: the claim's `readOnly` (the PV's `csi.readOnly`
        // is for ControllerPublishVolume only).
        let read_only = claim_read_only;
        let fs_type = source.fs_type.clone().unwrap_or_default();
        let access_modes = spec.access_modes.clone().unwrap_or_default();
        let target = dir.as_path().join(super::MOUNT_DIR);
        if crate::subpath::is_mount_point(&target) {
            self.keep_fs_group(
                pod,
                &target,
                &source.driver,
                &fs_type,
                read_only,
                &access_modes,
                &source.volume_handle,
            )
            .await
            .map_err(|e| step("SetUp", e))?;
            self.expand_if_grown(pod, &pvc, &pv, &target).await;
            if !self.requires_republish(&source.driver).await {
                return Ok((plugin, target));
            }
        }
        let policy = self.policy(&source.driver).await.map_err(|e| {
            step(
                "SetUp",
                format!("{PREFIX}mounter.SetupAt failed to check volume lifecycle mode: {e}"),
            )
        })?;
        policy.supports(&source.driver, "Persistent").map_err(|e| {
            step(
                "SetUp",
                format!("{PREFIX}mounter.SetupAt failed to check volume lifecycle mode: {e}"),
            )
        })?;
        let publish_context = if policy.attach_required {
            // Upstream's VerifyControllerAttachedVolume: not before the Node says the
            // volume is in use (so that no detach can race the mount) and attached.
            self.verify_controller_attached(pod, &pv_name, &source.driver, &source.volume_handle)
                .await
                .map_err(ClaimError::NotVerifiedAttached)?;
            self.wait_for_attach(&source.volume_handle, &source.driver)
                .await
                .map_err(|e| step("WaitForAttach", e))?
        } else {
            HashMap::new()
        };
        let driver = self.registry.driver(&source.driver).map_err(|e| {
            step(
                "MountDevice",
                format!("{PREFIX}attacher.MountDevice failed to create newCsiDriverClient: {e}"),
            )
        })?;
        let capabilities = self.try_capabilities(&driver).await.map_err(|status| {
            step(
                "MountDevice",
                format!(
                    "{PREFIX}attacher.MountDevice failed to check STAGE_UNSTAGE_VOLUME: {}",
                    go_rpc_error(&status)
                ),
            )
        })?;
        let mut context: HashMap<String, String> = source
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let staging = staging_path(&self.root, &source.driver, &source.volume_handle);
        // One set-up or unstage of a volume at a time: the pod's record is written under
        // it, before the publish, so that `unstage_unused` sees the volume in use.
        let lock = self.stage_lock(&staging);
        let _staging = lock.lock().await;
        let stage_secrets = self
            .secret_ref("NodeStageSecretRef", source.node_stage_secret_ref.as_ref())
            .await
            .map_err(|e| step("MountDevice", e))?;
        self.stage(
            &driver,
            &staging,
            &source.driver,
            &source.volume_handle,
            capabilities.stage_unstage,
            NodeStageVolumeRequest {
                volume_id: source.volume_handle.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                volume_capability: Some(super::capability(
                    &fs_type,
                    spec.mount_options.clone().unwrap_or_default(),
                    super::access_mode(&access_modes, capabilities),
                    // Upstream's MountDevice: a driver with VOLUME_MOUNT_GROUP gets the
                    // pod's fsGroup at the stage too, and applies it itself.
                    match crate::layout::fs_group(pod) {
                        Some(group) if capabilities.volume_mount_group => group.to_string(),
                        _ => String::new(),
                    },
                )),
                secrets: stage_secrets,
                volume_context: context.clone(),
            },
        )
        .await
        .map_err(|e| step("MountDevice", e))?;
        if policy.pod_info_on_mount {
            context.extend(super::pod_info(pod, false));
        }
        context.extend(self.token_attributes(pod, &policy).await.map_err(|e| {
            step(
                "SetUp",
                format!(
                    "{PREFIX}mounter.SetUpAt failed to get service accoount token attributes: {e}"
                ),
            )
        })?);
        let publish_secrets = self
            .secret_ref(
                "NodePublishSecretRef",
                source.node_publish_secret_ref.as_ref(),
            )
            .await
            .map_err(|e| step("SetUp", e))?;
        let target = self
            .publish(
                pod,
                dir.as_path(),
                &driver,
                &policy,
                capabilities,
                Publication {
                    driver: source.driver.clone(),
                    handle: source.volume_handle.clone(),
                    spec_name: pv_name.clone(),
                    mode: "Persistent",
                    fs_type,
                    mount_flags: spec.mount_options.clone().unwrap_or_default(),
                    read_only,
                    access_modes,
                    volume_context: context,
                    publish_context,
                    secrets: publish_secrets,
                    staging: capabilities.stage_unstage.then_some(staging),
                },
            )
            .await
            .map_err(|e| step("SetUp", e))?;
        // Upstream's MountVolume expands a volume that grew before it was mounted, too
        // (under the volume's lock, taken again there).
        drop(_staging);
        self.expand_if_grown(pod, &pvc, &pv, &target).await;
        Ok((plugin, target))
    }

    /// The secret a PersistentVolume names (any namespace), as the driver gets it.
    pub(super) async fn secret_ref(
        &self,
        which: &str,
        reference: Option<&k8s_openapi::api::core::v1::SecretReference>,
    ) -> Result<HashMap<String, String>, String> {
        let Some(reference) = reference else {
            return Ok(HashMap::new());
        };
        let name = reference.name.clone().unwrap_or_default();
        let ns = reference.namespace.clone().unwrap_or_default();
        let Some(client) = &self.client else {
            return Err(format!(
                "fetching {which} {ns}/{name} failed: no API server"
            ));
        };
        let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), &ns);
        let secret = secrets
            .get(&name)
            .await
            .map_err(|e| format!("fetching {which} {ns}/{name} failed: {}", api_error(&e)))?;
        Ok(super::secret_data(&secret))
    }

    /// Upstream's `WaitForAttach`, one look: the volume's VolumeAttachment must say it is
    /// attached; its `attachmentMetadata` is the publish context. Not yet attached is an
    /// error here and the pod's next pass looks again.
    pub(super) async fn wait_for_attach(
        &self,
        handle: &str,
        driver: &str,
    ) -> Result<HashMap<String, String>, String> {
        let id = super::attachment_name(handle, driver, &self.node_name);
        let Some(client) = &self.client else {
            return Err(format!(
                "volume {handle} has GET error for volume attachment {id}: no API server"
            ));
        };
        let attachments: kube::Api<VolumeAttachment> = kube::Api::all(client.clone());
        let attachment = attachments.get(&id).await.map_err(|e| {
            format!(
                "volume {handle} has GET error for volume attachment {id}: {}",
                api_error(&e)
            )
        })?;
        if attachment.metadata.deletion_timestamp.is_some() {
            return Err("volume attachment is being deleted".to_string());
        }
        let status = attachment.status.unwrap_or_default();
        if status.attached {
            return Ok(status
                .attachment_metadata
                .unwrap_or_default()
                .into_iter()
                .collect());
        }
        match status.attach_error.and_then(|e| e.message) {
            Some(message) => Err(message),
            None => Err(format!("attachment timeout for volume {handle}")),
        }
    }

    pub(super) fn stage_lock(&self, staging: &Path) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        self.stage_locks
            .lock()
            .unwrap()
            .entry(staging.to_path_buf())
            .or_default()
            .clone()
    }

    /// Upstream's `MountDevice`: the staging directory (0750) and its record first, then
    /// `NodeStageVolume` when the driver stages. A volume staged already, for another pod
    /// (its record names it and something is mounted there), is not staged again:
    /// upstream's actual state of the world says "device mounted" then.
    async fn stage(
        &self,
        driver: &super::registry::Driver,
        staging: &Path,
        driver_name: &str,
        handle: &str,
        stages: bool,
        request: NodeStageVolumeRequest,
    ) -> Result<(), String> {
        let data_dir = staging.parent().expect("globalmount has a parent");
        let record = DeviceData {
            driver_name: driver_name.to_string(),
            volume_handle: handle.to_string(),
        };
        if stages
            && crate::subpath::is_mount_point(staging)
            && read_device_data(data_dir).as_ref() == Ok(&record)
        {
            return Ok(());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(staging)
            .map_err(|e| {
                format!("{PREFIX}attacher.MountDevice failed to create dir {staging:?}:  {e}")
            })?;
        write_device_data(data_dir, &record)?;
        if !stages {
            return Ok(());
        }
        super::call(driver.node_client().node_stage_volume(request))
            .await
            .map(|_| ())
            .map_err(|status| go_rpc_error(&status))
    }

    /// Forgets what the released pod `uid` wanted.
    pub fn forget_wanted(&self, uid: &str) {
        self.wanted.lock().unwrap().remove(uid);
    }

    /// Upstream's `GetVolumesInUse`: the unique names (`kubernetes.io/csi/<driver>^<handle>`)
    /// of the attachable CSI volumes some pod here wants (set up or not), is published on,
    /// or that are still staged, sorted. What the attach/detach controller must not detach.
    /// A driver whose CSIDriver cannot be read counts as requiring attach: reporting a
    /// volume in use only keeps it attached, the safe side.
    pub async fn volumes_in_use(&self) -> Vec<String> {
        let mut devices: BTreeSet<(String, String)> = self
            .wanted
            .lock()
            .unwrap()
            .values()
            .flatten()
            .cloned()
            .collect();
        // What the disk says: published records (one that cannot be read is skipped, the
        // others count: too many in use is the safe side here).
        devices.extend(self.published_persistent().0);
        devices.extend(self.block_devices());
        let base = self.root.join(STAGING_DIR);
        for driver_dir in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            for volume in std::fs::read_dir(driver_dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Ok(record) = read_device_data(&volume.path()) {
                    devices.insert((record.driver_name, record.volume_handle));
                }
            }
        }
        let mut attachable: HashMap<String, bool> = HashMap::new();
        let mut names = Vec::new();
        for (driver, handle) in devices {
            let required = match attachable.get(&driver) {
                Some(r) => *r,
                None => {
                    let r = self
                        .policy(&driver)
                        .await
                        .map_or(true, |p| p.attach_required);
                    attachable.insert(driver.clone(), r);
                    r
                }
            };
            if required {
                names.push(unique_volume_name(&driver, &handle));
            }
        }
        names.sort();
        names
    }

    /// Upstream's VerifyControllerAttachedVolume for an attachable volume: the Node's
    /// `status.volumesInUse` must name it (`ReportedInUse`: no detach can then race the
    /// mount), and the attach/detach controller must list it in `status.volumesAttached`;
    /// else that function's error.
    pub(super) async fn verify_controller_attached(
        &self,
        pod: &Pod,
        pv_name: &str,
        driver: &str,
        handle: &str,
    ) -> Result<(), String> {
        let unique = unique_volume_name(driver, handle);
        let detailed = |prefix: &str| {
            format!(
                "{prefix} for volume {pv_name:?} (UniqueName: {unique:?}) pod {:?} (UID: {:?})",
                nodeagent_proto::k8s::pod_name(pod),
                nodeagent_proto::k8s::pod_uid(pod)
            )
        };
        // Upstream's GenerateErrorDetailed: the error after " : ".
        let fetch_failed = |e: &str| {
            format!(
                "{} : {e}",
                detailed("VerifyControllerAttachedVolume failed fetching node from API server")
            )
        };
        let Some(client) = &self.client else {
            return Err(fetch_failed("no API server"));
        };
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| fetch_failed(&api_error(&e)))?;
        let status = node.status.unwrap_or_default();
        let reported = status
            .volumes_in_use
            .is_some_and(|in_use| in_use.contains(&unique));
        if !reported {
            return Err(detailed(
                "Volume has not been added to the list of VolumesInUse in the node's volume status",
            ));
        }
        let attached = status
            .volumes_attached
            .into_iter()
            .flatten()
            .any(|a| a.name == unique);
        if attached {
            Ok(())
        } else {
            Err(detailed("Volume not attached according to node status"))
        }
    }

    /// The volumes (driver, handle) some pod's record names as published persistent. Any
    /// directory or record that cannot be read is an error: nothing is then known unused.
    fn persistent_in_use(&self) -> Result<BTreeSet<(String, String)>, String> {
        let (used, errors) = self.published_persistent();
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(used),
        }
    }

    /// The volumes (driver, handle) the pods' records name as published persistent, and
    /// what could not be read.
    fn published_persistent(&self) -> (BTreeSet<(String, String)>, Vec<String>) {
        fn entries(dir: &Path, errors: &mut Vec<String>) -> Vec<std::fs::DirEntry> {
            match std::fs::read_dir(dir).and_then(|read| read.collect::<Result<Vec<_>, _>>()) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => {
                    errors.push(format!("cannot read {dir:?}: {e}"));
                    Vec::new()
                }
            }
        }
        let mut used = BTreeSet::new();
        let mut errors = Vec::new();
        for pod in entries(&self.root.join("pods"), &mut errors) {
            let base = pod.path().join("volumes").join(super::CSI_PLUGIN_DIR);
            for volume in entries(&base, &mut errors) {
                // No record: nothing was ever published there.
                if !volume.path().join(VOL_DATA).exists() {
                    continue;
                }
                match super::read_vol_data(&volume.path()) {
                    Ok(data) if data.volume_lifecycle_mode == "Persistent" => {
                        used.insert((data.driver_name, data.volume_handle));
                    }
                    Ok(_) => {}
                    Err(e) => errors.push(e),
                }
            }
        }
        (used, errors)
    }

    /// Unstages every staged volume no pod's record names (upstream's `UnmountDevice`
    /// once the last pod is gone), and removes its directory. A volume whose driver is
    /// not registered, or whose unstage fails, stays staged and is named in the errors:
    /// called again later (each pod's release, and periodically).
    pub async fn unstage_unused(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let base = self.root.join(STAGING_DIR);
        for driver_dir in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            if driver_dir.file_name() == VOLUME_DEVICES {
                continue;
            }
            for volume in std::fs::read_dir(driver_dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let staging = volume.path().join(GLOBAL_MOUNT);
                let lock = self.stage_lock(&staging);
                let _staging = lock.lock().await;
                let in_use = match self.persistent_in_use() {
                    Ok(in_use) => in_use,
                    Err(e) => {
                        errors.push(format!("nothing unstaged: {e}"));
                        return errors;
                    }
                };
                let record = read_device_data(&volume.path());
                if let Ok(record) = &record
                    && in_use.contains(&(record.driver_name.clone(), record.volume_handle.clone()))
                {
                    continue;
                }
                match self.unstage(&volume.path(), record).await {
                    Ok(()) => {
                        tracing::info!(staging = %staging.display(), "CSI volume unstaged: no pod uses it");
                        // Forgotten only if nobody else holds or waits for it (every clone
                        // is taken under the map's lock): a set-up waiting on this lock
                        // must not find a new one beside it.
                        let mut locks = self.stage_locks.lock().unwrap();
                        if std::sync::Arc::strong_count(&lock) == 2 {
                            locks.remove(&staging);
                        }
                    }
                    Err(e) => errors.push(format!(
                        "UnmountDevice failed for {}: {e}",
                        volume.path().display()
                    )),
                }
            }
            // Gone once its last volume is.
            let _ = std::fs::remove_dir(driver_dir.path());
        }
        errors.extend(self.unstage_unused_block().await);
        errors
    }

    /// [`Self::unstage_unused`] every [`UNSTAGE_EVERY`] until `shutdown`.
    pub async fn unstage_unused_periodically(self, shutdown: nodeagent_transport::Shutdown) {
        loop {
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep(UNSTAGE_EVERY) => {}
            }
            for error in self.unstage_unused().await {
                tracing::warn!(%error, "CSI volume not unstaged; retried later");
            }
        }
    }

    async fn unstage(&self, dir: &Path, record: Result<DeviceData, String>) -> Result<(), String> {
        let staging = dir.join(GLOBAL_MOUNT);
        match record {
            Ok(record) => {
                let driver = self.registry.driver(&record.driver_name).map_err(|e| {
                    format!(
                        "{PREFIX}attacher.UnmountDevice failed to create newCsiDriverClient: {e}"
                    )
                })?;
                let capabilities = self.try_capabilities(&driver).await.map_err(|status| {
                    format!(
                        "{PREFIX}attacher.UnmountDevice failed to check whether STAGE_UNSTAGE_VOLUME set: {}",
                        go_rpc_error(&status)
                    )
                })?;
                if capabilities.stage_unstage {
                    let request = NodeUnstageVolumeRequest {
                        volume_id: record.volume_handle.clone(),
                        staging_target_path: staging.to_string_lossy().into_owned(),
                    };
                    super::call(driver.node_client().node_unstage_volume(request))
                        .await
                        .map_err(|status| {
                            format!(
                                "{PREFIX}attacher.UnmountDevice failed: {}",
                                go_rpc_error(&status)
                            )
                        })?;
                }
            }
            // No record: only a directory nothing is mounted on can go.
            Err(e) if crate::subpath::is_mount_point(&staging) => {
                return Err(format!("{staging:?} is mounted and {e}"));
            }
            Err(_) => {}
        }
        if crate::subpath::is_mount_point(&staging) {
            return Err(format!("the driver left {staging:?} mounted"));
        }
        for (path, is_dir) in [
            (staging.clone(), true),
            (dir.join(VOL_DATA), false),
            (dir.join(VOL_DATA_TMP), false),
            (dir.to_path_buf(), true),
        ] {
            let removed = if is_dir {
                std::fs::remove_dir(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(format!("failed to clean up global mount {dir:?}: {e}"));
                }
            }
        }
        Ok(())
    }
}

/// Whether any container of the pod mounts the volume `name` (`volumeMounts`), and
/// whether any uses it as a device (`volumeDevices`): upstream's `GetPodVolumeNames`.
fn used_as(pod: &Pod, name: &str) -> (bool, bool) {
    let Some(spec) = &pod.spec else {
        return (false, false);
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let (mut mounts, mut devices) = (false, false);
    for c in containers {
        mounts |= c.volume_mounts.iter().flatten().any(|m| m.name == name);
        devices |= c.volume_devices.iter().flatten().any(|d| d.name == name);
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        mounts |= c.volume_mounts.iter().flatten().any(|m| m.name == name);
    }
    (mounts, devices)
}

/// The claim of the pod's volume `volume`: a `persistentVolumeClaim`'s, or a generic
/// `ephemeral` volume's `<pod>-<volume>` (upstream's `ephemeral.VolumeClaimName`). None for
/// other kinds.
pub fn claim_name(pod: &Pod, volume: &Volume) -> Option<String> {
    match (&volume.persistent_volume_claim, &volume.ephemeral) {
        (Some(c), _) => Some(c.claim_name.clone()),
        (None, Some(_)) => Some(format!(
            "{}-{}",
            nodeagent_proto::k8s::pod_name(pod),
            volume.name
        )),
        (None, None) => None,
    }
}

/// A `hostPath` or `local` PersistentVolume (what local-path provisioners make): the
/// host's directory itself, a hostPath's `type` checked as for a pod's hostPath volume, a
/// local volume's path required to exist (upstream's local plugin bind-mounts it; the
/// container runtime's bind gives the container the same directory). None for other kinds.
fn host_volume(
    pv_name: &str,
    spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec,
) -> Option<Result<ClaimedVolume, ClaimError>> {
    if let Some(host) = &spec.host_path {
        let plugin = "kubernetes.io/host-path".to_string();
        return Some(
            match crate::layout::ensure_host_path(
                pv_name,
                &host.path,
                host.type_.as_deref().unwrap_or_default(),
            ) {
                Ok(path) => Ok((plugin, path)),
                Err(e) => Err(ClaimError::Mount {
                    plugin,
                    message: e.to_string(),
                }),
            },
        );
    }
    let local = spec.local.as_ref()?;
    let plugin = "kubernetes.io/local-volume".to_string();
    let path = Path::new(&local.path);
    Some(if path.is_absolute() && path.exists() {
        Ok((plugin, path.to_path_buf()))
    } else {
        Err(ClaimError::Mount {
            plugin,
            message: format!(
                "MountVolume.NewMounter initialization failed for volume {pv_name:?} : path {:?} does not exist",
                local.path
            ),
        })
    })
}

fn write_device_data(dir: &Path, data: &DeviceData) -> Result<(), String> {
    super::write_record(dir, data)
        .map_err(|e| format!("{PREFIX}attacher.MountDevice failed to save volume info data: {e}"))
}

fn read_device_data(dir: &Path) -> Result<DeviceData, String> {
    super::read_record(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's `makeDeviceMountPath` (csi_attacher.go): the plugin directory, the
    /// driver's name, sha256 of the volume handle in hex, `globalmount`.
    #[test]
    fn the_staging_path_is_upstreams() {
        let path = staging_path(
            Path::new("/var/lib/kubelet"),
            "hostpath.csi.k8s.io",
            "vol-1",
        );
        // sha256("vol-1"), computed outside the project (Python's hashlib).
        assert_eq!(
            path,
            Path::new(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/d2e8363faaac7ae76def3b14091d8eb5755f6b92e9531627aeec833a8731cc49/globalmount"
            )
        );
    }

    /// The staged record as upstream writes it: the two keys, sorted, one line.
    #[test]
    fn the_staged_record_has_upstreams_two_keys() {
        let dir = tempfile::tempdir().unwrap();
        let record = DeviceData {
            driver_name: "d".into(),
            volume_handle: "h".into(),
        };
        write_device_data(dir.path(), &record).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(VOL_DATA)).unwrap(),
            "{\"driverName\":\"d\",\"volumeHandle\":\"h\"}\n"
        );
        assert_eq!(read_device_data(dir.path()).unwrap(), record);
    }

    fn record(root: &Path, uid: &str, pv: &str, mode: &str, handle: &str) {
        let dir = root
            .join("pods")
            .join(uid)
            .join("volumes")
            .join(super::super::CSI_PLUGIN_DIR)
            .join(pv);
        std::fs::create_dir_all(&dir).unwrap();
        super::super::write_vol_data(
            &dir,
            &super::super::VolData {
                attachment_id: String::new(),
                spec_vol_id: pv.into(),
                volume_handle: handle.into(),
                driver_name: "d".into(),
                node_name: "n".into(),
                volume_lifecycle_mode: mode.into(),
            },
        )
        .unwrap();
    }

    /// A staged volume a pod's record names stays; one no record names is unstaged (its
    /// driver stages nothing here: no driver is needed to remove an unmounted directory
    /// with no record) and its directories go; an inline volume's record keeps nothing.
    #[tokio::test]
    async fn only_a_volume_no_pod_names_is_unstaged() {
        let root = tempfile::tempdir().unwrap();
        let csi = Csi::new(root.path(), None, "n".into());
        record(root.path(), "uid-1", "pv-1", "Persistent", "used");
        record(root.path(), "uid-2", "inline", "Ephemeral", "inline-handle");
        let used = staging_path(root.path(), "d", "used");
        let unused = staging_path(root.path(), "d", "inline-handle");
        let unrecorded = staging_path(root.path(), "d", "unrecorded");
        for path in [&used, &unused, &unrecorded] {
            std::fs::create_dir_all(path).unwrap();
        }
        for (path, handle) in [(&used, "used"), (&unused, "inline-handle")] {
            write_device_data(
                path.parent().unwrap(),
                &DeviceData {
                    driver_name: "d".into(),
                    volume_handle: handle.into(),
                },
            )
            .unwrap();
        }
        let errors = csi.unstage_unused().await;
        // The unused one has a record and a driver that is not registered: it stays, and
        // the error says why; the one without a record and nothing mounted goes.
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("driver name d not found in the list of registered CSI drivers"),
            "{errors:?}"
        );
        assert!(used.is_dir());
        assert!(unused.is_dir());
        assert!(!unrecorded.parent().unwrap().exists());
        let in_use = csi.persistent_in_use().unwrap();
        assert!(in_use.contains(&("d".into(), "used".into())));
        assert!(!in_use.contains(&("d".into(), "inline-handle".into())));
    }
}
