//! CSI volumes (issue 32): upstream's CSI volume plugin (`pkg/volume/csi`) for inline
//! ephemeral volumes (`csi:` in the pod) and, in [`persistent`], for the CSI persistent
//! volumes a pod claims, with the drivers found by [`registry`] and the node's CSINode kept
//! by [`nodeinfo`].
//!
//! An inline volume is published straight to its target path (upstream skips staging for
//! them: `CanDeviceMount` is false), `<root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`,
//! with `vol_data.json` beside it naming the driver and the volume handle. That file is
//! written *before* `NodePublishVolume`, so whatever a crash interrupts, the teardown
//! knows whom to ask to unpublish; nothing else is kept, so a restarted volume service
//! knows every publication from disk.

pub mod block;
mod expand;
pub mod nodeinfo;
pub mod persistent;
pub mod registry;
pub mod stats;

use k8s_openapi::api::core::v1::{CSIVolumeSource, Pod, Secret};
use k8s_openapi::api::storage::v1::CSIDriver;
use nodeagent_hostpath::HostPath;
use nodeagent_proto::csi::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability, volume_capability,
};
use registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::layout::{CSI_PLUGIN_DIR, MOUNT_DIR};
/// What upstream writes beside it.
const VOL_DATA: &str = "vol_data.json";
/// Where it is written first (then renamed): a crash may leave it.
const VOL_DATA_TMP: &str = ".vol_data.json.tmp";
/// A CSI call must answer within this (upstream's `csiTimeout`).
const CSI_TIMEOUT: Duration = Duration::from_secs(120);
/// The prefix upstream's CSI plugin puts on its errors.
const PREFIX: &str = "kubernetes.io/csi: ";
/// The volume attribute a driver with `tokenRequests` finds its tokens in.
const SERVICE_ACCOUNT_TOKENS: &str = "csi.storage.k8s.io/serviceAccount.tokens";
/// The lifetime the API server gives a TokenRequest that asks for none.
const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// How long a driver's `requiresRepublish` is taken as read.
const REPUBLISH_CHECK_EVERY: Duration = Duration::from_secs(30);

/// `vol_data.json`, with upstream's keys (written as upstream's `json.Encoder` writes a
/// `map[string]string`: keys sorted, one line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolData {
    #[serde(rename = "attachmentID")]
    pub attachment_id: String,
    #[serde(rename = "specVolID")]
    pub spec_vol_id: String,
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    #[serde(rename = "driverName")]
    pub driver_name: String,
    #[serde(rename = "nodeName")]
    pub node_name: String,
    #[serde(rename = "volumeLifecycleMode")]
    pub volume_lifecycle_mode: String,
}

/// Upstream's `makeVolumeHandle`: an inline volume's handle, the same for the same pod
/// and volume name.
pub fn volume_handle(pod_uid: &str, volume_name: &str) -> String {
    csi_sha256(&format!("{pod_uid}{volume_name}"))
}

/// Upstream's `getAttachmentName`: the VolumeAttachment a volume would have.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    csi_sha256(&format!("{handle}{driver}{node}"))
}

fn csi_sha256(text: &str) -> String {
    use sha2::Digest;
    format!("csi-{:x}", sha2::Sha256::digest(text.as_bytes()))
}

/// A gRPC error as Go's grpc-go prints it (`rpc error: code = Internal desc = ...`), the
/// words upstream's events carry.
pub fn go_rpc_error(status: &tonic::Status) -> String {
    use tonic::Code;
    let code = match status.code() {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}

/// A CSI call with upstream's timeout (`csiTimeout`); running out of it reads as gRPC's
/// own deadline error.
async fn call<T>(
    request: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(CSI_TIMEOUT, request).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "context deadline exceeded",
        )),
    }
}

/// Whether a failed publish may have left something published (upstream's "uncertain"
/// codes): the volume is then kept for the teardown to unpublish.
fn uncertain(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(list: &[String]) -> String {
    let items: Vec<String> = list.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(" "))
}

/// What the driver's CSIDriver object says (upstream's defaults when there is none).
#[derive(Debug, Clone, PartialEq, Eq)]
struct DriverPolicy {
    /// Whether there is a CSIDriver object at all.
    exists: bool,
    volume_lifecycle_modes: Vec<String>,
    attach_required: bool,
    pod_info_on_mount: bool,
    fs_group_policy: String,
    /// `tokenRequests`: (audience, expirationSeconds).
    token_requests: Vec<(String, Option<i64>)>,
    /// `requiresRepublish`: `NodePublishVolume` again at every set-up of a published volume.
    requires_republish: bool,
}

impl DriverPolicy {
    /// Upstream's `supportsVolumeLifecycleMode`: without a CSIDriver only `Persistent`.
    fn supports(&self, driver: &str, mode: &str) -> Result<(), String> {
        if !self.exists && mode != "Persistent" {
            return Err(format!(
                "volume mode {mode:?} not supported by driver {driver} (no CSIDriver object)"
            ));
        }
        if !self.volume_lifecycle_modes.iter().any(|m| m == mode) {
            return Err(format!(
                "volume mode {mode:?} not supported by driver {driver} (only supports {})",
                go_quoted(&self.volume_lifecycle_modes)
            ));
        }
        Ok(())
    }
}

/// What one `NodePublishVolume` asks of a driver: an inline volume's or a persistent
/// volume's.
struct Publication {
    driver: String,
    handle: String,
    /// The volume directory's name: the pod's volume name (inline), the PV's name.
    spec_name: String,
    /// `Ephemeral` or `Persistent` (`vol_data.json`'s `volumeLifecycleMode`).
    mode: &'static str,
    fs_type: String,
    mount_flags: Vec<String>,
    read_only: bool,
    /// The PV's access modes (an inline volume is `ReadWriteOnce`).
    access_modes: Vec<String>,
    volume_context: HashMap<String, String>,
    publish_context: HashMap<String, String>,
    secrets: HashMap<String, String>,
    /// The staging path, when the driver staged the volume.
    staging: Option<PathBuf>,
}

#[derive(Clone)]
pub struct Csi {
    pub registry: Registry,
    client: Option<kube::Client>,
    node_name: String,
    root: PathBuf,
    layout: crate::PodVolumeLayout,
    /// One stage, set-up or unstage of a staged volume at a time (`persistent`).
    stage_locks:
        std::sync::Arc<std::sync::Mutex<HashMap<PathBuf, std::sync::Arc<tokio::sync::Mutex<()>>>>>,
    /// Per pod UID: the CSI persistent volumes (driver, handle) its claims resolved to,
    /// set up or not (upstream's desired state of world), for `volumes_in_use`.
    wanted: std::sync::Arc<std::sync::Mutex<HashMap<String, Devices>>>,
    /// Where the service account tokens of drivers with `tokenRequests` come from.
    tokens: Option<crate::fetch::Fetcher>,
    /// Per driver: its `requiresRepublish` and when it was read.
    republish: std::sync::Arc<std::sync::Mutex<HashMap<String, (bool, std::time::Instant)>>>,
}

/// CSI volumes as (driver, handle).
type Devices = std::collections::BTreeSet<(String, String)>;

impl Csi {
    pub fn new(root: &Path, client: Option<kube::Client>, node_name: String) -> Self {
        let node = nodeinfo::NodeInfo::new(client.clone(), node_name.clone());
        Self {
            registry: Registry::new(root, node),
            client,
            node_name,
            root: root.to_path_buf(),
            layout: crate::PodVolumeLayout::new(root.to_path_buf()),
            stage_locks: Default::default(),
            wanted: Default::default(),
            tokens: None,
            republish: Default::default(),
        }
    }

    /// With `fetcher` for the service account tokens of drivers with `tokenRequests`.
    pub fn with_tokens(mut self, fetcher: crate::fetch::Fetcher) -> Self {
        self.tokens = Some(fetcher);
        self
    }

    /// Upstream's `podServiceAccountTokenAttrs`: for a driver with `tokenRequests`, a token
    /// of the pod's service account bound to the pod per audience, as
    /// `csi.storage.k8s.io/serviceAccount.tokens` (a JSON object of TokenRequest statuses
    /// by audience).
    async fn token_attributes(
        &self,
        pod: &Pod,
        policy: &DriverPolicy,
    ) -> Result<Option<(String, String)>, String> {
        if policy.token_requests.is_empty() {
            return Ok(None);
        }
        let tokens = self
            .tokens
            .as_ref()
            .ok_or_else(|| "ServiceAccountTokenGetter is nil".to_string())?;
        let mut out = BTreeMap::new();
        for (audience, seconds) in &policy.token_requests {
            let request = crate::payload::TokenRequestKey {
                audience: audience.clone(),
                // Unset: the API server's default lifetime of a TokenRequest.
                expiration_seconds: seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
            };
            out.insert(audience.clone(), tokens.token_status(pod, &request).await?);
        }
        let json = serde_json::to_string(&out).map_err(|e| e.to_string())?;
        Ok(Some((SERVICE_ACCOUNT_TOKENS.to_string(), json)))
    }

    /// Whether the driver wants `NodePublishVolume` again for a published volume
    /// (`requiresRepublish`); a CSIDriver that cannot be read says no, so a running pod's
    /// volume is left as it is. Read at most every [`REPUBLISH_CHECK_EVERY`] per driver:
    /// every pod sync asks for every published volume (upstream reads an informer's cache).
    async fn requires_republish(&self, driver: &str) -> bool {
        let now = std::time::Instant::now();
        if let Some((answer, at)) = self.republish.lock().unwrap().get(driver)
            && now.duration_since(*at) < REPUBLISH_CHECK_EVERY
        {
            return *answer;
        }
        match self.policy(driver).await {
            Ok(p) => {
                let answer = p.requires_republish;
                self.republish
                    .lock()
                    .unwrap()
                    .insert(driver.to_string(), (answer, now));
                answer
            }
            Err(_) => false,
        }
    }

    fn volume_dir(&self, uid: &str, name: &str) -> Result<HostPath, String> {
        self.layout
            .volume_dir(uid, CSI_PLUGIN_DIR, name)
            .map_err(|e| e.to_string())
    }

    /// Publishes the pod's inline CSI volume `name` unless it is published already; its
    /// target path. `secrets`: the fetched objects (the `nodePublishSecretRef`'s).
    /// Errors are upstream's SetUp messages (without the `MountVolume.SetUp failed` part).
    pub async fn set_up(
        &self,
        pod: &Pod,
        name: &str,
        source: &CSIVolumeSource,
        secrets: &BTreeMap<String, crate::payload::Fetched<Secret>>,
    ) -> Result<PathBuf, String> {
        let uid = nodeagent_proto::k8s::pod_uid(pod);
        let dir = self.volume_dir(uid, name)?;
        let target = dir.as_path().join(MOUNT_DIR);
        let fs_type = source.fs_type.clone().unwrap_or_default();
        let read_only = source.read_only.unwrap_or(false);
        // Upstream's access mode for an inline volume.
        let access_modes = vec!["ReadWriteOnce".to_string()];
        let handle = volume_handle(uid, name);
        if crate::subpath::is_mount_point(&target) {
            self.keep_fs_group(
                pod,
                &target,
                &source.driver,
                &fs_type,
                read_only,
                &access_modes,
                &handle,
            )
            .await?;
            if !self.requires_republish(&source.driver).await {
                return Ok(target);
            }
        }
        // Upstream's NewMounter needs a client: a standalone node has no CSIDriver to read.
        if self.client.is_none() {
            return Err(format!("{PREFIX}failed to get a kubernetes client"));
        }
        let driver = self
            .registry
            .driver(&source.driver)
            .map_err(|e| format!("{PREFIX}mounter.SetUpAt failed to get CSI client: {e}"))?;
        let policy = self
            .policy(&source.driver)
            .await
            .and_then(|p| p.supports(&source.driver, "Ephemeral").map(|()| p))
            .map_err(|e| {
                format!("{PREFIX}mounter.SetupAt failed to check volume lifecycle mode: {e}")
            })?;
        let mut context: HashMap<String, String> = source
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        if policy.pod_info_on_mount {
            context.extend(pod_info(pod, true));
        }
        context.extend(self.token_attributes(pod, &policy).await.map_err(|e| {
            format!("{PREFIX}mounter.SetUpAt failed to get service accoount token attributes: {e}")
        })?);
        let publish_secrets = match &source.node_publish_secret_ref {
            Some(r) => {
                let name = r.name.clone();
                let ns = nodeagent_proto::k8s::pod_namespace(pod);
                match secrets.get(&name) {
                    Some(Ok(Some(secret))) => secret_data(secret),
                    Some(Ok(None)) => {
                        return Err(format!(
                            "fetching NodePublishSecretRef {ns}/{name} failed: secrets \"{name}\" not found"
                        ));
                    }
                    Some(Err(e)) => {
                        return Err(format!(
                            "fetching NodePublishSecretRef {ns}/{name} failed: {e}"
                        ));
                    }
                    None => HashMap::new(),
                }
            }
            None => HashMap::new(),
        };
        let capabilities = self.capabilities(&driver).await;
        self.publish(
            pod,
            dir.as_path(),
            &driver,
            &policy,
            capabilities,
            Publication {
                driver: source.driver.clone(),
                handle,
                spec_name: name.to_string(),
                mode: "Ephemeral",
                fs_type,
                mount_flags: vec![],
                read_only,
                access_modes,
                volume_context: context,
                publish_context: HashMap::new(),
                secrets: publish_secrets,
                staging: None,
            },
        )
        .await
    }

    /// A published volume's fsGroup ownership, made again if a crash or a failure came
    /// between the publish and the ownership (upstream would SetUp again).
    #[allow(clippy::too_many_arguments)]
    async fn keep_fs_group(
        &self,
        pod: &Pod,
        target: &Path,
        driver_name: &str,
        fs_type: &str,
        read_only: bool,
        access_modes: &[String],
        handle: &str,
    ) -> Result<(), String> {
        let Some(group) = crate::layout::fs_group(pod) else {
            return Ok(());
        };
        if owned_by_group(target, group) {
            return Ok(());
        }
        let policy = self.policy(driver_name).await.map_err(|e| {
            format!("{PREFIX}mounter.SetupAt failed to check volume lifecycle mode: {e}")
        })?;
        if !applies_fs_group(&policy.fs_group_policy, fs_type, read_only, access_modes) {
            return Ok(());
        }
        let driver = self
            .registry
            .driver(driver_name)
            .map_err(|e| format!("{PREFIX}mounter.SetUpAt failed to get CSI client: {e}"))?;
        if self.capabilities(&driver).await.volume_mount_group {
            return Ok(());
        }
        apply_fs_group(target, group, read_only, pod)
            .await
            .map_err(|e| format!("applyFSGroup failed for vol {handle}: {e}"))
    }

    /// Upstream's `SetUpAt`: the volume's directory (0750; the driver makes the target)
    /// and its `vol_data.json` first, so that whatever a crash interrupts, the teardown
    /// knows whom to ask to unpublish; then `NodePublishVolume`, then the fsGroup.
    async fn publish(
        &self,
        pod: &Pod,
        dir: &Path,
        driver: &registry::Driver,
        policy: &DriverPolicy,
        capabilities: NodeCapabilities,
        p: Publication,
    ) -> Result<PathBuf, String> {
        let target = dir.join(MOUNT_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|e| format!("{PREFIX}mounter.SetUpAt failed to create dir {dir:?}:  {e}"))?;
        let data = VolData {
            attachment_id: attachment_name(&p.handle, &p.driver, &self.node_name),
            spec_vol_id: p.spec_name.clone(),
            volume_handle: p.handle.clone(),
            driver_name: p.driver.clone(),
            node_name: self.node_name.clone(),
            volume_lifecycle_mode: p.mode.to_string(),
        };
        write_vol_data(dir, &data)?;
        let fs_group = crate::layout::fs_group(pod);
        // A driver with VOLUME_MOUNT_GROUP applies the fsGroup itself.
        let volume_mount_group = match fs_group {
            Some(g) if capabilities.volume_mount_group => g.to_string(),
            _ => String::new(),
        };
        let request = NodePublishVolumeRequest {
            volume_id: p.handle.clone(),
            publish_context: p.publish_context,
            staging_target_path: p
                .staging
                .as_ref()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(capability(
                &p.fs_type,
                p.mount_flags,
                access_mode(&p.access_modes, capabilities),
                volume_mount_group,
            )),
            readonly: p.read_only,
            secrets: p.secrets,
            volume_context: p.volume_context,
        };
        // Upstream returns the driver's error as it is. A final one removes what was made
        // for the volume; an uncertain one (the publish may have happened, or the call ran
        // out of time) keeps it, so that the teardown unpublishes.
        if let Err(status) = call(driver.node_client().node_publish_volume(request)).await {
            if !uncertain(&status) {
                remove_volume_dir(dir);
            }
            return Err(go_rpc_error(&status));
        }
        if let Some(group) = fs_group
            && !capabilities.volume_mount_group
            && applies_fs_group(
                &policy.fs_group_policy,
                &p.fs_type,
                p.read_only,
                &p.access_modes,
            )
            && let Err(e) = apply_fs_group(&target, group, p.read_only, pod).await
        {
            // Uncertain, as upstream: kept published, the teardown unpublishes it.
            return Err(format!(
                "applyFSGroup failed for vol {}: {e}",
                data.volume_handle
            ));
        }
        tracing::info!(volume = %p.spec_name, driver = %p.driver, mode = p.mode, target = %target.display(), "CSI volume published");
        Ok(target)
    }

    /// The driver's CSIDriver, or upstream's defaults when it has none (attach
    /// required, `Persistent` only).
    async fn policy(&self, driver: &str) -> Result<DriverPolicy, String> {
        let Some(client) = &self.client else {
            return Err("no API server".to_string());
        };
        let api: kube::Api<CSIDriver> = kube::Api::all(client.clone());
        let found = api
            .get_opt(driver)
            .await
            .map_err(|e| format!("cannot get CSIDriver {driver}: {e}"))?;
        let Some(found) = found else {
            return Ok(DriverPolicy {
                exists: false,
                volume_lifecycle_modes: vec!["Persistent".to_string()],
                attach_required: true,
                pod_info_on_mount: false,
                fs_group_policy: "ReadWriteOnceWithFSType".to_string(),
                token_requests: Vec::new(),
                requires_republish: false,
            });
        };
        Ok(DriverPolicy {
            exists: true,
            // The API server defaults an unset list to Persistent; `[]` when it is not.
            volume_lifecycle_modes: found
                .spec
                .volume_lifecycle_modes
                .clone()
                .unwrap_or_default(),
            attach_required: found.spec.attach_required.unwrap_or(true),
            pod_info_on_mount: found.spec.pod_info_on_mount.unwrap_or(false),
            fs_group_policy: found
                .spec
                .fs_group_policy
                .clone()
                .unwrap_or_else(|| "ReadWriteOnceWithFSType".to_string()),
            token_requests: found
                .spec
                .token_requests
                .iter()
                .flatten()
                .map(|t| (t.audience.clone(), t.expiration_seconds))
                .collect(),
            requires_republish: found.spec.requires_republish.unwrap_or(false),
        })
    }

    /// The driver's node capabilities that change a publish (upstream asks before each);
    /// none when the driver cannot say (for an inline volume's publish).
    async fn capabilities(&self, driver: &registry::Driver) -> NodeCapabilities {
        self.try_capabilities(driver).await.unwrap_or_default()
    }

    /// The driver's node capabilities, or why it could not say (where a wrong guess
    /// would skip a stage or an unstage, upstream fails instead).
    async fn try_capabilities(
        &self,
        driver: &registry::Driver,
    ) -> Result<NodeCapabilities, tonic::Status> {
        use nodeagent_proto::csi::node_service_capability::{Type, rpc};
        let answer = call(
            driver
                .node_client()
                .node_get_capabilities(nodeagent_proto::csi::NodeGetCapabilitiesRequest {}),
        )
        .await?;
        let has = |want: rpc::Type| {
            answer
                .capabilities
                .iter()
                .any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == want as i32))
        };
        Ok(NodeCapabilities {
            single_node_multi_writer: has(rpc::Type::SingleNodeMultiWriter),
            volume_mount_group: has(rpc::Type::VolumeMountGroup),
            stage_unstage: has(rpc::Type::StageUnstageVolume),
            volume_stats: has(rpc::Type::GetVolumeStats),
            expand_volume: has(rpc::Type::ExpandVolume),
        })
    }

    async fn unpublish(
        &self,
        driver: &registry::Driver,
        handle: &str,
        target: &Path,
    ) -> Result<(), String> {
        let request = NodeUnpublishVolumeRequest {
            volume_id: handle.to_string(),
            target_path: target.to_string_lossy().into_owned(),
        };
        call(driver.node_client().node_unpublish_volume(request))
            .await
            .map(|_| ())
            .map_err(|status| {
                format!(
                    "{PREFIX}Unmounter.TearDownAt failed: {}",
                    go_rpc_error(&status)
                )
            })
    }

    /// Unpublishes every CSI volume of the pod `uid` found on disk and removes its
    /// directory. A volume whose driver is not registered, or whose unpublish fails, stays
    /// (mounted, with its `vol_data.json`) and the error says why: the caller retries, and
    /// nothing is ever unmounted behind the driver's back.
    pub async fn tear_down_pod(&self, uid: &str) -> Result<(), String> {
        // The block volumes first; a failure there does not hold back the others.
        let unmapped = self.unmap_pod(uid).await;
        let base = self
            .layout
            .pod_dir(uid)
            .map_err(|e| e.to_string())?
            .as_path()
            .join("volumes")
            .join(CSI_PLUGIN_DIR);
        let mut errors: Vec<String> = unmapped.err().into_iter().collect();
        let entries = std::fs::read_dir(&base).into_iter().flatten();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Err(e) = self.tear_down(&entry.path()).await {
                errors.push(format!(
                    "UnmountVolume.TearDown failed for volume {name:?} (pod {uid}): {e}"
                ));
            }
        }
        if errors.is_empty() {
            let _ = std::fs::remove_dir(&base);
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    async fn tear_down(&self, dir: &Path) -> Result<(), String> {
        let target = dir.join(MOUNT_DIR);
        let data = read_vol_data(dir);
        match data {
            Ok(data) => {
                let driver = self.registry.driver(&data.driver_name).map_err(|e| {
                    format!("{PREFIX}Unmounter.TearDownAt failed to get CSI client: {e}")
                })?;
                self.unpublish(&driver, &data.volume_handle, &target)
                    .await?;
            }
            // No record: only a directory that nothing is mounted on can be removed.
            Err(e) if crate::subpath::is_mount_point(&target) => {
                return Err(format!(
                    "{PREFIX}Unmounter.TearDownAt failed: {target:?} is mounted and {e}"
                ));
            }
            Err(_) => {}
        }
        if crate::subpath::is_mount_point(&target) {
            return Err(format!(
                "{PREFIX}Unmounter.TearDownAt failed: the driver left {target:?} mounted"
            ));
        }
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!(
                    "{PREFIX}Unmounter.TearDownAt failed to remove {target:?}: {e}"
                ));
            }
        }
        for file in [VOL_DATA, VOL_DATA_TMP] {
            match std::fs::remove_file(dir.join(file)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(format!(
                        "{PREFIX}failed to delete volume data file [{file}]: {e}"
                    ));
                }
            }
        }
        std::fs::remove_dir(dir).or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(format!("{PREFIX}failed to remove {dir:?}: {e}"))
            }
        })
    }
}

/// Whether the path a pod's CSI volume was given is still published: a filesystem's
/// target is a mount point; a block volume's link names a publish target that is.
pub fn published(path: &Path) -> bool {
    if block::is_pod_link(path) {
        block::link_published(path)
    } else {
        crate::subpath::is_mount_point(path)
    }
}

/// What a driver's node service offers that changes a publish.
#[derive(Debug, Clone, Copy, Default)]
struct NodeCapabilities {
    single_node_multi_writer: bool,
    volume_mount_group: bool,
    stage_unstage: bool,
    /// GET_VOLUME_STATS: `NodeGetVolumeStats` answers (`stats`).
    volume_stats: bool,
    /// EXPAND_VOLUME: `NodeExpandVolume` answers (`expand`).
    expand_volume: bool,
}

/// Upstream's `asCSIAccessModeV1` of the volume's first access mode (`ReadWriteOnce`
/// when it has none).
fn access_mode(
    access_modes: &[String],
    capabilities: NodeCapabilities,
) -> volume_capability::access_mode::Mode {
    use volume_capability::access_mode::Mode;
    match access_modes.first().map(String::as_str) {
        None | Some("ReadWriteOnce") if capabilities.single_node_multi_writer => {
            Mode::SingleNodeMultiWriter
        }
        None | Some("ReadWriteOnce") => Mode::SingleNodeWriter,
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        Some("ReadWriteOncePod") if capabilities.single_node_multi_writer => {
            Mode::SingleNodeSingleWriter
        }
        Some("ReadWriteOncePod") => Mode::SingleNodeWriter,
        Some(_) => Mode::Unknown,
    }
}

/// A mounted volume's capability.
fn capability(
    fs_type: &str,
    mount_flags: Vec<String>,
    mode: volume_capability::access_mode::Mode,
    volume_mount_group: String,
) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: fs_type.to_string(),
                mount_flags,
                volume_mount_group,
            },
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// The pod attributes a driver with `podInfoOnMount` gets (upstream's `podAttributes`).
fn pod_info(pod: &Pod, ephemeral: bool) -> Vec<(String, String)> {
    let service_account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    vec![
        (
            "csi.storage.k8s.io/pod.name".into(),
            nodeagent_proto::k8s::pod_name(pod).to_string(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace".into(),
            nodeagent_proto::k8s::pod_namespace(pod).to_string(),
        ),
        (
            "csi.storage.k8s.io/pod.uid".into(),
            nodeagent_proto::k8s::pod_uid(pod).to_string(),
        ),
        (
            "csi.storage.k8s.io/serviceAccount.name".into(),
            service_account,
        ),
        ("csi.storage.k8s.io/ephemeral".into(), ephemeral.to_string()),
    ]
}

fn secret_data(secret: &Secret) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (k, v) in secret.data.iter().flatten() {
        out.insert(k.clone(), String::from_utf8_lossy(&v.0).into_owned());
    }
    for (k, v) in secret.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// upstream's `removeMountDir` after a final publish error: the target (if nothing is
/// mounted on it), `vol_data.json`, the volume's directory. Best effort.
fn remove_volume_dir(dir: &Path) {
    let target = dir.join(MOUNT_DIR);
    if crate::subpath::is_mount_point(&target) {
        return;
    }
    let _ = std::fs::remove_dir(&target);
    let _ = std::fs::remove_file(dir.join(VOL_DATA));
    let _ = std::fs::remove_file(dir.join(VOL_DATA_TMP));
    let _ = std::fs::remove_dir(dir);
}

/// Writes a record as upstream's `saveVolumeData` does: a JSON map of strings (keys
/// sorted, as Go encodes a `map[string]string`) and a newline, through a temporary file.
fn write_record(dir: &Path, record: &impl Serialize) -> std::io::Result<()> {
    let map: BTreeMap<String, String> =
        serde_json::from_value(serde_json::to_value(record).expect("plain strings"))
            .expect("plain strings");
    let mut bytes = serde_json::to_vec(&map).expect("plain strings");
    bytes.push(b'\n');
    let tmp = dir.join(VOL_DATA_TMP);
    std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, dir.join(VOL_DATA)))
}

/// The record in `dir`'s `vol_data.json`.
fn read_record<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T, String> {
    let path = dir.join(VOL_DATA);
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("cannot parse {path:?}: {e}"))
}

fn write_vol_data(dir: &Path, data: &VolData) -> Result<(), String> {
    write_record(dir, data)
        .map_err(|e| format!("{PREFIX}mounter.SetUpAt failed to save volume info data: {e}"))
}

fn read_vol_data(dir: &Path) -> Result<VolData, String> {
    read_record(dir)
}

/// Upstream's `supportsFSGroup`: never read-only or under `None`; always under `File`;
/// under the default `ReadWriteOnceWithFSType` only with an fsType and a volume that is
/// `ReadWriteOnce` (an inline one is).
fn applies_fs_group(policy: &str, fs_type: &str, read_only: bool, access_modes: &[String]) -> bool {
    if read_only {
        return false;
    }
    match policy {
        "None" => false,
        "File" => true,
        _ => !fs_type.is_empty() && access_modes.iter().any(|m| m == "ReadWriteOnce"),
    }
}

/// Whether the volume's root already has the ownership `apply_fs_group` gives it.
fn owned_by_group(root: &Path, group: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(root).is_ok_and(|m| m.gid() == group && m.mode() & 0o2000 != 0)
}

/// Upstream's `SetVolumeOwnership` (on the blocking pool): with `fsGroupChangePolicy:
/// OnRootMismatch` nothing is done when the root is owned already; otherwise every file
/// of the volume gets the group, read and write for owner and group (read only, when the
/// volume is), directories also search and setgid. Links are never followed, and the
/// walk stays on the volume's filesystem.
async fn apply_fs_group(root: &Path, group: u32, read_only: bool, pod: &Pod) -> Result<(), String> {
    let on_root_mismatch = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.fs_group_change_policy.as_deref())
        == Some("OnRootMismatch");
    if on_root_mismatch && owned_by_group(root, group) {
        return Ok(());
    }
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || give_tree_to_group(&root, group, read_only))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

fn give_tree_to_group(root: &Path, group: u32, read_only: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let root_dev = std::fs::symlink_metadata(root)?.dev();
    let file_mask = if read_only { 0o440 } else { 0o660 };
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() || meta.dev() != root_dev {
            continue;
        }
        std::os::unix::fs::lchown(&path, None, Some(group))?;
        let mut mode = (meta.mode() & 0o7777) | file_mask;
        if meta.is_dir() {
            mode |= 0o110 | 0o2000;
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inline_volume_handle_is_upstreams() {
        // Upstream: sha256 of the pod UID and the volume name, hex, prefixed with "csi-".
        let h = volume_handle("uid-1", "data");
        assert!(h.starts_with("csi-"));
        assert_eq!(h.len(), 4 + 64);
        assert_eq!(h, volume_handle("uid-1", "data"));
        assert_ne!(h, volume_handle("uid-1", "data2"));
        assert_ne!(h, volume_handle("uid-2", "data"));
    }

    fn pod_with_csi_volume_dir(root: &Path, record: Option<&VolData>) -> PathBuf {
        let dir = root
            .join("pods/uid-1/volumes")
            .join(CSI_PLUGIN_DIR)
            .join("data");
        std::fs::create_dir_all(dir.join(MOUNT_DIR)).unwrap();
        if let Some(record) = record {
            write_vol_data(&dir, record).unwrap();
        }
        dir
    }

    /// Upstream's `TestUnmounterTeardownNoClientError`: a volume whose driver is not
    /// registered is not torn down, and the error names the driver; its record stays.
    #[tokio::test]
    async fn a_volume_of_an_unregistered_driver_stays_until_its_driver_is_back() {
        let root = tempfile::tempdir().unwrap();
        let csi = Csi::new(root.path(), None, "node-1".into());
        let record = VolData {
            attachment_id: attachment_name("csi-x", "gone.example.com", "node-1"),
            spec_vol_id: "data".into(),
            volume_handle: "csi-x".into(),
            driver_name: "gone.example.com".into(),
            node_name: "node-1".into(),
            volume_lifecycle_mode: "Ephemeral".into(),
        };
        let dir = pod_with_csi_volume_dir(root.path(), Some(&record));
        let err = csi.tear_down_pod("uid-1").await.unwrap_err();
        assert_eq!(
            err,
            "UnmountVolume.TearDown failed for volume \"data\" (pod uid-1): kubernetes.io/csi: Unmounter.TearDownAt failed to get CSI client: driver name gone.example.com not found in the list of registered CSI drivers"
        );
        assert_eq!(read_vol_data(&dir).unwrap(), record);
        assert!(dir.join(MOUNT_DIR).is_dir());
    }

    /// A volume directory with no record and nothing mounted (a set-up interrupted before
    /// `vol_data.json`) is simply removed.
    #[tokio::test]
    async fn an_unrecorded_unmounted_volume_is_removed() {
        let root = tempfile::tempdir().unwrap();
        let csi = Csi::new(root.path(), None, "node-1".into());
        let dir = pod_with_csi_volume_dir(root.path(), None);
        csi.tear_down_pod("uid-1").await.unwrap();
        assert!(!dir.exists());
        assert!(!dir.parent().unwrap().exists());
    }

    /// `vol_data.json` as upstream's `json.Encoder` writes a map: sorted keys, one line.
    #[test]
    fn vol_data_is_written_with_upstreams_keys_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let record = VolData {
            attachment_id: "csi-a".into(),
            spec_vol_id: "data".into(),
            volume_handle: "csi-h".into(),
            driver_name: "d".into(),
            node_name: "n".into(),
            volume_lifecycle_mode: "Ephemeral".into(),
        };
        write_vol_data(dir.path(), &record).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(VOL_DATA)).unwrap(),
            "{\"attachmentID\":\"csi-a\",\"driverName\":\"d\",\"nodeName\":\"n\",\"specVolID\":\"data\",\"volumeHandle\":\"csi-h\",\"volumeLifecycleMode\":\"Ephemeral\"}\n"
        );
    }

    #[test]
    fn grpc_errors_read_as_grpc_go_prints_them() {
        assert_eq!(
            go_rpc_error(&tonic::Status::internal("disk full")),
            "rpc error: code = Internal desc = disk full"
        );
        assert_eq!(
            go_rpc_error(&tonic::Status::cancelled("x")),
            "rpc error: code = Canceled desc = x"
        );
        assert_eq!(go_quoted(&["Persistent".into()]), "[\"Persistent\"]");
        assert_eq!(go_quoted(&["a".into(), "b".into()]), "[\"a\" \"b\"]");
        assert_eq!(go_quoted(&[]), "[]");
    }

    #[test]
    fn fs_group_follows_the_drivers_policy() {
        let rwo = ["ReadWriteOnce".to_string()];
        let rwx = ["ReadWriteMany".to_string()];
        assert!(!applies_fs_group(
            "ReadWriteOnceWithFSType",
            "",
            false,
            &rwo
        ));
        assert!(applies_fs_group(
            "ReadWriteOnceWithFSType",
            "ext4",
            false,
            &rwo
        ));
        // Upstream's TestMounterSetUpWithFSGroup: ReadWriteMany with an fsType, no.
        assert!(!applies_fs_group(
            "ReadWriteOnceWithFSType",
            "ext4",
            false,
            &rwx
        ));
        assert!(applies_fs_group("File", "", false, &rwx));
        assert!(!applies_fs_group("None", "ext4", false, &rwo));
        assert!(!applies_fs_group("File", "", true, &rwo));
    }

    /// Upstream's `asCSIAccessModeV1`.
    #[test]
    fn access_modes_map_as_upstreams() {
        use volume_capability::access_mode::Mode;
        let plain = NodeCapabilities::default();
        let multi = NodeCapabilities {
            single_node_multi_writer: true,
            ..plain
        };
        let m = |s: &str| vec![s.to_string()];
        assert_eq!(
            access_mode(&m("ReadWriteOnce"), plain),
            Mode::SingleNodeWriter
        );
        assert_eq!(
            access_mode(&m("ReadWriteOnce"), multi),
            Mode::SingleNodeMultiWriter
        );
        assert_eq!(
            access_mode(&m("ReadOnlyMany"), plain),
            Mode::MultiNodeReaderOnly
        );
        assert_eq!(
            access_mode(&m("ReadWriteMany"), plain),
            Mode::MultiNodeMultiWriter
        );
        assert_eq!(
            access_mode(&m("ReadWriteOncePod"), multi),
            Mode::SingleNodeSingleWriter
        );
        assert_eq!(
            access_mode(&m("ReadWriteOncePod"), plain),
            Mode::SingleNodeWriter
        );
        assert_eq!(access_mode(&[], plain), Mode::SingleNodeWriter);
    }
}
