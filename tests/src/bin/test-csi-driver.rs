//! A CSI driver for the tests (issue 32), hostpath style, speaking the CSI spec's protobuf
//! (`proto/proto/csi/v1/csi.proto`) as real drivers do, and registering as they do through
//! a node-driver-registrar: it serves the kubelet's plugin registration API
//! (`pluginregistration.Registration`: `GetInfo`, `NotifyRegistrationStatus`) on
//! `<registry-dir>/<driver>-reg.sock`, and the CSI Identity and Node services on
//! `--csi-socket`.
//!
//! A volume is a directory `<state-dir>/volumes/<volume id>`. With `--stage` the driver
//! offers STAGE_UNSTAGE_VOLUME: `NodeStageVolume` bind-mounts the directory at the staging
//! path and `NodePublishVolume` bind-mounts the staging path at the target (read-only when
//! asked); without it, or for a volume published without a staging path, the directory is
//! bind-mounted at the target directly. A volume attribute `content` is written to the file
//! `content` in it when it is made, so a test can tell that the volume a container sees is
//! this driver's. A volume first made by a publish (an inline, ephemeral one: no stage
//! came first) is deleted at its unpublish, as csi-driver-host-path deletes its ephemeral
//! volumes; a staged one keeps its data across unstage and stage, as a disk would.
//!
//! A block volume (the Block access type) is a file `<state-dir>/volumes/<volume id>.img`
//! of [`BLOCK_BYTES`] on a loop device, as csi-driver-host-path makes one: the `content`
//! attribute is written at its start when it is made; `NodeStageVolume` attaches the loop
//! device and `NodeUnstageVolume` detaches it (`losetup`), `NodePublishVolume` makes the
//! target file and bind-mounts the loop device on it (attaching it first when nothing was
//! staged), `NodeUnpublishVolume` unmounts and removes the file (and, without
//! `--stage`, detaches the loop device: a block volume then serves one publication at a
//! time).
//!
//! What a test watches and steers, all in `--state-dir`:
//! - `calls.log`: one JSON object per CSI call (`rpc`, and the request's fields that matter),
//!   appended before the call is answered;
//! - `registration.log`: each `NotifyRegistrationStatus` (`registered`, `error`);
//! - `fail-publish` / `fail-unpublish` / `fail-stage` / `fail-unstage` / `fail-expand` /
//!   `fail-controller-publish`: while such a file exists, that call fails with `INTERNAL`
//!   and the file's content as the message.
//!
//! The CSI Controller service, on the same socket as real drivers serve it, is what an
//! external-attacher calls: `ControllerPublishVolume` and `ControllerUnpublishVolume`
//! (PUBLISH_UNPUBLISH_VOLUME) for a node named by this driver's `--node-id` (another node
//! is NOT_FOUND, as csi-driver-host-path answers), the publish context naming the node it
//! attached to (`attachedTo`), which the kubelet then hands to `NodeStageVolume`. The rest
//! of the Controller service (provisioning, snapshots) is UNIMPLEMENTED: volumes are made
//! at their first stage or publish.

use clap::Parser;
use nodeagent_proto::csi::controller_server::{Controller, ControllerServer};
use nodeagent_proto::csi::identity_server::{Identity, IdentityServer};
use nodeagent_proto::csi::node_server::{Node, NodeServer};
use nodeagent_proto::csi::*;
use nodeagent_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use nodeagent_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::{Request, Response, Status};

#[derive(Parser, Clone)]
struct Args {
    /// The kubelet's plugin registry directory (`<root-dir>/plugins_registry`).
    #[arg(long)]
    registry_dir: PathBuf,
    #[arg(long, default_value = "hostpath.csi.nodeagent.test")]
    driver_name: String,
    /// The CSI endpoint (a unix socket path).
    #[arg(long)]
    csi_socket: PathBuf,
    #[arg(long)]
    state_dir: PathBuf,
    #[arg(long)]
    node_id: String,
    /// The CSI versions offered at registration (`GetInfo`'s `supported_versions`).
    #[arg(long, default_value = "1.0.0")]
    versions: Vec<String>,
    /// The plugin type offered at registration.
    #[arg(long, default_value = "CSIPlugin")]
    plugin_type: String,
    /// Offer STAGE_UNSTAGE_VOLUME (`NodeStageVolume`, `NodeUnstageVolume`).
    #[arg(long)]
    stage: bool,
    /// Offer GET_VOLUME_STATS (`NodeGetVolumeStats`).
    #[arg(long)]
    volume_stats: bool,
    /// Offer VOLUME_MOUNT_GROUP (the kubelet then leaves the fsGroup to the driver; this
    /// one only records the `volume_mount_group` it is given).
    #[arg(long)]
    volume_mount_group: bool,
    /// Offer EXPAND_VOLUME (`NodeExpandVolume`: the volume's quota becomes the required
    /// bytes, which its stats then report).
    #[arg(long)]
    expand: bool,
}

/// The capacity the driver gives a volume until it is expanded, and its inodes (a quota, as
/// a real driver's volume has one of its own, so that its numbers are the volume's, not
/// the host filesystem's).
const CAPACITY_BYTES: i64 = 1 << 30;
const CAPACITY_INODES: i64 = 100_000;

/// The size of a block volume's file.
const BLOCK_BYTES: u64 = 8 << 20;

struct Driver {
    args: Args,
    /// One loop device attach at a time (a look, then an attach: two calls at once would
    /// attach two devices to one file).
    loops: std::sync::Mutex<()>,
}

/// The `volume_mount_group` of a mount capability (empty for none).
fn mount_group(capability: Option<&VolumeCapability>) -> String {
    match capability.and_then(|c| c.access_type.as_ref()) {
        Some(volume_capability::AccessType::Mount(m)) => m.volume_mount_group.clone(),
        _ => String::new(),
    }
}

/// Whether the capability asks for a block volume.
fn is_block(capability: Option<&VolumeCapability>) -> bool {
    matches!(
        capability.and_then(|c| c.access_type.as_ref()),
        Some(volume_capability::AccessType::Block(_))
    )
}

/// `losetup` with `args`; its standard output.
fn losetup(args: &[&str]) -> Result<String, Status> {
    let out = std::process::Command::new("losetup")
        .args(args)
        .output()
        .map_err(|e| internal("run losetup", e))?;
    if !out.status.success() {
        return Err(Status::internal(format!(
            "losetup {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The loop devices backed by `file` (`losetup -j`: `/dev/loop3: []: (file)` lines).
fn loops_of(file: &Path) -> Result<Vec<String>, Status> {
    let listed = losetup(&["-j", &file.to_string_lossy()])?;
    Ok(listed
        .lines()
        .filter_map(|l| l.split(':').next())
        .filter(|d| d.starts_with("/dev/loop"))
        .map(str::to_string)
        .collect())
}

impl Driver {
    fn record(&self, file: &str, entry: serde_json::Value) {
        println!("{entry}");
        let path = self.args.state_dir.join(file);
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{entry}"));
        if let Err(e) = appended {
            eprintln!("test-csi-driver: appending to {}: {e}", path.display());
        }
    }

    /// The injected failure of `rpc`, if its file exists.
    fn injected(&self, file: &str) -> Result<(), Status> {
        match std::fs::read_to_string(self.args.state_dir.join(file)) {
            Ok(message) => Err(Status::internal(message.trim().to_string())),
            Err(_) => Ok(()),
        }
    }

    fn volume_dir(&self, id: &str) -> Result<PathBuf, Status> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(Status::invalid_argument(format!("bad volume id {id:?}")));
        }
        Ok(self.args.state_dir.join("volumes").join(id))
    }

    /// Where the driver keeps a volume's quota once expanded.
    fn quota_file(&self, id: &str) -> PathBuf {
        self.args.state_dir.join("quota").join(id)
    }

    fn quota(&self, id: &str) -> i64 {
        std::fs::read_to_string(self.quota_file(id))
            .ok()
            .and_then(|q| q.trim().parse().ok())
            .unwrap_or(CAPACITY_BYTES)
    }

    /// Where the driver notes that a volume was made by a publish (ephemeral).
    fn ephemeral_marker(&self, id: &str) -> PathBuf {
        self.args.state_dir.join("ephemeral").join(id)
    }

    /// A block volume's file (made with the `content` attribute at its start if it is not
    /// there) and its loop device, attached if it is not.
    fn block_device(
        &self,
        id: &str,
        context: &std::collections::HashMap<String, String>,
    ) -> Result<String, Status> {
        let dir = self.volume_dir(id)?;
        let file = dir.with_file_name(format!("{id}.img"));
        if !file.exists() {
            std::fs::create_dir_all(file.parent().expect("under the state dir"))
                .map_err(|e| internal("create", e))?;
            let tmp = file.with_extension("img.tmp");
            let mut bytes = context
                .get("content")
                .map(|c| c.as_bytes().to_vec())
                .unwrap_or_default();
            bytes.truncate(BLOCK_BYTES as usize);
            std::fs::write(&tmp, &bytes)
                .and_then(|()| std::fs::OpenOptions::new().write(true).open(&tmp))
                .and_then(|f| f.set_len(BLOCK_BYTES))
                .and_then(|()| std::fs::rename(&tmp, &file))
                .map_err(|e| internal("make the volume's file", e))?;
        }
        let _one = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(device) = loops_of(&file)?.into_iter().next() {
            return Ok(device);
        }
        Ok(losetup(&["-f", "--show", &file.to_string_lossy()])?
            .trim()
            .to_string())
    }

    /// Detaches the loop devices of a block volume (none for a filesystem one).
    fn detach_block(&self, id: &str) -> Result<(), Status> {
        let file = self.volume_dir(id)?.with_file_name(format!("{id}.img"));
        if !file.exists() {
            return Ok(());
        }
        let _one = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        for device in loops_of(&file)? {
            losetup(&["-d", &device])?;
        }
        Ok(())
    }

    /// Makes the volume's directory if it is not there (with the `content` attribute).
    fn make_volume(
        &self,
        data: &Path,
        context: &std::collections::HashMap<String, String>,
    ) -> Result<(), Status> {
        if data.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(data).map_err(|e| internal("create", e))?;
        if let Some(content) = context.get("content") {
            std::fs::write(data.join("content"), content).map_err(|e| internal("write", e))?;
        }
        Ok(())
    }
}

/// Bind-mounts `source` at `target` (made if missing), read-only when asked.
fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(target).map_err(|e| internal("create the target", e))?;
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| internal("bind mount", e))?;
    if read_only {
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| internal("remount read-only", e))?;
    }
    Ok(())
}

/// Unmounts everything stacked on `target` and removes it, a directory or a block
/// volume's file (gone is fine).
fn unbind(target: &Path) -> Result<(), Status> {
    while is_mount_point(target) {
        nix::mount::umount(target).map_err(|e| internal("unmount", e))?;
    }
    let removed = if target.is_file() {
        std::fs::remove_file(target)
    } else {
        std::fs::remove_dir(target)
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(internal("remove the target", e)),
    }
}

fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == wanted)
}

/// The access mode asked for, by its CSI name.
fn access_mode(capability: Option<&VolumeCapability>) -> String {
    capability
        .and_then(|c| c.access_mode.as_ref())
        .map(|m| {
            volume_capability::access_mode::Mode::try_from(m.mode)
                .map(|m| m.as_str_name().to_string())
                .unwrap_or_else(|_| m.mode.to_string())
        })
        .unwrap_or_default()
}

/// The bytes of the files under `dir` and its entries (the directory itself counted), not
/// following symlinks.
fn usage(dir: &Path) -> std::io::Result<(u64, u64)> {
    let mut bytes = 0;
    let mut entries = 1;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            let (b, e) = usage(&entry.path())?;
            bytes += b;
            entries += e;
        } else {
            bytes += entry.metadata()?.len();
            entries += 1;
        }
    }
    Ok((bytes, entries))
}

fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.record("calls.log", json!({"rpc": "GetPluginInfo"}));
        Ok(Response::new(GetPluginInfoResponse {
            name: self.args.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // The Controller service (what an external-attacher checks before it attaches).
        use plugin_capability::{Service, Type, service};
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let context: BTreeMap<_, _> = req.volume_context.clone().into_iter().collect();
        let publish_context: BTreeMap<_, _> = req.publish_context.clone().into_iter().collect();
        let access_mode = access_mode(req.volume_capability.as_ref());
        self.record(
            "calls.log",
            json!({
                "rpc": "NodeStageVolume",
                "volume_id": req.volume_id,
                "staging_target_path": req.staging_target_path,
                "access_mode": access_mode,
                "block": is_block(req.volume_capability.as_ref()),
                "volume_mount_group": mount_group(req.volume_capability.as_ref()),
                "volume_context": context,
                "publish_context": publish_context,
                "secrets": req.secrets.keys().collect::<std::collections::BTreeSet<_>>(),
            }),
        );
        if !self.args.stage {
            return Err(Status::unimplemented("STAGE_UNSTAGE_VOLUME is not offered"));
        }
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging_target_path is required"));
        }
        if req.volume_capability.is_none() {
            return Err(Status::invalid_argument("volume_capability is required"));
        }
        self.injected("fail-stage")?;
        if is_block(req.volume_capability.as_ref()) {
            self.block_device(&req.volume_id, &req.volume_context)?;
            return Ok(Response::new(NodeStageVolumeResponse {}));
        }
        let data = self.volume_dir(&req.volume_id)?;
        let staging = PathBuf::from(&req.staging_target_path);
        if is_mount_point(&staging) {
            return Ok(Response::new(NodeStageVolumeResponse {}));
        }
        self.make_volume(&data, &req.volume_context)?;
        bind(&data, &staging, false)?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        self.record(
            "calls.log",
            json!({
                "rpc": "NodeUnstageVolume",
                "volume_id": req.volume_id,
                "staging_target_path": req.staging_target_path,
            }),
        );
        if !self.args.stage {
            return Err(Status::unimplemented("STAGE_UNSTAGE_VOLUME is not offered"));
        }
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging_target_path is required"));
        }
        self.injected("fail-unstage")?;
        self.detach_block(&req.volume_id)?;
        unbind(Path::new(&req.staging_target_path))?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let capability = req.volume_capability.as_ref();
        let (fs_type, mount_flags) = match capability.and_then(|c| c.access_type.as_ref()) {
            Some(volume_capability::AccessType::Mount(m)) => {
                (m.fs_type.clone(), m.mount_flags.clone())
            }
            Some(volume_capability::AccessType::Block(_)) => (String::from("block"), vec![]),
            None => (String::new(), vec![]),
        };
        let access_mode = access_mode(capability);
        let context: BTreeMap<_, _> = req.volume_context.clone().into_iter().collect();
        let secrets: BTreeMap<_, _> = req
            .secrets
            .keys()
            .cloned()
            .map(|k| (k, "<redacted>"))
            .collect();
        self.record(
            "calls.log",
            json!({
                "rpc": "NodePublishVolume",
                "volume_id": req.volume_id,
                "target_path": req.target_path,
                "staging_target_path": req.staging_target_path,
                "readonly": req.readonly,
                "fs_type": fs_type,
                "mount_flags": mount_flags,
                "volume_mount_group": mount_group(capability),
                "access_mode": access_mode,
                "volume_context": context,
                "secrets": secrets,
            }),
        );
        // The spec's required fields.
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        if capability.is_none() {
            return Err(Status::invalid_argument("volume_capability is required"));
        }
        self.injected("fail-publish")?;
        let target = PathBuf::from(&req.target_path);
        if is_mount_point(&target) {
            return Ok(Response::new(NodePublishVolumeResponse {}));
        }
        if is_block(capability) {
            // As csi-driver-host-path: the loop device on a file the driver makes.
            let device = self.block_device(&req.volume_id, &req.volume_context)?;
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&target)
                .map_err(|e| internal("create the target file", e))?;
            nix::mount::mount(
                Some(device.as_str()),
                &target,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| internal("bind mount the block device", e))?;
            return Ok(Response::new(NodePublishVolumeResponse {}));
        }
        if req.staging_target_path.is_empty() {
            let data = self.volume_dir(&req.volume_id)?;
            if !data.exists() {
                // Marked first: a kill between the two leaves nothing unmarked.
                let marker = self.ephemeral_marker(&req.volume_id);
                std::fs::create_dir_all(marker.parent().expect("under the state dir"))
                    .and_then(|()| std::fs::write(&marker, b""))
                    .map_err(|e| internal("mark ephemeral", e))?;
                self.make_volume(&data, &req.volume_context)?;
            }
            bind(&data, &target, req.readonly)?;
        } else {
            let staging = PathBuf::from(&req.staging_target_path);
            if !is_mount_point(&staging) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is not staged at {}",
                    req.volume_id, req.staging_target_path
                )));
            }
            bind(&staging, &target, req.readonly)?;
        }
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.record(
            "calls.log",
            json!({
                "rpc": "NodeUnpublishVolume",
                "volume_id": req.volume_id,
                "target_path": req.target_path,
            }),
        );
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        self.injected("fail-unpublish")?;
        unbind(Path::new(&req.target_path))?;
        // Without a stage, a block volume's loop device was attached by its publish.
        if !self.args.stage {
            self.detach_block(&req.volume_id)?;
        }
        // An ephemeral volume's data goes with its publication; a staged one's stays.
        let marker = self.ephemeral_marker(&req.volume_id);
        if marker.exists() {
            let data = self.volume_dir(&req.volume_id)?;
            match std::fs::remove_dir_all(&data) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(internal("remove the volume", e)),
            }
            let _ = std::fs::remove_file(marker);
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    /// The volume's usage under its quota: the bytes of its files and its entries (as
    /// csi-driver-host-path measures a volume), recorded with the request in `calls.log`.
    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        if !self.args.volume_stats {
            return Err(Status::unimplemented("GET_VOLUME_STATS is not offered"));
        }
        if req.volume_id.is_empty() || req.volume_path.is_empty() {
            return Err(Status::invalid_argument(
                "volume_id and volume_path are required",
            ));
        }
        let path = PathBuf::from(&req.volume_path);
        if !is_mount_point(&path) {
            return Err(Status::not_found(format!(
                "volume {} is not published at {}",
                req.volume_id, req.volume_path
            )));
        }
        let (bytes, entries) = usage(&path).map_err(|e| internal("measure", e))?;
        let (bytes, entries) = (bytes as i64, entries as i64);
        self.record(
            "calls.log",
            json!({
                "rpc": "NodeGetVolumeStats",
                "volume_id": req.volume_id,
                "volume_path": req.volume_path,
                "staging_target_path": req.staging_target_path,
                "used_bytes": bytes,
                "used_inodes": entries,
            }),
        );
        let usage = |unit: volume_usage::Unit, total: i64, used: i64| VolumeUsage {
            available: total - used,
            total,
            used,
            unit: unit as i32,
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage: vec![
                usage(volume_usage::Unit::Bytes, self.quota(&req.volume_id), bytes),
                usage(volume_usage::Unit::Inodes, CAPACITY_INODES, entries),
            ],
            volume_condition: None,
        }))
    }

    /// Grows the volume's quota to the required bytes (never shrinks it).
    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        if !self.args.expand {
            return Err(Status::unimplemented("EXPAND_VOLUME is not offered"));
        }
        let required = req.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        self.record(
            "calls.log",
            json!({
                "rpc": "NodeExpandVolume",
                "volume_id": req.volume_id,
                "volume_path": req.volume_path,
                "staging_target_path": req.staging_target_path,
                "required_bytes": required,
                "access_mode": access_mode(req.volume_capability.as_ref()),
            }),
        );
        if req.volume_id.is_empty() || req.volume_path.is_empty() {
            return Err(Status::invalid_argument(
                "volume_id and volume_path are required",
            ));
        }
        self.injected("fail-expand")?;
        if !is_mount_point(Path::new(&req.volume_path)) {
            return Err(Status::not_found(format!(
                "volume {} is not published at {}",
                req.volume_id, req.volume_path
            )));
        }
        let quota = self.quota(&req.volume_id).max(required);
        let file = self.quota_file(&req.volume_id);
        std::fs::create_dir_all(file.parent().expect("under the state dir"))
            .and_then(|()| std::fs::write(&file, quota.to_string()))
            .map_err(|e| internal("write the quota", e))?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: quota,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        self.record("calls.log", json!({"rpc": "NodeGetCapabilities"}));
        use node_service_capability::{Rpc, Type, rpc};
        let offered = [
            (self.args.stage, rpc::Type::StageUnstageVolume),
            (self.args.volume_stats, rpc::Type::GetVolumeStats),
            (self.args.expand, rpc::Type::ExpandVolume),
            (self.args.volume_mount_group, rpc::Type::VolumeMountGroup),
        ];
        let capabilities = offered
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, t)| NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        self.record("calls.log", json!({"rpc": "NodeGetInfo"}));
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.args.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

/// The Controller RPCs this driver does not offer.
fn not_offered<T>(rpc: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("{rpc} is not offered")))
}

#[tonic::async_trait]
impl Controller for Driver {
    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let context: BTreeMap<_, _> = req.volume_context.clone().into_iter().collect();
        self.record(
            "calls.log",
            json!({
                "rpc": "ControllerPublishVolume",
                "volume_id": req.volume_id,
                "node_id": req.node_id,
                "readonly": req.readonly,
                "access_mode": access_mode(req.volume_capability.as_ref()),
                "block": is_block(req.volume_capability.as_ref()),
                "volume_context": context,
            }),
        );
        self.volume_dir(&req.volume_id)?;
        if req.volume_capability.is_none() {
            return Err(Status::invalid_argument("volume_capability is required"));
        }
        if req.node_id != self.args.node_id {
            return Err(Status::not_found(format!(
                "node {:?} not found",
                req.node_id
            )));
        }
        self.injected("fail-controller-publish")?;
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: [("attachedTo".to_string(), req.node_id)].into(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.record(
            "calls.log",
            json!({
                "rpc": "ControllerUnpublishVolume",
                "volume_id": req.volume_id,
                "node_id": req.node_id,
            }),
        );
        self.volume_dir(&req.volume_id)?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::{Rpc, Type, rpc};
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: rpc::Type::PublishUnpublishVolume as i32,
                })),
            }],
        }))
    }

    async fn create_volume(
        &self,
        _: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        not_offered("CreateVolume")
    }

    async fn delete_volume(
        &self,
        _: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        not_offered("DeleteVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        _: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        not_offered("ValidateVolumeCapabilities")
    }

    async fn list_volumes(
        &self,
        _: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        not_offered("ListVolumes")
    }

    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        not_offered("GetCapacity")
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        not_offered("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        not_offered("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        not_offered("ListSnapshots")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        not_offered("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        not_offered("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        not_offered("ControllerModifyVolume")
    }
}

#[tonic::async_trait]
impl Registration for Driver {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.record("registration.log", json!({"rpc": "GetInfo"}));
        Ok(Response::new(PluginInfo {
            r#type: self.args.plugin_type.clone(),
            name: self.args.driver_name.clone(),
            endpoint: self.args.csi_socket.to_string_lossy().into_owned(),
            supported_versions: self.args.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.record(
            "registration.log",
            json!({
                "rpc": "NotifyRegistrationStatus",
                "registered": status.plugin_registered,
                "error": status.error,
            }),
        );
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

fn listen(path: &Path) -> std::io::Result<tokio_stream::wrappers::UnixListenerStream> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    Ok(tokio_stream::wrappers::UnixListenerStream::new(
        tokio::net::UnixListener::bind(path)?,
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(args.state_dir.join("volumes"))?;
    let driver = Arc::new(Driver {
        args: args.clone(),
        loops: std::sync::Mutex::new(()),
    });
    // The CSI endpoint first: a registration names it, so it must answer by then.
    let csi = tonic::transport::Server::builder()
        .add_service(IdentityServer::from_arc(driver.clone()))
        .add_service(NodeServer::from_arc(driver.clone()))
        .add_service(ControllerServer::from_arc(driver.clone()))
        .serve_with_incoming(listen(&args.csi_socket)?);
    let registration_socket = args
        .registry_dir
        .join(format!("{}-reg.sock", args.driver_name));
    let csi = tokio::spawn(csi);
    let registration = tonic::transport::Server::builder()
        .add_service(RegistrationServer::from_arc(driver.clone()))
        .serve_with_incoming_shutdown(listen(&registration_socket)?, async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        });
    println!(
        "test-csi-driver {}: CSI on {}, registration on {}",
        args.driver_name,
        args.csi_socket.display(),
        registration_socket.display()
    );
    registration.await?;
    // Stopped on SIGTERM or SIGINT: the registration socket goes, as node-driver-registrar's does, so
    // that the kubelet deregisters the driver.
    let _ = std::fs::remove_file(&registration_socket);
    csi.abort();
    Ok(())
}
