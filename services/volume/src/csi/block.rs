//! CSI raw block volumes (issue 32): a claim whose PersistentVolume has `volumeMode: Block`,
//! used by a container's `volumeDevices`. Upstream's `csiBlockMapper`
//! (`pkg/volume/csi/csi_block.go`) and the operation generator's `MapVolume`, `UnmapVolume`
//! and `UnmapDevice`, with upstream's paths under `<root>/plugins/kubernetes.io/csi/volumeDevices`:
//!
//! - `<pv>/data/vol_data.json`: the volume's record (driver, handle), written before the
//!   stage, so that whatever a crash interrupts, the teardown knows whom to ask;
//! - `staging/<pv>`: the staging path (`NodeStageVolume`, when the driver stages);
//! - `publish/<pv>/<pod uid>`: the publish target, a file the driver makes and puts the
//!   device on (`NodePublishVolume`);
//! - `<pv>/dev/<pod uid>`: the publish target bind-mounted on a file, one per pod using
//!   the volume (upstream's global map path: what says the device is in use);
//!
//! and per pod `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`, a symlink to the publish
//! target: the device path the container runtime is given (upstream's pod device map
//! path, which `makeBlockVolumes` hands to CRI).
//!
//! Two differences from upstream, both for restart safety: the pod's symlink is made before
//! `NodePublishVolume` (upstream: after it) and removed last, so it is the pod's record of
//! the publication, as `vol_data.json` is for a filesystem; and upstream's loop device on
//! the global map file (a "descriptor lock" that keeps the device open) is not taken.

use super::persistent::{ClaimError, ClaimedVolume, STAGING_DIR};
use super::{Csi, PREFIX, call, go_rpc_error, read_record, uncertain, write_record};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, Pod};
use nodeagent_proto::csi::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability, volume_capability,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Beside the drivers' directories (not a driver name: upstream's `volumeDevices`).
pub const VOLUME_DEVICES: &str = "volumeDevices";
const STAGING: &str = "staging";
const PUBLISH: &str = "publish";
const DATA: &str = "data";
const DEV: &str = "dev";

/// `vol_data.json` of a block volume, with upstream's keys (no lifecycle mode: a block
/// volume is always persistent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BlockData {
    #[serde(rename = "attachmentID")]
    attachment_id: String,
    #[serde(rename = "specVolID")]
    spec_vol_id: String,
    #[serde(rename = "volumeHandle")]
    volume_handle: String,
    #[serde(rename = "driverName")]
    driver_name: String,
    #[serde(rename = "nodeName")]
    node_name: String,
}

/// Upstream's paths of the block volume of the PersistentVolume `pv`.
#[derive(Debug, Clone)]
pub(super) struct BlockPaths {
    base: PathBuf,
    pv: String,
}

impl BlockPaths {
    /// The paths of `pv` under `root`; an error for a name that is not one path component.
    pub(super) fn new(root: &Path, pv: &str) -> Result<Self, String> {
        nodeagent_hostpath::component(pv).map_err(|e| format!("volume name {pv:?}: {e}"))?;
        // Upstream's layout puts these beside the volumes' own directories: a volume of
        // that name would share its directories with every other one.
        if pv == STAGING || pv == PUBLISH {
            return Err(format!(
                "volume name {pv:?} collides with the block volumes' {pv:?} directory"
            ));
        }
        Ok(Self {
            base: root.join(STAGING_DIR).join(VOLUME_DEVICES),
            pv: pv.to_string(),
        })
    }

    /// `volumeDevices/<pv>`: the record and the global map path live here (and the lock
    /// of every step on the volume is keyed by it).
    pub(super) fn volume_dir(&self) -> PathBuf {
        self.base.join(&self.pv)
    }

    fn data_dir(&self) -> PathBuf {
        self.volume_dir().join(DATA)
    }

    /// Upstream's `GetGlobalMapPath`.
    fn dev_dir(&self) -> PathBuf {
        self.volume_dir().join(DEV)
    }

    fn dev(&self, uid: &str) -> PathBuf {
        self.dev_dir().join(uid)
    }

    /// Upstream's `GetStagingPath`.
    pub(super) fn staging(&self) -> PathBuf {
        self.base.join(STAGING).join(&self.pv)
    }

    fn publish_dir(&self) -> PathBuf {
        self.base.join(PUBLISH).join(&self.pv)
    }

    /// Upstream's `getPublishPath`.
    pub(super) fn publish(&self, uid: &str) -> PathBuf {
        self.publish_dir().join(uid)
    }
}

/// The directory of a pod's block volume links: `pods/<uid>/volumeDevices/kubernetes.io~csi`.
fn pod_links_dir(root: &Path, uid: &str) -> Result<PathBuf, String> {
    let uid = nodeagent_hostpath::uid(uid).map_err(|e| e.to_string())?;
    Ok(root
        .join("pods")
        .join(uid)
        .join(VOLUME_DEVICES)
        .join(super::CSI_PLUGIN_DIR))
}

/// Upstream's pod device map path of `pv` for the pod `uid`: what the container runtime
/// gets as the device's host path.
pub fn pod_link(root: &Path, uid: &str, pv: &str) -> Result<PathBuf, String> {
    nodeagent_hostpath::component(pv).map_err(|e| format!("volume name {pv:?}: {e}"))?;
    Ok(pod_links_dir(root, uid)?.join(pv))
}

/// Whether `path` is a pod's block volume link (`pods/<uid>/volumeDevices/<plugin>/<pv>`).
pub fn is_pod_link(path: &Path) -> bool {
    let mut up = path.ancestors().skip(2);
    up.next()
        .and_then(Path::file_name)
        .is_some_and(|n| n == VOLUME_DEVICES)
        && up
            .nth(1)
            .and_then(Path::file_name)
            .is_some_and(|n| n == "pods")
}

/// Whether a pod's block volume link still leads to a published device: the driver's
/// publish target it names is a block device (a device bind-mounted on the file, or a
/// device node the driver made there: the spec allows both).
pub fn link_published(link: &Path) -> bool {
    is_device(link)
}

/// Whether `path` is (or leads to) a block device.
fn is_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// Whether a publish target still holds something of the driver's: a mount, or a device.
fn published_target(publish: &Path) -> bool {
    crate::subpath::is_mount_point(publish) || is_device(publish)
}

/// A block volume's capability (upstream sends fsType `block`, which becomes this).
fn block_capability(mode: volume_capability::access_mode::Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// What a claimed block volume's map needs, resolved by `persistent`.
pub(super) struct BlockClaim<'a> {
    pub pod: &'a Pod,
    pub pv_name: &'a str,
    pub source: &'a CSIPersistentVolumeSource,
    pub read_only: bool,
    pub access_modes: Vec<String>,
    pub plugin: String,
}

fn not_found_is_ok(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn make_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
}

impl Csi {
    /// Upstream's `MapVolume` of a claimed block volume for the pod: `SetUpDevice`
    /// (`NodeStageVolume`), `MapPodDevice` (`NodePublishVolume`), `MapBlockVolume` (the
    /// global map file bind-mounted). Idempotent: a volume mapped for the pod already is
    /// left as it is. Its path is the pod's link, which the runtime resolves to the device.
    pub(super) async fn map_claimed(&self, c: BlockClaim<'_>) -> Result<ClaimedVolume, ClaimError> {
        let uid = nodeagent_proto::k8s::pod_uid(c.pod);
        let pv = c.pv_name;
        let step = |step: &str, e: String| ClaimError::Mount {
            plugin: c.plugin.clone(),
            message: format!("MapVolume.{step} failed for volume {pv:?} : {e}"),
        };
        let paths = BlockPaths::new(&self.root, pv).map_err(|e| step("GetGlobalMapPath", e))?;
        let link = pod_link(&self.root, uid, pv).map_err(|e| step("GetGlobalMapPath", e))?;
        if link_published(&link) && crate::subpath::is_mount_point(&paths.dev(uid)) {
            return Ok((c.plugin.clone(), link));
        }
        let driver_name = &c.source.driver;
        let handle = &c.source.volume_handle;
        let policy = self.policy(driver_name).await.map_err(|e| {
            step(
                "NewBlockVolumeMapper initialization",
                format!("{PREFIX}failed to check volume lifecycle mode: {e}"),
            )
        })?;
        policy.supports(driver_name, "Persistent").map_err(|e| {
            step(
                "NewBlockVolumeMapper initialization",
                format!("{PREFIX}{e}"),
            )
        })?;
        let publish_context = if policy.attach_required {
            self.verify_controller_attached(c.pod, pv, driver_name, handle)
                .await
                .map_err(ClaimError::NotVerifiedAttached)?;
            self.wait_for_attach(handle, driver_name)
                .await
                .map_err(|e| step("WaitForAttach", e))?
        } else {
            HashMap::new()
        };
        let driver = self.registry.driver(driver_name).map_err(|e| {
            step(
                "SetUpDevice",
                format!("{PREFIX}blockMapper.SetUpDevice failed to get CSI client: {e}"),
            )
        })?;
        let capabilities = self.try_capabilities(&driver).await.map_err(|status| {
            step(
                "SetUpDevice",
                format!(
                    "{PREFIX}blockMapper.stageVolumeForBlock failed to check STAGE_UNSTAGE_VOLUME capability: {}",
                    go_rpc_error(&status)
                ),
            )
        })?;
        let mode = super::access_mode(&c.access_modes, capabilities);
        let context: HashMap<String, String> = c
            .source
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        // One map, unmap or unstage of the volume at a time: `unstage_unused_block` must
        // not find the volume unused between its record and the pod's link.
        let lock = self.stage_lock(&paths.volume_dir());
        let _volume = lock.lock().await;
        let record = BlockData {
            attachment_id: super::attachment_name(handle, driver_name, &self.node_name),
            spec_vol_id: pv.to_string(),
            volume_handle: handle.clone(),
            driver_name: driver_name.clone(),
            node_name: self.node_name.clone(),
        };
        make_dir(&paths.data_dir())
            .and_then(|()| write_record(&paths.data_dir(), &record))
            .map_err(|e| {
                step(
                    "SetUpDevice",
                    format!("{PREFIX}failed to save volume info data: {e}"),
                )
            })?;
        let staging = capabilities.stage_unstage.then(|| paths.staging());
        if let Some(staging) = &staging {
            let secrets = self
                .secret_ref(
                    "NodeStageSecretRef",
                    c.source.node_stage_secret_ref.as_ref(),
                )
                .await
                .map_err(|e| step("SetUpDevice", e))?;
            make_dir(staging).map_err(|e| {
                step(
                    "SetUpDevice",
                    format!(
                        "{PREFIX}blockMapper.stageVolumeForBlock failed to create dir {}: {e}",
                        staging.display()
                    ),
                )
            })?;
            // Asked again for every pod: NodeStageVolume is idempotent by the spec, and a
            // block volume's staging path shows nothing the node could check.
            let request = NodeStageVolumeRequest {
                volume_id: handle.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                volume_capability: Some(block_capability(mode)),
                secrets,
                volume_context: context.clone(),
            };
            call(driver.node_client().node_stage_volume(request))
                .await
                .map_err(|status| {
                    step(
                        "SetUpDevice",
                        format!(
                            "{PREFIX}blockMapper.stageVolumeForBlock failed: {}",
                            go_rpc_error(&status)
                        ),
                    )
                })?;
        }
        // No pod attributes: upstream's `publishVolumeForBlock` sends the volume's own.
        let secrets = self
            .secret_ref(
                "NodePublishSecretRef",
                c.source.node_publish_secret_ref.as_ref(),
            )
            .await
            .map_err(|e| step("MapPodDevice", e))?;
        let publish = paths.publish(uid);
        make_dir(&paths.publish_dir()).map_err(|e| {
            step(
                "MapPodDevice",
                format!(
                    "{PREFIX}blockMapper.publishVolumeForBlock failed to create dir {}:  {e}",
                    paths.publish_dir().display()
                ),
            )
        })?;
        // The pod's record, before the publish.
        link_to(&link, &publish).map_err(|e| step("MapPodDevice", e))?;
        let request = NodePublishVolumeRequest {
            volume_id: handle.clone(),
            publish_context,
            staging_target_path: staging
                .as_ref()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            target_path: publish.to_string_lossy().into_owned(),
            volume_capability: Some(block_capability(mode)),
            readonly: c.read_only,
            secrets,
            volume_context: context,
        };
        if let Err(status) = call(driver.node_client().node_publish_volume(request)).await {
            // A final error published nothing new: the pod's record goes, unless something
            // of an earlier publish is still there (a retry after a crash): then the
            // teardown unpublishes it. An uncertain error keeps the record too.
            if !uncertain(&status) && !published_target(&publish) && !paths.dev(uid).exists() {
                let _ = not_found_is_ok(std::fs::remove_file(&publish));
                let _ = std::fs::remove_file(&link);
            }
            return Err(step(
                "MapPodDevice",
                format!(
                    "{PREFIX}blockMapper.publishVolumeForBlock failed: {}",
                    go_rpc_error(&status)
                ),
            ));
        }
        bind_global_map(&publish, &paths.dev(uid)).map_err(|e| {
            step(
                "MapBlockVolume",
                format!(
                    "blkUtil.MapDevice failed. devicePath: {}, globalMapPath:{}, podUID: {uid}, bindMount: true: {e}",
                    publish.display(),
                    paths.dev_dir().display()
                ),
            )
        })?;
        tracing::info!(volume = %pv, driver = %driver_name, link = %link.display(), "CSI block volume mapped");
        Ok((c.plugin.clone(), link))
    }

    /// Upstream's `UnmapVolume` of every block volume of the pod `uid` (the global map
    /// file, `NodeUnpublishVolume`, the link last). A volume whose driver is not
    /// registered or whose unpublish fails stays, and the error says why.
    pub(super) async fn unmap_pod(&self, uid: &str) -> Result<(), String> {
        let dir = pod_links_dir(&self.root, uid)?;
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        let mut errors = Vec::new();
        for entry in entries.flatten() {
            let pv = entry.file_name().to_string_lossy().into_owned();
            if let Err(e) = self.unmap(uid, &pv).await {
                errors.push(format!(
                    "UnmapVolume.UnmapPodDevice failed for volume {pv:?} (pod {uid}): {e}"
                ));
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        let _ = std::fs::remove_dir(&dir);
        if let Some(parent) = dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    }

    async fn unmap(&self, uid: &str, pv: &str) -> Result<(), String> {
        let paths = BlockPaths::new(&self.root, pv)?;
        let link = pod_link(&self.root, uid, pv)?;
        let lock = self.stage_lock(&paths.volume_dir());
        let _volume = lock.lock().await;
        let dev = paths.dev(uid);
        if crate::subpath::is_mount_point(&dev) {
            nix::mount::umount2(&dev, nix::mount::MntFlags::MNT_DETACH)
                .map_err(|e| format!("failed to unmount {dev:?}: {e}"))?;
        }
        not_found_is_ok(std::fs::remove_file(&dev))
            .map_err(|e| format!("failed to remove {dev:?}: {e}"))?;
        let publish = paths.publish(uid);
        match read_record::<BlockData>(&paths.data_dir()) {
            Ok(record) => {
                let driver = self.registry.driver(&record.driver_name).map_err(|e| {
                    format!("{PREFIX}blockMapper.UnmapPodDevice failed to get CSI client: {e}")
                })?;
                let request = NodeUnpublishVolumeRequest {
                    volume_id: record.volume_handle,
                    target_path: publish.to_string_lossy().into_owned(),
                };
                call(driver.node_client().node_unpublish_volume(request))
                    .await
                    .map_err(|status| {
                        format!(
                            "{PREFIX}blockMapper.unpublishVolumeForBlock failed: {}",
                            go_rpc_error(&status)
                        )
                    })?;
            }
            // No record: only a target that holds nothing of a driver's can be forgotten.
            Err(e) if published_target(&publish) => {
                return Err(format!("{publish:?} is published and {e}"));
            }
            Err(_) => {}
        }
        if published_target(&publish) {
            return Err(format!("the driver left {publish:?} published"));
        }
        not_found_is_ok(std::fs::remove_file(&publish))
            .and_then(|()| not_found_is_ok(std::fs::remove_file(&link)))
            .map_err(|e| format!("failed to clean up {pv:?} of pod {uid}: {e}"))
    }

    /// Upstream's `UnmapDevice` of every block volume no pod links to any more:
    /// `NodeUnstageVolume` (when the driver stages), then its directories. A volume whose
    /// driver is not registered, or whose unstage fails, stays and is named in the errors.
    pub(super) async fn unstage_unused_block(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let base = self.root.join(STAGING_DIR).join(VOLUME_DEVICES);
        for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let pv = entry.file_name().to_string_lossy().into_owned();
            if pv == STAGING || pv == PUBLISH {
                continue;
            }
            let Ok(paths) = BlockPaths::new(&self.root, &pv) else {
                continue;
            };
            let lock = self.stage_lock(&paths.volume_dir());
            let _volume = lock.lock().await;
            match self.linked(&paths) {
                Ok(false) => {}
                Ok(true) => continue,
                Err(e) => {
                    errors.push(format!("block volume {pv:?} kept: {e}"));
                    continue;
                }
            }
            match self.tear_down_device(&paths).await {
                Ok(()) => {
                    tracing::info!(volume = %pv, "CSI block volume unstaged: no pod uses it");
                    let mut locks = self.stage_locks.lock().unwrap();
                    if std::sync::Arc::strong_count(&lock) == 2 {
                        locks.remove(&paths.volume_dir());
                    }
                }
                Err(e) => errors.push(format!(
                    "UnmapDevice.TearDownDevice failed for volume {pv:?}: {e}"
                )),
            }
        }
        for dir in [STAGING, PUBLISH] {
            let _ = std::fs::remove_dir(base.join(dir));
        }
        let _ = std::fs::remove_dir(&base);
        errors
    }

    /// Whether some pod still links to the volume, a global map file is left (upstream's
    /// `GetDeviceBindMountRefs`), or a publish target still holds something of the
    /// driver's. What cannot be read counts as in use.
    fn linked(&self, paths: &BlockPaths) -> Result<bool, String> {
        if !read_dir(&paths.dev_dir())?.is_empty() {
            return Ok(true);
        }
        if read_dir(&paths.publish_dir())?
            .iter()
            .any(|p| published_target(p))
        {
            return Ok(true);
        }
        for pod in read_dir(&self.root.join("pods"))? {
            let link = pod
                .join(VOLUME_DEVICES)
                .join(super::CSI_PLUGIN_DIR)
                .join(&paths.pv);
            if link.symlink_metadata().is_ok() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn tear_down_device(&self, paths: &BlockPaths) -> Result<(), String> {
        let staging = paths.staging();
        // No record: the stage was never asked for (the record comes first).
        if let Ok(record) = read_record::<BlockData>(&paths.data_dir()) {
            let driver = self.registry.driver(&record.driver_name).map_err(|e| {
                format!("{PREFIX}blockMapper.TearDownDevice failed to get CSI client: {e}")
            })?;
            let capabilities = self.try_capabilities(&driver).await.map_err(|status| {
                    format!(
                        "{PREFIX}blockMapper.unstageVolumeForBlock failed to check STAGE_UNSTAGE_VOLUME capability: {}",
                        go_rpc_error(&status)
                    )
                })?;
            if capabilities.stage_unstage {
                let request = NodeUnstageVolumeRequest {
                    volume_id: record.volume_handle,
                    staging_target_path: staging.to_string_lossy().into_owned(),
                };
                call(driver.node_client().node_unstage_volume(request))
                    .await
                    .map_err(|status| {
                        format!(
                            "{PREFIX}blockMapper.unstageVolumeForBlock failed: {}",
                            go_rpc_error(&status)
                        )
                    })?;
            }
        }
        let mounted = crate::subpath::mounts_under(&staging)
            .map_err(|e| format!("cannot read mounts: {e}"))?;
        if !mounted.is_empty() {
            return Err(format!("the driver left {mounted:?} mounted"));
        }
        // What a failed publish left (no pod links to it, and nothing is published there:
        // `linked` said so), as upstream's `cleanupOrphanDeviceFiles`.
        for leftover in read_dir(&paths.publish_dir())? {
            let _ = std::fs::remove_file(leftover);
        }
        let removed = not_found_is_ok(std::fs::remove_dir_all(&staging))
            .and_then(|()| not_found_is_ok(std::fs::remove_dir(paths.publish_dir())))
            .and_then(|()| not_found_is_ok(std::fs::remove_dir(paths.dev_dir())))
            .and_then(|()| not_found_is_ok(std::fs::remove_dir_all(paths.data_dir())))
            .and_then(|()| not_found_is_ok(std::fs::remove_dir(paths.volume_dir())));
        removed.map_err(|e| format!("failed to clean up {:?}: {e}", paths.volume_dir()))
    }

    /// The block volumes (driver, handle) whose record is on disk: staged, or being used.
    pub(super) fn block_devices(&self) -> Vec<(String, String)> {
        let base = self.root.join(STAGING_DIR).join(VOLUME_DEVICES);
        std::fs::read_dir(&base)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| read_record::<BlockData>(&e.path().join(DATA)).ok())
            .map(|r| (r.driver_name, r.volume_handle))
            .collect()
    }
}

/// The entries of `dir` (none when it does not exist).
fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries.flatten().map(|e| e.path()).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("cannot read {dir:?}: {e}")),
    }
}

/// The pod's link to the publish target (an old one replaced: upstream's
/// `mapSymlinkDevice`, "stale across node reboot").
fn link_to(link: &Path, target: &Path) -> Result<(), String> {
    if let Some(dir) = link.parent() {
        make_dir(dir).map_err(|e| format!("failed to create dir {dir:?}: {e}"))?;
    }
    if std::fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    not_found_is_ok(std::fs::remove_file(link))
        .and_then(|()| std::os::unix::fs::symlink(target, link))
        .map_err(|e| format!("failed to link {link:?} to {target:?}: {e}"))
}

/// Bind-mounts the published device at `dev` (an empty file made for it), unless it is
/// mounted there already (upstream's `mapBindMountDevice`).
fn bind_global_map(device: &Path, dev: &Path) -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    use std::os::unix::fs::FileTypeExt;
    if crate::subpath::is_mount_point(dev) {
        return Ok(());
    }
    let kind = std::fs::metadata(device)
        .map_err(|e| format!("cannot stat {device:?}: {e}"))?
        .file_type();
    if !kind.is_block_device() {
        return Err(format!("{device:?} is not a block device"));
    }
    if let Some(dir) = dev.parent() {
        make_dir(dir).map_err(|e| format!("failed to create dir {dir:?}: {e}"))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dev)
        .map_err(|e| format!("cannot create {dev:?}: {e}"))?;
    mount(
        Some(device),
        dev,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        format!(
            "failed to bind mount devicePath: {} to linkPath {}: {e}",
            device.display(),
            dev.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// csi_block.go's layout, for a PV `pv-1` and a pod `uid-1` under `/var/lib/kubelet`.
    #[test]
    fn the_paths_are_upstreams() {
        let root = Path::new("/var/lib/kubelet");
        let p = BlockPaths::new(root, "pv-1").unwrap();
        let base = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices";
        assert_eq!(p.staging(), Path::new(&format!("{base}/staging/pv-1")));
        assert_eq!(
            p.publish("uid-1"),
            Path::new(&format!("{base}/publish/pv-1/uid-1"))
        );
        assert_eq!(p.dev("uid-1"), Path::new(&format!("{base}/pv-1/dev/uid-1")));
        assert_eq!(p.data_dir(), Path::new(&format!("{base}/pv-1/data")));
        let link = pod_link(root, "uid-1", "pv-1").unwrap();
        assert_eq!(
            link,
            Path::new("/var/lib/kubelet/pods/uid-1/volumeDevices/kubernetes.io~csi/pv-1")
        );
        assert!(is_pod_link(&link));
        assert!(!is_pod_link(Path::new(
            "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"
        )));
        assert!(BlockPaths::new(root, "../x").is_err());
        assert!(BlockPaths::new(root, "..").is_err());
        assert!(BlockPaths::new(root, "staging").is_err());
        assert!(BlockPaths::new(root, "publish").is_err());
        assert!(pod_link(root, "uid-1", "a/b").is_err());
    }

    /// The record has upstream's five keys (csi_block.go's `saveVolumeData` for a block
    /// volume: no `volumeLifecycleMode`).
    #[test]
    fn the_record_has_upstreams_keys() {
        let dir = tempfile::tempdir().unwrap();
        let record = BlockData {
            attachment_id: "csi-1".into(),
            spec_vol_id: "pv-1".into(),
            volume_handle: "h".into(),
            driver_name: "d".into(),
            node_name: "n".into(),
        };
        write_record(dir.path(), &record).unwrap();
        let text = std::fs::read_to_string(dir.path().join("vol_data.json")).unwrap();
        assert_eq!(
            text,
            "{\"attachmentID\":\"csi-1\",\"driverName\":\"d\",\"nodeName\":\"n\",\"specVolID\":\"pv-1\",\"volumeHandle\":\"h\"}\n"
        );
    }

    /// A volume no pod links to and with no global map file is unused; a pod's link or a
    /// map file left keeps it.
    #[tokio::test]
    async fn only_a_volume_no_pod_links_to_is_unused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let csi = Csi::new(root, None, "node".into());
        let paths = BlockPaths::new(root, "pv-1").unwrap();
        std::fs::create_dir_all(paths.dev_dir()).unwrap();
        assert_eq!(csi.linked(&paths), Ok(false));
        let link = pod_link(root, "uid-1", "pv-1").unwrap();
        link_to(&link, &paths.publish("uid-1")).unwrap();
        assert_eq!(csi.linked(&paths), Ok(true), "a dangling link still counts");
        std::fs::remove_file(&link).unwrap();
        std::fs::write(paths.dev("uid-2"), b"").unwrap();
        assert_eq!(csi.linked(&paths), Ok(true));
        std::fs::remove_file(paths.dev("uid-2")).unwrap();
        // A file a failed publish left is not a use; a device there would be.
        std::fs::create_dir_all(paths.publish_dir()).unwrap();
        std::fs::write(paths.publish("uid-3"), b"").unwrap();
        assert_eq!(csi.linked(&paths), Ok(false));
    }
}
