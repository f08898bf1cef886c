//! Where pod volumes live on disk and how each kind is set up and torn down.

use crate::subpath::{self, SubPath, SubPathError};
use k8s_openapi::api::core::v1::Pod;
use nodeagent_hostpath::{HostPath, PathError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
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
    /// A hostPath volume's path does not match its declared type.
    #[error("volume {name:?}: hostPath {path:?}: {reason}")]
    HostPath {
        name: String,
        path: String,
        reason: String,
    },
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

    fn volume_dir(&self, uid: &str, plugin: &str, name: &str) -> Result<HostPath, PathError> {
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

    /// Idempotent: makes every volume of `pod` ready; returns name -> host path.
    pub fn ensure(&self, pod: &Pod) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.pod_dir(uid)?;
        let mut paths = BTreeMap::new();
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        for v in volumes {
            // Checked before anything is created: a name is one plain path component.
            nodeagent_hostpath::component(&v.name)?;
            if paths.contains_key(&v.name) {
                return Err(VolumeError::InvalidPod(format!(
                    "duplicate volume name {:?}",
                    v.name
                )));
            }
            let path = if let Some(empty) = &v.empty_dir {
                if empty.medium.as_deref() == Some("Memory") {
                    return Err(VolumeError::Unsupported {
                        name: v.name,
                        kind: "emptyDir medium Memory",
                    });
                }
                let dir = self.volume_dir(uid, EMPTY_DIR, &v.name)?;
                std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
                set_mode(&dir, 0o777)?;
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
            } else {
                let kind = if v.config_map.is_some() {
                    "configMap"
                } else if v.secret.is_some() {
                    "secret"
                } else if v.projected.is_some() {
                    "projected"
                } else if v.persistent_volume_claim.is_some() {
                    "persistentVolumeClaim"
                } else {
                    "this kind of"
                };
                return Err(VolumeError::Unsupported { name: v.name, kind });
            };
            paths.insert(v.name, path);
        }
        Ok(paths)
    }

    /// Idempotent: removes every volume of the pod and the pod's directory, after
    /// unmounting the pod's subPath bind mounts (which are ours).
    pub fn release(&self, uid: &str) -> Result<(), VolumeError> {
        let dir = self.pod_dir(uid)?;
        if !dir.exists() {
            return Ok(());
        }
        subpath::unmount_under(dir.join(SUBPATHS)?.as_path())?;
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
    ) -> Result<BTreeMap<u32, PathBuf>, VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let mut out = BTreeMap::new();
        for (volume, sub_path, index) in mounts {
            let target = self.sub_path_target(uid, volume, container, *index)?;
            let volume_dir = self.volume_base(pod, volume)?;
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
        match (&v.empty_dir, &v.host_path) {
            (Some(_), _) => Ok(self.volume_dir(uid, EMPTY_DIR, name)?.into_path_buf()),
            (None, Some(host)) => Ok(PathBuf::from(&host.path)),
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
fn fs_group(pod: &Pod) -> Option<u32> {
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

/// Checks (and for the *OrCreate types, creates) a hostPath as upstream does.
fn ensure_host_path(name: &str, path: &str, kind: &str) -> Result<PathBuf, VolumeError> {
    let p = PathBuf::from(path);
    let err = |reason: &str| VolumeError::HostPath {
        name: name.into(),
        path: path.into(),
        reason: reason.into(),
    };
    if !p.is_absolute() {
        return Err(err("must be an absolute path"));
    }
    match kind {
        "" => {}
        "DirectoryOrCreate" => {
            std::fs::create_dir_all(&p).map_err(io("create", &p))?;
        }
        "Directory" if !p.is_dir() => return Err(err("is not a directory")),
        "FileOrCreate" if !p.exists() => {
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            std::fs::File::create(&p).map_err(io("create", &p))?;
        }
        "File" if !p.is_file() => return Err(err("is not a file")),
        "Socket" | "CharDevice" | "BlockDevice" if !p.exists() => {
            return Err(err("does not exist"));
        }
        "Directory" | "File" | "FileOrCreate" | "Socket" | "CharDevice" | "BlockDevice" => {}
        other => return Err(err(&format!("unknown hostPath type {other:?}"))),
    }
    Ok(p)
}

/// True if any mount point lies under `dir` (from /proc/self/mountinfo).
fn mounted_under(dir: &Path) -> std::io::Result<bool> {
    Ok(!subpath::mounts_under(dir)?.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let paths = layout.ensure(&p).unwrap();
        let data = &paths["data"];
        assert!(data.is_dir());
        assert!(data.ends_with("pods/u1/volumes/kubernetes.io~empty-dir/data"));
        std::fs::write(data.join("f"), "x").unwrap();
        // Idempotent: the second call keeps the content.
        assert_eq!(layout.ensure(&p).unwrap(), paths);
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
        let plain = layout.ensure(&p).unwrap()["data"].metadata().unwrap();
        assert_eq!(plain.mode() & 0o7777, 0o777);
        p.spec.as_mut().unwrap().security_context =
            Some(serde_json::from_value(serde_json::json!({"fsGroup": 2000})).unwrap());
        let owned = layout.ensure(&p).unwrap()["data"].metadata().unwrap();
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
            layout.ensure(&p).unwrap_err().to_string(),
            "volume \"cfg\": configMap volumes are not supported by this node agent yet"
        );
        let p = pod(
            "u3",
            serde_json::json!([{"name": "h", "hostPath": {"path": "/nonexistent/x", "type": "Directory"}}]),
        );
        assert!(
            layout
                .ensure(&p)
                .unwrap_err()
                .to_string()
                .contains("is not a directory")
        );
        assert!(layout.release("../etc").is_err());
    }

    #[test]
    fn names_that_would_leave_the_pod_dir_are_refused_before_anything_is_made() {
        let root = tempfile::tempdir().unwrap();
        let layout = PodVolumeLayout::new(root.path().join("r"));
        let escape = "../../../../../../../x";
        let p = pod("u4", serde_json::json!([{"name": escape, "emptyDir": {}}]));
        let err = layout.ensure(&p).unwrap_err();
        assert!(
            err.to_string().contains("not a safe path component"),
            "{err}"
        );
        assert!(!root.path().join("x").exists());
        for uid in ["", "..", "a/../../b", "x\0"] {
            let p = pod(uid, serde_json::json!([{"name": "d", "emptyDir": {}}]));
            assert!(layout.ensure(&p).is_err(), "{uid:?}");
            assert!(layout.release(uid).is_err(), "{uid:?}");
        }
        let p = pod(
            "u5",
            serde_json::json!([{"name": "d", "emptyDir": {}}, {"name": "d", "hostPath": {"path": "/"}}]),
        );
        assert!(
            layout
                .ensure(&p)
                .unwrap_err()
                .to_string()
                .contains("duplicate volume name")
        );
        let p = pod("u6", serde_json::json!([{"name": "d", "emptyDir": {}}]));
        let err = layout
            .prepare_sub_paths(&p, "../c", &[("d".into(), "s".into(), 0)])
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
        layout.ensure(&p).unwrap();
        let err = layout
            .prepare_sub_paths(&p, "c", &[("h".into(), "evil".into(), 0)])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "subPath \"evil\" resolves outside of volume \"h\""
        );
        let paths = layout
            .prepare_sub_paths(&p, "c", &[("h".into(), "ok/new".into(), 1)])
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
}
