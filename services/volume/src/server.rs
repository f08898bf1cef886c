//! volume's gRPC API; one function maps domain errors to gRPC status codes.

use crate::fetch::Fetcher;
use crate::layout::{PodVolumeLayout, VolumeError};
use crate::payload::References;
use crate::subpath::SubPathError;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_proto::api::{
    EmptyDirOverLimit, EnsurePodVolumesRequest, EnsurePodVolumesResponse, ListVolumesRequest,
    ListVolumesResponse, PodVolume, PrepareSubPathsRequest, PrepareSubPathsResponse,
    ReleasePodRequest, ReleasePodResponse, VolumeStatsRequest, VolumeStatsResponse,
    VolumesInUseRequest, VolumesInUseResponse, volume_server::Volume,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// The same FailedMount message for a pod is posted as an event at most this often.
const REPEAT_EVENT_AFTER: Duration = Duration::from_secs(60);

pub struct VolumeService {
    pub layout: PodVolumeLayout,
    pub fetcher: Fetcher,
    /// CSI drivers and the inline CSI volumes they publish.
    pub csi: crate::csi::Csi,
    /// One set-up at a time per pod: the atomic writer must not race itself on a volume.
    busy: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The last FailedMount message posted per (pod uid, message), and when.
    reported: Mutex<HashMap<(String, String), Instant>>,
    /// Per pod asked for: its volumes' plugins, and those of the volumes set up
    /// (`volume_manager_total_volumes`' desired and actual states).
    volumes: Mutex<HashMap<String, PodVolumeCounts>>,
    /// Per pod: its claimed volumes' plugins and where they were published (by the pod's
    /// volume name; the directory carries the PV's name), for its subPaths and stats.
    claimed: Mutex<HashMap<String, Claimed>>,
    /// The persistent volumes' stats, measured in the background.
    pub stats: crate::csi::stats::VolumeStats,
}

/// A pod's claimed volumes set up: the pod's volume name -> (plugin, published path).
type Claimed = std::collections::BTreeMap<String, (String, std::path::PathBuf)>;

/// Where a pod's claimed volumes are noted, in `<root-dir>/pods/<uid>/` (ours; upstream
/// has no such record): a restarted volume service still knows which volume a running
/// pod's claim was set up on when the claim cannot be read (the API server away, the
/// claim deleted), where upstream's reconstruction needs the claim.
const CLAIMED_RECORD: &str = "claimed-volumes.json";

/// A pod's volumes by plugin: those it has, and those set up.
#[derive(Default)]
struct PodVolumeCounts {
    desired: Vec<String>,
    actual: Vec<String>,
}

impl VolumeService {
    pub fn new(
        layout: PodVolumeLayout,
        fetcher: Fetcher,
        csi: crate::csi::Csi,
        stats: crate::csi::stats::VolumeStats,
    ) -> Self {
        Self {
            layout,
            fetcher,
            csi,
            stats,
            busy: Mutex::default(),
            reported: Mutex::default(),
            volumes: Mutex::default(),
            claimed: Mutex::default(),
        }
    }

    /// Notes a pod's volumes after an ensure (`set_up`: whether every one is set up; a
    /// failed pass keeps what the last one set up) or its release (None), and serves the
    /// totals as `volume_manager_total_volumes`. `claims`: the plugins of the pod's
    /// claimed volumes whose volume is known (a claim not processed is not in upstream's
    /// desired state either).
    fn count_volumes(&self, uid: &str, now: Option<(&Pod, bool)>, claims: &[String]) {
        let mut volumes = self.volumes.lock().unwrap();
        match now {
            Some((pod, set_up)) => {
                let desired: Vec<String> = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(crate::layout::plugin_name)
                    .chain(claims.iter().cloned())
                    .collect();
                let entry = volumes.entry(uid.to_string()).or_default();
                if set_up {
                    entry.actual = desired.clone();
                }
                entry.desired = desired;
            }
            None => {
                volumes.remove(uid);
            }
        }
        let mut counts = std::collections::BTreeMap::<String, (i64, i64)>::new();
        for pod in volumes.values() {
            for plugin in &pod.desired {
                counts.entry(plugin.clone()).or_default().0 += 1;
            }
            for plugin in &pod.actual {
                counts.entry(plugin.clone()).or_default().1 += 1;
            }
        }
        nodeagent_telemetry::metrics::kubelet::set_volume_counts(&counts);
    }

    fn pod_lock(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.busy
            .lock()
            .unwrap()
            .entry(uid.to_string())
            .or_default()
            .clone()
    }

    /// A volume that cannot be set up: a warning in the log and a FailedMount Warning
    /// event on the pod (as upstream's volume manager posts; FailedMapVolume for a block
    /// volume's map, as upstream's operation generator posts it), not repeated within a
    /// minute.
    async fn failed_mount(&self, pod: &Pod, message: &str) {
        let reason = if message.starts_with("MapVolume.") {
            "FailedMapVolume"
        } else {
            "FailedMount"
        };
        tracing::warn!(%message, "{reason}");
        let Some(client) = self.fetcher.client() else {
            return;
        };
        let key = (
            nodeagent_proto::k8s::pod_uid(pod).to_string(),
            message.to_string(),
        );
        let now = Instant::now();
        {
            let mut reported = self.reported.lock().unwrap();
            if reported
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < REPEAT_EVENT_AFTER)
            {
                return;
            }
            reported.insert(key, now);
        }
        use nodeagent_config::events::{EventType, post};
        post(
            client,
            pod,
            EventType::Warning,
            reason,
            message,
            self.fetcher.node_name(),
        )
        .await;
    }

    /// Fetches what the pod's volumes need, then sets them up (on the blocking pool).
    async fn ensure(&self, pod: Pod) -> Result<crate::Ensured, Status> {
        let uid = nodeagent_proto::k8s::pod_uid(&pod).to_string();
        let lock = self.pod_lock(&uid);
        let _one_at_a_time = lock.lock().await;
        let mut refs = References::of_pod(&pod);
        refs.node_allocatable |= memory_empty_dir(&pod);
        let mut objects = self.fetcher.objects(&pod, &refs).await;
        let inline = match self.publish_csi(&pod, &objects).await {
            Ok(inline) => inline,
            Err(e) => {
                self.count_volumes(&uid, Some((&pod, false)), &[]);
                self.failed_mount(&pod, &e.to_string()).await;
                return Err(to_status(e));
            }
        };
        // Claimed volumes: those that fail wait, the others are set up meanwhile.
        let (claimed, claim_errors) = self.publish_claims(&pod).await;
        let claim_plugins: Vec<String> = claimed
            .values()
            .map(|(plugin, _)| plugin.clone())
            .chain(claim_errors.failed_plugins.iter().cloned())
            .collect();
        self.stats
            .set_pod(&pod, crate::csi::stats::sources(&pod, &claimed, &inline));
        objects.claimed = paths(&claimed);
        let changed = self.claimed.lock().unwrap().get(&uid) != Some(&claimed);
        if changed && let Err(e) = self.write_claimed(&uid, &claimed) {
            tracing::warn!(error = %e, "cannot note the pod's claimed volumes");
        }
        self.claimed.lock().unwrap().insert(uid.clone(), claimed);
        let layout = self.layout.clone();
        let for_layout = pod.clone();
        let ensured = tokio::task::spawn_blocking(move || layout.ensure(&for_layout, &objects))
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        self.count_volumes(
            &uid,
            Some((&pod, ensured.is_ok() && claim_errors.is_empty())),
            &claim_plugins,
        );
        match ensured {
            Ok(ensured) => {
                for message in &ensured.stale {
                    self.failed_mount(&pod, message).await;
                }
                if !claim_errors.is_empty() {
                    for message in &claim_errors.errors {
                        self.failed_mount(&pod, message).await;
                    }
                    let all: Vec<&str> = claim_errors
                        .errors
                        .iter()
                        .chain(&claim_errors.waiting)
                        .map(String::as_str)
                        .collect();
                    return Err(Status::failed_precondition(all.join("; ")));
                }
                Ok(ensured)
            }
            Err(e) => {
                if matches!(
                    e,
                    VolumeError::SetUp { .. } | VolumeError::Unsupported { .. }
                ) {
                    self.failed_mount(&pod, &e.to_string()).await;
                }
                Err(to_status(e))
            }
        }
    }
}

impl VolumeService {
    /// Notes the pod's claimed volumes on disk (written aside, then renamed).
    fn write_claimed(&self, uid: &str, claimed: &Claimed) -> std::io::Result<()> {
        let dir = self
            .layout
            .pod_dir(uid)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if claimed.is_empty() && !dir.as_path().join(CLAIMED_RECORD).exists() {
            return Ok(());
        }
        std::fs::create_dir_all(dir.as_path())?;
        let tmp = dir.as_path().join(format!(".{CLAIMED_RECORD}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(claimed)?)?;
        std::fs::rename(&tmp, dir.as_path().join(CLAIMED_RECORD))
    }

    /// What was noted of the pod's claimed volumes (none when nothing readable was).
    fn read_claimed(&self, uid: &str) -> Claimed {
        let Ok(dir) = self.layout.pod_dir(uid) else {
            return Claimed::new();
        };
        std::fs::read(dir.as_path().join(CLAIMED_RECORD))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }
}

impl VolumeService {
    /// Publishes the pod's inline CSI volumes not yet published (before the other kinds,
    /// which `layout` sets up on the blocking pool), each a `volume_mount` operation; their
    /// targets by name.
    async fn publish_csi(
        &self,
        pod: &Pod,
        objects: &crate::payload::ApiObjects,
    ) -> Result<std::collections::BTreeMap<String, std::path::PathBuf>, VolumeError> {
        let mut targets = std::collections::BTreeMap::new();
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for v in volumes.into_iter().flatten() {
            let Some(source) = &v.csi else {
                continue;
            };
            let started = Instant::now();
            let published = self
                .csi
                .set_up(pod, &v.name, source, &objects.secrets)
                .await;
            if let Some(plugin) = crate::layout::plugin_name(v) {
                nodeagent_telemetry::metrics::kubelet::record_storage_operation(
                    &plugin,
                    "volume_mount",
                    started.elapsed().as_secs_f64(),
                    published.is_ok(),
                );
            }
            let target = published.map_err(|reason| VolumeError::SetUp {
                name: v.name.clone(),
                reason,
            })?;
            targets.insert(v.name.clone(), target);
        }
        Ok(targets)
    }
}

impl VolumeService {
    /// Sets up the pod's claimed volumes: where each one set up was published, and the
    /// FailedMount messages of the others, as upstream's volume manager words them (the
    /// claims that cannot be used yet together, as `WaitForAttachAndMount` reports them;
    /// each mount step's failure alone).
    async fn publish_claims(&self, pod: &Pod) -> (Claimed, ClaimErrors) {
        let mut published = std::collections::BTreeMap::new();
        let mut not_processed = Vec::new();
        let mut errors = Vec::new();
        let mut waiting = Vec::new();
        let mut failed_plugins = Vec::new();
        let uid = nodeagent_proto::k8s::pod_uid(pod);
        let remembered = self.claimed.lock().unwrap().get(uid).cloned();
        let previous = remembered.unwrap_or_else(|| self.read_claimed(uid));
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for v in volumes.into_iter().flatten() {
            let started = Instant::now();
            let Some(set_up) = self.csi.set_up_claim(pod, v).await else {
                continue;
            };
            use crate::csi::persistent::ClaimError;
            let plugin = match &set_up {
                Ok((plugin, _)) | Err(ClaimError::Mount { plugin, .. }) => Some(plugin),
                // Not in the desired state at all, or not yet to be mounted: no operation
                // was tried.
                Err(ClaimError::Process(_) | ClaimError::NotVerifiedAttached(_)) => None,
            };
            if let Some(plugin) = plugin {
                nodeagent_telemetry::metrics::kubelet::record_storage_operation(
                    plugin,
                    crate::csi::persistent::operation(&set_up),
                    started.elapsed().as_secs_f64(),
                    set_up.is_ok(),
                );
            }
            match set_up {
                Ok(set_up) => {
                    published.insert(v.name.clone(), set_up);
                }
                // Set up before, and still there: a claim that cannot be read now (the API
                // server away, the claim being deleted) keeps what the containers see, as
                // upstream's populator never processes a running pod's volumes twice.
                Err(e) if previous.get(&v.name).is_some_and(|(_, p)| still_set_up(p)) => {
                    tracing::warn!(volume = %v.name, error = ?e, "claimed volume kept as it was set up");
                    published.insert(v.name.clone(), previous[&v.name].clone());
                }
                Err(ClaimError::Process(e)) => not_processed.push((v.name.clone(), e)),
                Err(ClaimError::Mount { message, plugin }) => {
                    errors.push(message);
                    failed_plugins.push(plugin);
                }
                Err(ClaimError::NotVerifiedAttached(message)) => {
                    tracing::info!(volume = %v.name, %message, "waiting for the volume to be reported in use and attached");
                    waiting.push(message);
                }
            }
        }
        if !not_processed.is_empty() {
            let failed: std::collections::BTreeSet<&str> =
                not_processed.iter().map(|(n, _)| n.as_str()).collect();
            // The volumes the containers mount that are not mounted: those failing here.
            let unmounted: Vec<String> = mounted_by_containers(pod)
                .into_iter()
                .filter(|n| failed.contains(n.as_str()))
                .collect();
            let processed: Vec<&str> = not_processed.iter().map(|(n, _)| n.as_str()).collect();
            let reasons: Vec<&str> = not_processed.iter().map(|(_, e)| e.as_str()).collect();
            errors.insert(
                0,
                format!(
                    "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[{}]: {}",
                    unmounted.join(" "),
                    sorted(processed).join(" "),
                    reasons.join("; ")
                ),
            );
        }
        (
            published,
            ClaimErrors {
                errors,
                waiting,
                failed_plugins,
            },
        )
    }
}

/// Why some claimed volumes of a pod are not set up.
struct ClaimErrors {
    /// FailedMount messages.
    errors: Vec<String>,
    /// Reasons to wait that upstream only logs.
    waiting: Vec<String>,
    /// The plugins of the volumes whose mount failed.
    failed_plugins: Vec<String>,
}

impl ClaimErrors {
    fn is_empty(&self) -> bool {
        self.errors.is_empty() && self.waiting.is_empty()
    }
}

/// The published paths of a pod's claimed volumes, by the pod's volume name.
fn paths(claimed: &Claimed) -> std::collections::BTreeMap<String, std::path::PathBuf> {
    claimed
        .iter()
        .map(|(name, (_, path))| (name.clone(), path.clone()))
        .collect()
}

/// Whether a claimed volume's path is still what the containers were given: a CSI
/// publication still mounted, a hostPath or local volume's directory still there.
fn still_set_up(path: &std::path::Path) -> bool {
    let csi = path
        .components()
        .any(|c| c.as_os_str() == crate::csi::CSI_PLUGIN_DIR);
    if csi {
        crate::csi::published(path)
    } else {
        path.exists()
    }
}

fn sorted(mut list: Vec<&str>) -> Vec<&str> {
    list.sort_unstable();
    list.dedup();
    list
}

/// The volumes any container of the pod mounts or uses as a device, sorted (upstream's
/// `GetPodVolumeNames`, the volumes `WaitForAttachAndMount` waits for).
fn mounted_by_containers(pod: &Pod) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    if let Some(spec) = &pod.spec {
        let containers = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten());
        for c in containers {
            for m in c.volume_mounts.iter().flatten() {
                names.insert(m.name.clone());
            }
            for d in c.volume_devices.iter().flatten() {
                names.insert(d.name.clone());
            }
        }
        for c in spec.ephemeral_containers.iter().flatten() {
            for m in c.volume_mounts.iter().flatten() {
                names.insert(m.name.clone());
            }
        }
    }
    names.into_iter().collect()
}

/// Whether the pod has an emptyDir on tmpfs (its size depends on the node's allocatable).
fn memory_empty_dir(pod: &Pod) -> bool {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes.into_iter().flatten().any(|v| {
        v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref() == Some("Memory"))
    })
}

fn to_status(e: VolumeError) -> Status {
    match e {
        VolumeError::Unsupported { .. } => Status::unimplemented(e.to_string()),
        VolumeError::InvalidPod(_)
        | VolumeError::BadPath(_)
        | VolumeError::SubPath(SubPathError::Invalid { .. } | SubPathError::Escapes { .. }) => {
            Status::invalid_argument(e.to_string())
        }
        VolumeError::SubPath(SubPathError::Sys { .. } | SubPathError::Mount { .. }) => {
            Status::internal(e.to_string())
        }
        VolumeError::StillMounted(_) | VolumeError::SetUp { .. } => {
            Status::failed_precondition(e.to_string())
        }
        VolumeError::Io { .. } => Status::internal(e.to_string()),
    }
}

#[tonic::async_trait]
impl Volume for VolumeService {
    async fn ensure_pod_volumes(
        &self,
        request: Request<EnsurePodVolumesRequest>,
    ) -> Result<Response<EnsurePodVolumesResponse>, Status> {
        let req = request.into_inner();
        let pod = nodeagent_proto::k8s::decode_pod(&req.pod_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let span = tracing::info_span!(
            "ensure_pod_volumes",
            k8s.pod.uid = %nodeagent_proto::k8s::pod_uid(&pod),
            k8s.pod.name = %nodeagent_proto::k8s::pod_name(&pod),
            k8s.namespace.name = %nodeagent_proto::k8s::pod_namespace(&pod),
        );
        nodeagent_telemetry::set_parent_from(&span, req.trace.as_ref());
        let ensured = self.ensure(pod).instrument(span).await?;
        Ok(Response::new(EnsurePodVolumesResponse {
            host_paths: ensured
                .paths
                .into_iter()
                .map(|(k, v)| (k, v.to_string_lossy().into_owned()))
                .collect(),
            over_limit: ensured
                .over_limit
                .into_iter()
                .map(|(volume, size_limit, used_bytes)| EmptyDirOverLimit {
                    volume,
                    size_limit,
                    used_bytes,
                })
                .collect(),
        }))
    }

    async fn release_pod(
        &self,
        request: Request<ReleasePodRequest>,
    ) -> Result<Response<ReleasePodResponse>, Status> {
        let req = request.into_inner();
        let span = tracing::info_span!("release_pod", k8s.pod.uid = %req.pod_uid);
        nodeagent_telemetry::set_parent_from(&span, req.trace.as_ref());
        let layout = self.layout.clone();
        let uid = req.pod_uid.clone();
        let csi = self.csi.clone();
        // Never beside a set-up of the same pod.
        let lock = self.pod_lock(&uid);
        let _one_at_a_time = lock.lock().await;
        async move {
            // The subPath binds first, then CSI volumes, each through its driver: `layout`
            // then finds nothing of theirs mounted (and refuses to remove what still is).
            let for_sub_paths = (layout.clone(), uid.clone());
            tokio::task::spawn_blocking(move || for_sub_paths.0.unmount_sub_paths(&for_sub_paths.1))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(to_status)?;
            csi.tear_down_pod(&uid).await.map_err(|e| {
                tracing::warn!(error = %e, "CSI volumes not torn down; retried with the pod's teardown");
                Status::failed_precondition(e)
            })?;
            tokio::task::spawn_blocking(move || layout.release(&uid))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(to_status)?;
            // The staged volumes this pod was the last to use (a failure is retried by the
            // next release and the periodic pass; it never fails the pod's release).
            for error in csi.unstage_unused().await {
                tracing::warn!(%error, "CSI volume not unstaged; retried later");
            }
            Ok::<(), Status>(())
        }
        .instrument(span)
        .await?;
        self.fetcher.forget_pod(&req.pod_uid);
        self.count_volumes(&req.pod_uid, None, &[]);
        self.claimed.lock().unwrap().remove(&req.pod_uid);
        self.stats.forget_pod(&req.pod_uid);
        self.csi.forget_wanted(&req.pod_uid);
        self.busy.lock().unwrap().remove(&req.pod_uid);
        self.reported
            .lock()
            .unwrap()
            .retain(|(uid, _), _| *uid != req.pod_uid);
        tracing::info!(pod.uid = %req.pod_uid, "released pod volumes");
        Ok(Response::new(ReleasePodResponse {}))
    }

    async fn prepare_sub_paths(
        &self,
        request: Request<PrepareSubPathsRequest>,
    ) -> Result<Response<PrepareSubPathsResponse>, Status> {
        let req = request.into_inner();
        let pod = nodeagent_proto::k8s::decode_pod(&req.pod_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let span = tracing::info_span!(
            "prepare_sub_paths",
            k8s.pod.uid = %nodeagent_proto::k8s::pod_uid(&pod),
            k8s.container.name = %req.container_name,
        );
        nodeagent_telemetry::set_parent_from(&span, req.trace.as_ref());
        let layout = self.layout.clone();
        let mounts: Vec<_> = req
            .mounts
            .into_iter()
            .map(|m| (m.volume_name, m.sub_path, m.mount_index))
            .collect();
        let container = req.container_name;
        let claimed = self
            .claimed
            .lock()
            .unwrap()
            .get(nodeagent_proto::k8s::pod_uid(&pod))
            .map(paths)
            .unwrap_or_default();
        let paths = async move {
            let prepared = tokio::task::spawn_blocking(move || {
                layout.prepare_sub_paths(&pod, &container, &mounts, &claimed)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
            if let Err(e) = &prepared {
                tracing::warn!(error = %e, "subPath refused");
            }
            prepared.map_err(to_status)
        }
        .instrument(span)
        .await?;
        Ok(Response::new(PrepareSubPathsResponse {
            host_paths: paths
                .into_iter()
                .map(|(k, v)| (k, v.to_string_lossy().into_owned()))
                .collect(),
        }))
    }

    async fn volume_stats(
        &self,
        _request: Request<VolumeStatsRequest>,
    ) -> Result<Response<VolumeStatsResponse>, Status> {
        Ok(Response::new(VolumeStatsResponse {
            volumes: self.stats.measured(),
        }))
    }

    async fn volumes_in_use(
        &self,
        _request: Request<VolumesInUseRequest>,
    ) -> Result<Response<VolumesInUseResponse>, Status> {
        Ok(Response::new(VolumesInUseResponse {
            names: self.csi.volumes_in_use().await,
        }))
    }

    async fn list(
        &self,
        _request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let found = self.layout.list().map_err(to_status)?;
        Ok(Response::new(ListVolumesResponse {
            volumes: found
                .into_iter()
                .map(|f| PodVolume {
                    pod_uid: f.pod_uid,
                    name: f.name,
                    plugin: f.plugin,
                    host_path: f.host_path.to_string_lossy().into_owned(),
                })
                .collect(),
        }))
    }
}
