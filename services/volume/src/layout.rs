//! Where pod volumes live on disk and how each kind is set up and torn down.

use crate::atomic_writer;
use crate::payload::{self, ApiObjects};
use crate::subpath::{self, SubPath, SubPathError};
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod};
use nodeagent_hostpath::{HostPath, PathError};
use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
/// The directory of CSI volumes below a pod's `volumes` (upstream's escaped plugin name).
pub const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";
/// Where a CSI volume is published inside its volume's directory (`csi` owns it).
pub const MOUNT_DIR: &str = "mount";
/// Where subPath bind mounts live, under the pod's directory.
const SUBPATHS: &str = "volume-subpaths";

/// Why a volume could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The pod uses a volume kind this node agent cannot provide yet.
    #[error("volume {name:?}: {kind} volumes are not supported by this node agent yet")]
    Unsupported { name: String, kind: &'static str },
    /// The pod's spec is unusable.
    #[error("invalid pod: {0}")]
    InvalidPod(String),
    /// A filesystem operation failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Something is still mounted under a directory we were asked to remove.
    #[error("refusing to remove {0:?}: something is still mounted under it")]
    StillMounted(PathBuf),
    /// A name from the pod is not a safe path component; refused, never sanitized.
    #[error("invalid pod: {0}")]
    BadPath(#[from] PathError),
    /// A subPath cannot be mounted safely.
    #[error(transparent)]
    SubPath(#[from] SubPathError),
    /// A volume could not be set up (upstream's `FailedMount` wording); the pod waits.
    #[error("MountVolume.SetUp failed for volume {name:?} : {reason}")]
    SetUp { name: String, reason: String },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> VolumeError + 'a {
    move |source| VolumeError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundVolume {
    pub pod_uid: String,
    pub plugin: String,
    pub name: String,
    pub host_path: PathBuf,
}

/// What [`PodVolumeLayout::ensure`] made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ensured {
    /// Volume name -> its directory on the host.
    pub paths: BTreeMap<String, PathBuf>,
    /// Volumes set up earlier whose refresh failed: they keep their last content (as
    /// upstream, a running pod is not disturbed), each with upstream's FailedMount message.
    pub stale: Vec<String>,
    /// emptyDirs on disk using more than their `sizeLimit`: (name, sizeLimit, used bytes).
    pub over_limit: Vec<(String, String, u64)>,
}

#[derive(Debug, Clone)]
pub struct PodVolumeLayout {
    root: PathBuf,
}

impl PodVolumeLayout {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    pub fn pod_dir(&self, uid: &str) -> Result<HostPath, PathError> {
        HostPath::new(&self.root, &["pods", nodeagent_hostpath::uid(uid)?])
    }

    pub(crate) fn volume_dir(
        &self,
        uid: &str,
        plugin: &str,
        name: &str,
    ) -> Result<HostPath, PathError> {
        HostPath::new(self.pod_dir(uid)?.as_path(), &["volumes", plugin, name])
    }

    /// `<pod>/volume-subpaths/<volume>/<container>/<index>` (upstream's layout).
    fn sub_path_target(
        &self,
        uid: &str,
        volume: &str,
        container: &str,
        index: u32,
    ) -> Result<HostPath, PathError> {
        let base = self.pod_dir(uid)?.join(SUBPATHS)?;
        HostPath::new(base.as_path(), &[volume, container, &index.to_string()])
    }

    /// Idempotent: makes every volume of `pod` ready, filling configMap, secret,
    /// downwardAPI and projected volumes from `objects` (fetched for this pod).
    pub fn ensure(&self, pod: &Pod, objects: &ApiObjects) -> Result<Ensured, VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let pod_dir = self.pod_dir(uid)?;
        nodeagent_config::state::private_dir(pod_dir.as_path())
            .map_err(io("create", pod_dir.as_path()))?;
        let mut out = Ensured::default();
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        for v in &volumes {
            // Checked before anything is created: a name is one plain path component.
            nodeagent_hostpath::component(&v.name)?;
            if out.paths.contains_key(&v.name) {
                return Err(VolumeError::InvalidPod(format!(
                    "duplicate volume name {:?}",
                    v.name
                )));
            }
            out.paths.insert(v.name.clone(), PathBuf::new());
        }
        for v in volumes {
            // A claim not published yet: the caller reports why, the others are set up.
            if (v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
                && !objects.claimed.contains_key(&v.name)
            {
                out.paths.remove(&v.name);
                continue;
            }
            // Each volume's set-up is a `volume_mount` operation as upstream counts them
            // (storage_operation_duration_seconds; a payload volume refilled on every pass,
            // as upstream remounts configMap and secret volumes on every pod sync).
            // A CSI volume's publication is timed where it happens (`server`).
            let plugin = plugin_name(&v).filter(|_| v.csi.is_none());
            let started = std::time::Instant::now();
            let stale_before = out.stale.len();
            let name = v.name.clone();
            let result = self.set_up(v, uid, pod, objects, &mut out);
            if let Some(plugin) = plugin {
                let ok = result.is_ok() && out.stale.len() == stale_before;
                nodeagent_telemetry::metrics::kubelet::record_storage_operation(
                    &plugin,
                    "volume_mount",
                    started.elapsed().as_secs_f64(),
                    ok,
                );
            }
            out.paths.insert(name, result?);
        }
        Ok(out)
    }

    /// Sets up one volume of `pod`; its directory (or hostPath).
    fn set_up(
        &self,
        v: k8s_openapi::api::core::v1::Volume,
        uid: &str,
        pod: &Pod,
        objects: &ApiObjects,
        out: &mut Ensured,
    ) -> Result<PathBuf, VolumeError> {
        Ok(if let Some(empty) = &v.empty_dir {
            let dir = self.volume_dir(uid, EMPTY_DIR, &v.name)?;
            std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
            match empty.medium.as_deref().unwrap_or_default() {
                "" => {
                    set_mode(&dir, 0o777)?;
                    if let Some(over) = over_limit(&dir, empty) {
                        out.over_limit.push((v.name.clone(), over.0, over.1));
                    }
                }
                "Memory" => {
                    let size = memory_size(pod, empty, &objects.node_allocatable);
                    mount_tmpfs(&dir, size)?;
                }
                medium if medium.starts_with("HugePages") => {
                    return Err(VolumeError::SetUp {
                        name: v.name,
                        reason: hugepages_refusal(),
                    });
                }
                other => {
                    return Err(VolumeError::SetUp {
                        name: v.name,
                        reason: format!("unknown storage medium {other:?}"),
                    });
                }
            }
            if let Some(group) = fs_group(pod) {
                give_to_group(&dir, group)?;
            }
            dir.into_path_buf()
        } else if let Some(host) = &v.host_path {
            ensure_host_path(
                &v.name,
                &host.path,
                host.type_.as_deref().unwrap_or_default(),
            )?
        } else if let Some(plugin) = payload::plugin_dir(&v) {
            let dir = self.volume_dir(uid, plugin, &v.name)?;
            match self.fill(&v, plugin, &dir, pod, objects) {
                Ok(()) => {}
                // Set up before: keep what the containers see, report the failure.
                Err(reason) if dir.as_path().join(atomic_writer::DATA_DIR).exists() => {
                    out.stale.push(
                        VolumeError::SetUp {
                            name: v.name.clone(),
                            reason,
                        }
                        .to_string(),
                    )
                }
                Err(reason) => {
                    return Err(VolumeError::SetUp {
                        name: v.name,
                        reason,
                    });
                }
            }
            dir.into_path_buf()
        } else if v.csi.is_some() {
            // Published by the driver before this pass (`server::publish_csi`).
            let target = self
                .volume_dir(uid, CSI_PLUGIN_DIR, &v.name)?
                .join(MOUNT_DIR)?;
            if !subpath::is_mount_point(target.as_path()) {
                return Err(VolumeError::SetUp {
                    name: v.name,
                    reason: "kubernetes.io/csi: the volume is not published".to_string(),
                });
            }
            target.into_path_buf()
        } else if let Some(target) = objects.claimed.get(&v.name) {
            // Published by its driver before this pass (`server::publish_claims`), or a
            // hostPath or local volume's own directory (outside the pods' directories).
            if target.starts_with(self.root.join("pods")) && !crate::csi::published(target) {
                return Err(VolumeError::SetUp {
                    name: v.name,
                    reason: "kubernetes.io/csi: the volume is not published".to_string(),
                });
            }
            target.clone()
        } else {
            return Err(VolumeError::Unsupported {
                name: v.name,
                kind: "this kind of",
            });
        })
    }

    /// Writes a payload volume atomically; secrets, tokens and pod fields live on tmpfs
    /// (upstream's secret, projected and downwardAPI wrap a Memory emptyDir), config maps
    /// on disk.
    fn fill(
        &self,
        v: &k8s_openapi::api::core::v1::Volume,
        plugin: &str,
        dir: &HostPath,
        pod: &Pod,
        objects: &ApiObjects,
    ) -> Result<(), String> {
        let data = payload::volume_payload(v, pod, objects)
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        std::fs::create_dir_all(dir).map_err(|e| format!("create {dir:?}: {e}"))?;
        if plugin != payload::CONFIG_MAP_PLUGIN {
            mount_tmpfs(dir, None).map_err(|e| e.to_string())?;
        }
        let changed = atomic_writer::write(dir, &data).map_err(|e| e.to_string())?;
        if changed {
            tracing::info!(volume = %v.name, files = data.len(), "volume content written");
        }
        Ok(())
    }

    /// Unmounts the pod's subPath bind mounts (ours), before its volumes are torn down
    /// (upstream's CleanSubPaths comes before TearDown: a bind into a CSI volume would
    /// keep its filesystem busy).
    pub fn unmount_sub_paths(&self, uid: &str) -> Result<(), VolumeError> {
        let dir = self.pod_dir(uid)?;
        if !dir.exists() {
            return Ok(());
        }
        subpath::unmount_under(dir.join(SUBPATHS)?.as_path())?;
        Ok(())
    }

    /// Idempotent: removes every volume of the pod and the pod's directory, after
    /// unmounting the pod's subPath bind mounts (which are ours).
    pub fn release(&self, uid: &str) -> Result<(), VolumeError> {
        let dir = self.pod_dir(uid)?;
        if !dir.exists() {
            return Ok(());
        }
        subpath::unmount_under(dir.join(SUBPATHS)?.as_path())?;
        // Our own tmpfs mounts (Memory emptyDirs, secrets, projected, downwardAPI); never
        // a CSI driver's, which only its driver unmounts (`csi::Csi::tear_down_pod`).
        let volumes = dir.join("volumes")?;
        for plugin in std::fs::read_dir(&volumes).into_iter().flatten().flatten() {
            if plugin.file_name() != CSI_PLUGIN_DIR {
                subpath::unmount_under(&plugin.path())?;
            }
        }
        // Never delete through a mount: that would delete the mounted filesystem's files.
        if mounted_under(&dir).map_err(io("read mounts for", &dir))? {
            return Err(VolumeError::StillMounted(dir.into_path_buf()));
        }
        std::fs::remove_dir_all(&dir).map_err(io("remove", &dir))
    }

    /// Idempotent: resolves each subPath of `container` safely inside its volume and
    /// bind-mounts it at a stable path; returns mount index -> that path.
    pub fn prepare_sub_paths(
        &self,
        pod: &Pod,
        container: &str,
        mounts: &[(String, String, u32)],
        claimed: &BTreeMap<String, PathBuf>,
    ) -> Result<BTreeMap<u32, PathBuf>, VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let mut out = BTreeMap::new();
        for (volume, sub_path, index) in mounts {
            let target = self.sub_path_target(uid, volume, container, *index)?;
            let volume_dir = match claimed.get(volume) {
                Some(target) => target.clone(),
                None => self.volume_base(pod, volume)?,
            };
            let fd = SubPath {
                volume_name: volume,
                volume_dir: &volume_dir,
                sub_path,
            }
            .open_beneath()?;
            subpath::bind_at(&fd, &target)?;
            out.insert(*index, target.into_path_buf());
        }
        Ok(out)
    }

    /// The directory a volume of `pod` lives in (set up by `ensure`).
    fn volume_base(&self, pod: &Pod, name: &str) -> Result<PathBuf, VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let v = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .and_then(|vs| vs.iter().find(|v| v.name == name))
            .ok_or_else(|| VolumeError::InvalidPod(format!("no volume named {name:?}")))?;
        if v.csi.is_some() {
            return Ok(self
                .volume_dir(uid, CSI_PLUGIN_DIR, name)?
                .join(MOUNT_DIR)?
                .into_path_buf());
        }
        match (&v.empty_dir, &v.host_path, payload::plugin_dir(v)) {
            (Some(_), _, _) => Ok(self.volume_dir(uid, EMPTY_DIR, name)?.into_path_buf()),
            (None, Some(host), _) => Ok(PathBuf::from(&host.path)),
            (None, None, Some(plugin)) => Ok(self.volume_dir(uid, plugin, name)?.into_path_buf()),
            _ => Err(VolumeError::Unsupported {
                name: name.into(),
                kind: "subPath on this kind of",
            }),
        }
    }

    /// Every volume directory on disk.
    pub fn list(&self) -> Result<Vec<FoundVolume>, VolumeError> {
        let pods = self.root.join("pods");
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&pods) else {
            return Ok(out);
        };
        for pod in entries.flatten() {
            let uid = pod.file_name().to_string_lossy().to_string();
            let Ok(plugins) = std::fs::read_dir(pod.path().join("volumes")) else {
                continue;
            };
            for plugin in plugins.flatten() {
                let Ok(vols) = std::fs::read_dir(plugin.path()) else {
                    continue;
                };
                for v in vols.flatten() {
                    out.push(FoundVolume {
                        pod_uid: uid.clone(),
                        plugin: plugin.file_name().to_string_lossy().to_string(),
                        name: v.file_name().to_string_lossy().to_string(),
                        host_path: v.path(),
                    });
                }
            }
            if out.iter().all(|f| f.pod_uid != uid) {
                // A pod directory with no volumes left is still a pod's leftover.
                out.push(FoundVolume {
                    pod_uid: uid,
                    plugin: String::new(),
                    name: String::new(),
                    host_path: pod.path(),
                });
            }
        }
        out.sort_by(|a, b| (&a.pod_uid, &a.name).cmp(&(&b.pod_uid, &b.name)));
        Ok(out)
    }
}

/// The pod's `fsGroup`, if it has one.
pub(crate) fn fs_group(pod: &Pod) -> Option<u32> {
    let g = pod.spec.as_ref()?.security_context.as_ref()?.fs_group?;
    u32::try_from(g).ok()
}

/// fsGroup ownership of an emptyDir (upstream `SetVolumeOwnership`): the directory
/// belongs to the group, and setgid makes what the containers create in it belong to the
/// group too. `lchown`: the directory was just created by us, and a link is never followed.
fn give_to_group(dir: &Path, group: u32) -> Result<(), VolumeError> {
    std::os::unix::fs::lchown(dir, None, Some(group)).map_err(io("chgrp", dir))?;
    set_mode(dir, 0o2777)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), VolumeError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io("chmod", path))
}

/// `(sizeLimit, used bytes)` when the emptyDir at `dir` uses more than its `sizeLimit`
/// (counted as upstream's `du`: allocated blocks, never through a symlink). A tree too big
/// to count in full counts as what was counted.
fn over_limit(dir: &Path, empty: &EmptyDirVolumeSource) -> Option<(String, u64)> {
    let limit = empty.size_limit.as_ref()?;
    let bytes = quantity_bytes(limit)?;
    let used = nodeagent_du::measure(dir).ok()?.bytes;
    (used > bytes).then(|| (limit.0.clone(), used))
}

/// The size of a Memory emptyDir (upstream `calculateEmptyDirMemorySize`): the node's
/// allocatable memory, lowered to the pod's memory limit if it has one, lowered to
/// `sizeLimit` if that is smaller. `None`: nothing known, tmpfs's own default.
fn memory_size(
    pod: &Pod,
    empty: &EmptyDirVolumeSource,
    allocatable: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Option<u64> {
    let mut size = allocatable.get("memory").and_then(quantity_bytes);
    let limit = |q: Option<u64>| q.filter(|&l| l > 0);
    let smaller = |size: Option<u64>, other: Option<u64>| match (size, other) {
        (Some(s), Some(o)) => Some(s.min(o)),
        (s, o) => s.or(o),
    };
    size = smaller(size, limit(pod_memory_limit(pod)));
    size = smaller(
        size,
        limit(empty.size_limit.as_ref().and_then(quantity_bytes)),
    );
    size
}

/// The pod's memory limit (upstream `PodLimits`): the sum of the app containers' limits,
/// or the largest init container's if larger; `None` if an app container has none.
fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| {
        quantity_bytes(c.resources.as_ref()?.limits.as_ref()?.get("memory")?)
    };
    let mut sum = 0u64;
    for c in &spec.containers {
        sum = sum.saturating_add(limit(c)?);
    }
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter_map(limit)
        .max();
    Some(sum.max(init.unwrap_or(0)))
}

fn quantity_bytes(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<u64> {
    nodeagent_config::quantity::bytes(&q.0).and_then(|b| u64::try_from(b).ok())
}

/// Mounts a tmpfs on `dir` unless one is there already (`size` bytes, or tmpfs's default).
fn mount_tmpfs(dir: &Path, size: Option<u64>) -> Result<(), VolumeError> {
    if subpath::is_mount_point(dir) {
        return Ok(());
    }
    let options = size.map(|s| format!("size={s}"));
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        options.as_deref(),
    )
    .map_err(|e| VolumeError::Io {
        op: "mount tmpfs on",
        path: dir.to_path_buf(),
        source: e.into(),
    })
}

/// Why a HugePages emptyDir is refused: this node agent does not mount hugetlbfs yet, and
/// says whether the node has huge pages at all.
fn hugepages_refusal() -> String {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Total:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    if total == 0 {
        "the node has no huge pages (HugePages_Total is 0)".into()
    } else {
        "emptyDir medium HugePages is not supported by this node agent yet".into()
    }
}

/// Checks (and for the *OrCreate types, creates) a hostPath as upstream's `checkType`
/// does, with its messages: a Socket, CharDevice or BlockDevice is checked for its type
/// (after following symlinks, as upstream's `stat`), not only for its existence.
pub(crate) fn ensure_host_path(name: &str, path: &str, kind: &str) -> Result<PathBuf, VolumeError> {
    let p = PathBuf::from(path);
    let fail = |reason: String| VolumeError::SetUp {
        name: name.into(),
        reason,
    };
    if !p.is_absolute() {
        return Err(fail(format!("hostPath {path} must be an absolute path")));
    }
    let exists = std::fs::metadata(&p).is_ok();
    let (want, description) = match kind {
        "" => return Ok(p),
        "DirectoryOrCreate" if !exists => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&p)
                .map_err(|e| fail(format!("mkdir {path}: {e}")))?;
            return Ok(p);
        }
        "FileOrCreate" if !exists => {
            // Upstream `makeFile`: O_CREAT, 0644; the parent directory must exist.
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(&p)
                .map_err(|e| fail(format!("open {path}: {e}")))?;
            return Ok(p);
        }
        "Directory" | "DirectoryOrCreate" => ("Directory", "directory"),
        "File" | "FileOrCreate" => ("File", "file"),
        "Socket" => ("Socket", "socket file"),
        "CharDevice" => ("CharDevice", "character device"),
        "BlockDevice" => ("BlockDevice", "block device"),
        other => return Err(fail(format!("{other} is an invalid volume type"))),
    };
    if !exists {
        return Err(fail(format!("hostPath {path} doesn't exist")));
    }
    match host_path_type(&p) {
        Ok(found) if found == want => Ok(p),
        Ok(found) => Err(fail(format!(
            "hostPath type check failed: {path} is not a {description}, it's a {found}"
        ))),
        Err(e) => Err(fail(format!(
            "hostPath type check failed, {path} is not a {description}, unable to determine its type: {e}"
        ))),
    }
}

/// Upstream `GetFileType`: the hostPath type of what `path` resolves to.
fn host_path_type(path: &Path) -> Result<&'static str, String> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(path)
        .map_err(|e| format!("stat {}: {e}", path.display()))?
        .file_type();
    Ok(if t.is_dir() {
        "Directory"
    } else if t.is_file() {
        "File"
    } else if t.is_socket() {
        "Socket"
    } else if t.is_char_device() {
        "CharDevice"
    } else if t.is_block_device() {
        "BlockDevice"
    } else {
        return Err(
            "only recognise file, directory, socket, block device and character device".into(),
        );
    })
}

/// True if any mount point lies under `dir` (from /proc/self/mountinfo).
fn mounted_under(dir: &Path) -> std::io::Result<bool> {
    Ok(!subpath::mounts_under(dir)?.is_empty())
}

/// Upstream's name of the plugin that serves `v` (`kubernetes.io/empty-dir`, the name its
/// directory carries with `~` for `/`), for the volume metrics; None for kinds not served.
pub fn plugin_name(v: &k8s_openapi::api::core::v1::Volume) -> Option<String> {
    if let Some(csi) = &v.csi {
        // Upstream names a CSI volume's plugin with its driver.
        return Some(format!("kubernetes.io/csi:{}", csi.driver));
    }
    let dir = if v.empty_dir.is_some() {
        EMPTY_DIR
    } else if v.host_path.is_some() {
        "kubernetes.io~host-path"
    } else {
        payload::plugin_dir(v)?
    };
    Some(dir.replacen('~', "/", 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> ApiObjects {
        ApiObjects::default()
    }

    fn pod(uid: &str, volumes: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes}
        }))
        .unwrap()
    }

    #[test]
    fn empty_dirs_are_created_listed_and_released() {
        let root = tempfile::tempdir().unwrap();
        let layout = PodVolumeLayout::new(root.path().into());
        let p = pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]));
        let paths = layout.ensure(&p, &none()).unwrap().paths;
        let data = &paths["data"];
        assert!(data.is_dir());
        assert!(data.ends_with("pods/u1/volumes/kubernetes.io~empty-dir/data"));
        std::fs::write(data.join("f"), "x").unwrap();
        // Idempotent: the second call keeps the content.
        assert_eq!(layout.ensure(&p, &none()).unwrap().paths, paths);
        assert!(data.join("f").exists());
        let found = layout.list().unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, "data");
        layout.release("u1").unwrap();
        assert!(!root.path().join("pods/u1").exists());
        layout.release("u1").unwrap();
        assert!(layout.list().unwrap().is_empty());
    }

    #[test]
    fn an_empty_dir_belongs_to_the_pods_fs_group() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let layout = PodVolumeLayout::new(root.path().into());
        let mut p = pod("u3", serde_json::json!([{"name": "data", "emptyDir": {}}]));
        let plain = layout.ensure(&p, &none()).unwrap().paths["data"]
            .metadata()
            .unwrap();
        assert_eq!(plain.mode() & 0o7777, 0o777);
        p.spec.as_mut().unwrap().security_context =
            Some(serde_json::from_value(serde_json::json!({"fsGroup": 2000})).unwrap());
        let owned = layout.ensure(&p, &none()).unwrap().paths["data"]
            .metadata()
            .unwrap();
        assert_eq!(owned.gid(), 2000);
        assert_eq!(
            owned.mode() & 0o7777,
            0o2777,
            "setgid: new files get the group"
        );
        layout.release("u3").unwrap();
    }

    #[test]
    fn unsupported_and_invalid_volumes_say_why() {
        let root = tempfile::tempdir().unwrap();
        let layout = PodVolumeLayout::new(root.path().into());
        let p = pod(
            "u2",
            serde_json::json!([{"name": "cfg", "configMap": {"name": "x"}}]),
        );
        assert_eq!(
            layout.ensure(&p, &none()).unwrap_err().to_string(),
            "MountVolume.SetUp failed for volume \"cfg\" : configmaps \"x\" was not fetched"
        );
        let p = pod(
            "u3",
            serde_json::json!([{"name": "h", "hostPath": {"path": "/nonexistent/x", "type": "Directory"}}]),
        );
        assert!(
            layout
                .ensure(&p, &none())
                .unwrap_err()
                .to_string()
                .contains("hostPath /nonexistent/x doesn't exist")
        );
        assert!(layout.release("../etc").is_err());
    }

    #[test]
    fn names_that_would_leave_the_pod_dir_are_refused_before_anything_is_made() {
        let root = tempfile::tempdir().unwrap();
        let layout = PodVolumeLayout::new(root.path().join("r"));
        let escape = "../../../../../../../x";
        let p = pod("u4", serde_json::json!([{"name": escape, "emptyDir": {}}]));
        let err = layout.ensure(&p, &none()).unwrap_err();
        assert!(
            err.to_string().contains("not a safe path component"),
            "{err}"
        );
        assert!(!root.path().join("x").exists());
        for uid in ["", "..", "a/../../b", "x\0"] {
            let p = pod(uid, serde_json::json!([{"name": "d", "emptyDir": {}}]));
            assert!(layout.ensure(&p, &none()).is_err(), "{uid:?}");
            assert!(layout.release(uid).is_err(), "{uid:?}");
        }
        let p = pod(
            "u5",
            serde_json::json!([{"name": "d", "emptyDir": {}}, {"name": "d", "hostPath": {"path": "/"}}]),
        );
        assert!(
            layout
                .ensure(&p, &none())
                .unwrap_err()
                .to_string()
                .contains("duplicate volume name")
        );
        let p = pod("u6", serde_json::json!([{"name": "d", "emptyDir": {}}]));
        let err = layout
            .prepare_sub_paths(&p, "../c", &[("d".into(), "s".into(), 0)], &BTreeMap::new())
            .unwrap_err();
        assert!(
            err.to_string().contains("not a safe path component"),
            "{err}"
        );
    }

    #[test]
    fn host_path_sub_paths_are_resolved_beneath_and_released() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: bind mounts need root");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let host = root.path().join("host");
        std::fs::create_dir_all(host.join("ok")).unwrap();
        std::os::unix::fs::symlink("/", host.join("evil")).unwrap();
        let layout = PodVolumeLayout::new(root.path().join("r"));
        let p = pod(
            "u7",
            serde_json::json!([{"name": "h", "hostPath": {"path": host.to_str().unwrap()}}]),
        );
        layout.ensure(&p, &none()).unwrap();
        let err = layout
            .prepare_sub_paths(&p, "c", &[("h".into(), "evil".into(), 0)], &BTreeMap::new())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "subPath \"evil\" resolves outside of volume \"h\""
        );
        let paths = layout
            .prepare_sub_paths(
                &p,
                "c",
                &[("h".into(), "ok/new".into(), 1)],
                &BTreeMap::new(),
            )
            .unwrap();
        let target = root.path().join("r/pods/u7/volume-subpaths/h/c/1");
        assert_eq!(paths[&1], target);
        assert!(host.join("ok/new").is_dir());
        assert_eq!(subpath::mounts_under(root.path()).unwrap(), vec![target]);
        // ReleasePod unmounts its own bind mounts, then removes the pod dir.
        layout.release("u7").unwrap();
        assert!(subpath::mounts_under(root.path()).unwrap().is_empty());
        assert!(!root.path().join("r/pods/u7").exists());
        assert!(host.join("ok/new").is_dir(), "the host path itself is kept");
    }

    #[test]
    fn payload_volumes_are_written_secrets_on_tmpfs_and_a_failed_refresh_keeps_the_content() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: tmpfs mounts need root");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let layout = PodVolumeLayout::new(root.path().join("r"));
        let p = pod(
            "u8",
            serde_json::json!([
                {"name": "cfg", "configMap": {"name": "cm"}},
                {"name": "sec", "secret": {"secretName": "s", "defaultMode": 0o400}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
            ]),
        );
        let mut objects = none();
        let cm = serde_json::from_value(serde_json::json!({"data": {"a": "1"}})).unwrap();
        objects.config_maps.insert("cm".into(), Ok(Some(cm)));
        let secret =
            serde_json::from_value(serde_json::json!({"data": {"k": "c2VjcmV0"}})).unwrap();
        objects.secrets.insert("s".into(), Ok(Some(secret)));
        let ensured = layout.ensure(&p, &objects).unwrap();
        assert!(ensured.stale.is_empty());
        let cfg = &ensured.paths["cfg"];
        assert!(cfg.ends_with("pods/u8/volumes/kubernetes.io~configmap/cfg"));
        assert_eq!(std::fs::read_to_string(cfg.join("a")).unwrap(), "1");
        assert!(!subpath::is_mount_point(cfg), "config maps live on disk");
        let sec = &ensured.paths["sec"];
        assert!(sec.ends_with("pods/u8/volumes/kubernetes.io~secret/sec"));
        assert!(subpath::is_mount_point(sec), "secrets live on tmpfs");
        assert_eq!(std::fs::read_to_string(sec.join("k")).unwrap(), "secret");
        let mem = &ensured.paths["mem"];
        assert!(subpath::is_mount_point(mem));
        let fs = nix::sys::statvfs::statvfs(mem.as_path()).unwrap();
        assert_eq!(
            fs.blocks() * fs.fragment_size(),
            1 << 20,
            "sizeLimit sizes the tmpfs"
        );
        // The config map disappears: the volume keeps its content and the failure is told.
        objects.config_maps.insert("cm".into(), Ok(None));
        let again = layout.ensure(&p, &objects).unwrap();
        assert_eq!(
            again.stale,
            vec![
                "MountVolume.SetUp failed for volume \"cfg\" : configmaps \"cm\" not found"
                    .to_string()
            ]
        );
        assert_eq!(std::fs::read_to_string(cfg.join("a")).unwrap(), "1");
        // A new pod with the same missing config map cannot start.
        let q = pod(
            "u9",
            serde_json::json!([{"name": "cfg", "configMap": {"name": "cm"}}]),
        );
        let err = layout.ensure(&q, &objects).unwrap_err();
        assert!(matches!(err, VolumeError::SetUp { .. }), "{err}");
        // Release unmounts the tmpfs mounts and removes everything.
        for uid in ["u8", "u9"] {
            layout.release(uid).unwrap();
        }
        assert!(subpath::mounts_under(root.path()).unwrap().is_empty());
        assert!(!root.path().join("r/pods/u8").exists());
    }

    #[test]
    fn a_memory_empty_dir_is_sized_as_upstream() {
        let alloc = BTreeMap::from([(
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
        )]);
        let limited: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [
                {"name": "a", "image": "i", "resources": {"limits": {"memory": "64Mi"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"memory": "64Mi"}}}
            ], "initContainers": [
                {"name": "i", "image": "i", "resources": {"limits": {"memory": "100Mi"}}}
            ]}
        }))
        .unwrap();
        let unlimited = pod("u", serde_json::json!([]));
        let empty = |limit: Option<&str>| EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: limit
                .map(|l| k8s_openapi::apimachinery::pkg::api::resource::Quantity(l.into())),
            ..Default::default()
        };
        assert_eq!(memory_size(&unlimited, &empty(None), &alloc), Some(1 << 30));
        assert_eq!(memory_size(&limited, &empty(None), &alloc), Some(128 << 20));
        assert_eq!(
            memory_size(&limited, &empty(Some("8Mi")), &alloc),
            Some(8 << 20)
        );
        assert_eq!(
            memory_size(&limited, &empty(Some("2Gi")), &alloc),
            Some(128 << 20)
        );
        assert_eq!(
            memory_size(&unlimited, &empty(None), &BTreeMap::new()),
            None
        );
    }

    #[test]
    fn host_path_types_are_checked_as_upstream() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().display().to_string();
        let socket = root.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let socket = socket.display().to_string();
        let file = root.path().join("f");
        std::fs::write(&file, "").unwrap();
        let file = file.display().to_string();
        let check = |path: &str, kind: &str| {
            ensure_host_path("h", path, kind)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let failed = |reason: &str| {
            Err(format!(
                "MountVolume.SetUp failed for volume \"h\" : {reason}"
            ))
        };
        assert_eq!(check("/dev/null", "CharDevice"), Ok(()));
        assert_eq!(
            check("/dev/null", "BlockDevice"),
            failed(
                "hostPath type check failed: /dev/null is not a block device, it's a CharDevice"
            )
        );
        assert_eq!(check(&socket, "Socket"), Ok(()));
        assert_eq!(
            check(&file, "Socket"),
            failed(&format!(
                "hostPath type check failed: {file} is not a socket file, it's a File"
            ))
        );
        assert_eq!(
            check(&dir, "File"),
            failed(&format!(
                "hostPath type check failed: {dir} is not a file, it's a Directory"
            ))
        );
        assert_eq!(
            check(&file, "DirectoryOrCreate"),
            failed(&format!(
                "hostPath type check failed: {file} is not a directory, it's a File"
            ))
        );
        assert_eq!(
            check(&format!("{dir}/none"), "CharDevice"),
            failed(&format!("hostPath {dir}/none doesn't exist"))
        );
        assert_eq!(
            check(&dir, "Weird"),
            failed("Weird is an invalid volume type")
        );
        // *OrCreate make what is missing (a file only in an existing directory).
        assert_eq!(
            check(&format!("{dir}/new/deeper"), "DirectoryOrCreate"),
            Ok(())
        );
        assert!(root.path().join("new/deeper").is_dir());
        assert_eq!(check(&format!("{dir}/made"), "FileOrCreate"), Ok(()));
        assert!(root.path().join("made").is_file());
        assert!(check(&format!("{dir}/no/parent"), "FileOrCreate").is_err());
    }

    #[test]
    fn an_empty_dir_over_its_size_limit_is_reported() {
        let root = tempfile::tempdir().unwrap();
        let layout = PodVolumeLayout::new(root.path().into());
        let p = pod(
            "u10",
            serde_json::json!([{"name": "d", "emptyDir": {"sizeLimit": "64Ki"}},
                {"name": "free", "emptyDir": {}}]),
        );
        let dir = layout.ensure(&p, &none()).unwrap().paths["d"].clone();
        assert!(layout.ensure(&p, &none()).unwrap().over_limit.is_empty());
        std::fs::write(dir.join("big"), vec![1u8; 1 << 20]).unwrap();
        let over = layout.ensure(&p, &none()).unwrap().over_limit;
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!((over[0].0.as_str(), over[0].1.as_str()), ("d", "64Ki"));
        assert!(over[0].2 >= 1 << 20);
        layout.release("u10").unwrap();
    }
}
