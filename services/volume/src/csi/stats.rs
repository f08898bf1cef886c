//! Persistent volume stats: what upstream's volume stat calculator
//! (`pkg/kubelet/server/stats/volume_stat_calculator.go`) takes of the volumes only this
//! service can measure. A CSI volume (claimed or inline) is measured through its driver's
//! `NodeGetVolumeStats`, on the volume's id and its publish target, only when the driver
//! offers GET_VOLUME_STATS (upstream's `metricsCsi`); a `local` persistent volume by statfs
//! (upstream's `MetricsStatFS`); a `hostPath` persistent volume has none (`MetricsNil`).
//!
//! Each pod's volumes are noted at every set-up and measured in the background every
//! `volumeStatsAggPeriod`, a volume never measured at once. http-server's Summary reads
//! the last measurements (`VolumeStats`), and a claim's numbers set the
//! `kubelet_volume_stats_*` gauges, as upstream's collector derives them from the Summary.

use super::{Csi, call, go_rpc_error, read_vol_data};
use k8s_openapi::api::core::v1::Pod;
use nodeagent_proto::api::MeasuredVolume;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a pod's volumes with stats are noted, in `<root-dir>/pods/<uid>/` (ours), so that
/// a restarted volume service measures them again at once rather than at the pod's next
/// set-up (up to `syncFrequency` later): the Summary's entries and the
/// `kubelet_volume_stats_*` series do not vanish across its restart.
const RECORD: &str = "volume-stats.json";

/// What [`RECORD`] holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Record {
    namespace: String,
    sources: Vec<Source>,
}

/// How a volume is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum How {
    /// `NodeGetVolumeStats` of the driver in the `vol_data.json` beside the target.
    Csi,
    /// statfs of the volume's directory.
    StatFs,
}

/// A pod volume with stats.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Source {
    /// The pod's name for it.
    pub name: String,
    /// Its claim (in the pod's namespace), for a claimed volume.
    pub claim: Option<String>,
    /// Where it is published (what the containers get).
    pub path: PathBuf,
    pub how: How,
}

/// The plugin a claimed volume was set up by, as `set_up_claim` names it, to how it is
/// measured (None: no stats).
pub fn how_for_plugin(plugin: &str) -> Option<How> {
    if plugin.starts_with("kubernetes.io/csi") {
        Some(How::Csi)
    } else if plugin == "kubernetes.io/local-volume" {
        Some(How::StatFs)
    } else {
        None
    }
}

/// The pod's volumes with stats: its claimed volumes (`claimed`: the pod's volume name ->
/// (plugin, path)) and its inline CSI volumes (`inline`: name -> publish target), by name.
pub fn sources(
    pod: &Pod,
    claimed: &BTreeMap<String, (String, PathBuf)>,
    inline: &BTreeMap<String, PathBuf>,
) -> Vec<Source> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut out: Vec<Source> = volumes
        .into_iter()
        .flatten()
        .filter_map(|v| {
            if let Some(target) = inline.get(&v.name) {
                return Some(Source {
                    name: v.name.clone(),
                    claim: None,
                    path: target.clone(),
                    how: How::Csi,
                });
            }
            let (plugin, path) = claimed.get(&v.name)?;
            // A block volume has no filesystem to measure (not done: upstream's
            // `NodeGetVolumeStats` of a block volume's publish target).
            if super::block::is_pod_link(path) {
                return None;
            }
            Some(Source {
                name: v.name.clone(),
                claim: super::persistent::claim_name(pod, v),
                path: path.clone(),
                how: how_for_plugin(plugin)?,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// One measurement: capacity, available and used bytes, inodes, free and used inodes.
type Usage = [u64; 6];

struct PodVolumes {
    namespace: String,
    sources: Vec<Source>,
    /// Whether its record on disk says the same (see [`RECORD`]).
    noted: bool,
}

#[derive(Default)]
struct State {
    /// By pod UID.
    pods: HashMap<String, PodVolumes>,
    /// By (pod UID, volume name): the last measurement (None: the volume has no stats, or
    /// could not be measured) and when it was taken.
    measured: HashMap<(String, String), (Option<MeasuredVolume>, Instant)>,
}

/// A CSI stats call answers within this, or the volume is left out until the next period
/// (one hung driver must not hold back every other volume's stats).
const MEASURE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct VolumeStats {
    csi: Csi,
    period: Duration,
    state: Arc<Mutex<State>>,
    wake: Arc<tokio::sync::Notify>,
}

impl VolumeStats {
    /// `period`: `volumeStatsAggPeriod` (0: no stats are taken, as upstream).
    pub fn new(csi: Csi, period: Duration) -> Self {
        Self {
            csi,
            period,
            state: Arc::default(),
            wake: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes the pod's volumes with stats after a set-up; a volume new to it is measured
    /// at once.
    pub fn set_pod(&self, pod: &Pod, sources: Vec<Source>) {
        let uid = nodeagent_proto::k8s::pod_uid(pod).to_string();
        let unchanged = self
            .lock()
            .pods
            .get(&uid)
            .is_some_and(|p| p.sources == sources && p.noted);
        if unchanged {
            return;
        }
        let record = Record {
            namespace: nodeagent_proto::k8s::pod_namespace(pod).to_string(),
            sources,
        };
        // Off the lock; a failure is tried again at the pod's next set-up.
        let noted = match self.write_record(&uid, &record) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pod.uid = %uid, error = %e, "cannot note the pod's volumes with stats");
                false
            }
        };
        let mut state = self.lock();
        let sources = &record.sources;
        state
            .measured
            .retain(|(u, name), _| *u != uid || sources.iter().any(|s| s.name == *name));
        state.pods.insert(
            uid,
            PodVolumes {
                namespace: record.namespace,
                sources: record.sources,
                noted,
            },
        );
        drop(state);
        self.wake.notify_one();
    }

    /// Notes the pod's volumes with stats on disk (written aside, then renamed); none
    /// noted when there are none and never were.
    fn write_record(&self, uid: &str, record: &Record) -> std::io::Result<()> {
        let dir = self
            .csi
            .layout
            .pod_dir(uid)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let path = dir.as_path().join(RECORD);
        if record.sources.is_empty() && !path.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(dir.as_path())?;
        let tmp = dir.as_path().join(format!(".{RECORD}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(record)?)?;
        std::fs::rename(&tmp, path)
    }

    /// At start: the pods' volumes with stats as the last run noted them (a pod released
    /// since has no directory, so no record), measured at once.
    pub fn restore(&self) {
        let pods = self.csi.root.join("pods");
        let mut restored = 0;
        let mut state = self.lock();
        for entry in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            let Ok(bytes) = std::fs::read(entry.path().join(RECORD)) else {
                continue;
            };
            match serde_json::from_slice::<Record>(&bytes) {
                Ok(record) => {
                    restored += 1;
                    state.pods.entry(uid).or_insert(PodVolumes {
                        namespace: record.namespace,
                        sources: record.sources,
                        noted: true,
                    });
                }
                Err(e) => {
                    tracing::warn!(pod.uid = %uid, error = %e, "cannot read the pod's volumes with stats")
                }
            }
        }
        drop(state);
        if restored > 0 {
            tracing::info!(
                pods = restored,
                "pods' volumes with stats restored from disk"
            );
            self.wake.notify_one();
        }
    }

    /// Forgets a released pod.
    pub fn forget_pod(&self, uid: &str) {
        let mut state = self.lock();
        state.pods.remove(uid);
        state.measured.retain(|(u, _), _| u != uid);
        drop(state);
        self.publish_metrics();
    }

    /// The last measurements, by pod UID and volume name.
    pub fn measured(&self) -> Vec<MeasuredVolume> {
        let state = self.lock();
        let mut out: Vec<MeasuredVolume> = state
            .measured
            .values()
            .filter_map(|(m, _)| m.clone())
            .collect();
        out.sort_by(|a, b| (&a.pod_uid, &a.name).cmp(&(&b.pod_uid, &b.name)));
        out
    }

    /// Measures what is due every period (and at once what is new) until `shutdown`.
    pub async fn run(self, shutdown: nodeagent_transport::Shutdown) {
        if self.period.is_zero() {
            tracing::info!("volumeStatsAggPeriod is 0: no volume stats are taken");
            return;
        }
        loop {
            self.measure_due().await;
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.period) => {}
            }
        }
    }

    /// Measures, all at once, each volume never measured or measured at least a period
    /// ago, then sets the gauges. A volume that cannot be measured now drops out of the
    /// stats (upstream rebuilds a pod's stats every period) until the next period.
    async fn measure_due(&self) {
        let due: Vec<(String, String, Source)> = {
            let state = self.lock();
            state
                .pods
                .iter()
                .flat_map(|(uid, pod)| {
                    pod.sources
                        .iter()
                        .map(move |s| (uid.clone(), pod.namespace.clone(), s.clone()))
                })
                .filter(|(uid, _, s)| {
                    state
                        .measured
                        .get(&(uid.clone(), s.name.clone()))
                        .is_none_or(|(_, at)| at.elapsed() >= self.period)
                })
                .collect()
        };
        let mut measuring = tokio::task::JoinSet::new();
        for (uid, namespace, source) in due {
            let this = self.clone();
            measuring.spawn(async move {
                let measured = tokio::time::timeout(MEASURE_TIMEOUT, this.measure(&source))
                    .await
                    .unwrap_or_else(|_| Err("timed out".to_string()));
                let measured = match measured {
                    Ok(usage) => usage,
                    Err(error) => {
                        // Upstream: "Failed to calculate volume metrics", at V(4).
                        tracing::debug!(pod.uid = %uid, volume = %source.name, %error, "failed to calculate volume metrics");
                        None
                    }
                };
                let measured = measured.map(|usage| {
                    let [capacity, available, used, inodes, inodes_free, inodes_used] = usage;
                    MeasuredVolume {
                        pod_uid: uid.clone(),
                        name: source.name.clone(),
                        pvc_namespace: source.claim.as_ref().map(|_| namespace).unwrap_or_default(),
                        pvc_name: source.claim.clone().unwrap_or_default(),
                        time_ns: nodeagent_cri::now_nanos(),
                        capacity_bytes: capacity,
                        available_bytes: available,
                        used_bytes: used,
                        inodes,
                        inodes_free,
                        inodes_used,
                    }
                });
                let mut state = this.lock();
                // A pod released or a volume gone meanwhile is not brought back.
                let wanted = state
                    .pods
                    .get(&uid)
                    .is_some_and(|p| p.sources.contains(&source));
                if wanted {
                    state
                        .measured
                        .insert((uid, source.name), (measured, Instant::now()));
                }
            });
        }
        while measuring.join_next().await.is_some() {}
        self.publish_metrics();
    }

    /// One volume's usage; None when it has no stats (a driver without GET_VOLUME_STATS).
    async fn measure(&self, source: &Source) -> Result<Option<Usage>, String> {
        match source.how {
            How::StatFs => {
                let path = source.path.clone();
                let fs =
                    tokio::task::spawn_blocking(move || nodeagent_config::machine::statvfs(&path))
                        .await
                        .map_err(|e| e.to_string())?
                        .ok_or_else(|| format!("statfs of {} failed", source.path.display()))?;
                Ok(Some([
                    fs.capacity,
                    fs.available,
                    fs.used,
                    fs.inodes,
                    fs.inodes_free,
                    fs.inodes.saturating_sub(fs.inodes_free),
                ]))
            }
            How::Csi => self.csi.node_volume_stats(&source.path).await,
        }
    }

    /// The claims' numbers as `kubelet_volume_stats_*` (a claim several pods use, once).
    fn publish_metrics(&self) {
        let claims: Vec<nodeagent_telemetry::metrics::kubelet::ClaimStats> = self
            .measured()
            .into_iter()
            .filter(|m| !m.pvc_name.is_empty())
            .map(|m| {
                let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                (
                    (m.pvc_namespace, m.pvc_name),
                    [
                        gauge(m.capacity_bytes),
                        gauge(m.available_bytes),
                        gauge(m.used_bytes),
                        gauge(m.inodes),
                        gauge(m.inodes_free),
                        gauge(m.inodes_used),
                    ],
                )
            })
            .collect();
        nodeagent_telemetry::metrics::kubelet::set_volume_stats(&claims);
    }
}

impl Csi {
    /// Upstream's `metricsCsi.GetMetrics` of the CSI volume published at `target`: None
    /// when the driver does not offer GET_VOLUME_STATS; a usage the driver leaves out is
    /// 0, as upstream's `NodeGetVolumeStats` client has it.
    pub async fn node_volume_stats(&self, target: &Path) -> Result<Option<Usage>, String> {
        let dir = target
            .parent()
            .ok_or_else(|| format!("{} has no volume directory", target.display()))?;
        let data = read_vol_data(dir)?;
        let driver = self.registry.driver(&data.driver_name)?;
        let capabilities = self
            .try_capabilities(&driver)
            .await
            .map_err(|s| go_rpc_error(&s))?;
        if !capabilities.volume_stats {
            return Ok(None);
        }
        let request = nodeagent_proto::csi::NodeGetVolumeStatsRequest {
            volume_id: data.volume_handle,
            volume_path: target.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        };
        let answer = call(driver.node_client().node_get_volume_stats(request))
            .await
            .map_err(|s| go_rpc_error(&s))?;
        if answer.usage.is_empty() {
            return Err("failed to get usage from response. usage is nil".to_string());
        }
        Ok(Some(usage_of(&answer.usage)))
    }
}

/// The BYTES and INODES usages of a `NodeGetVolumeStats` answer (others are left out, as
/// upstream logs and skips an unknown unit); negative numbers read as 0.
fn usage_of(usages: &[nodeagent_proto::csi::VolumeUsage]) -> Usage {
    use nodeagent_proto::csi::volume_usage::Unit;
    let mut out = [0u64; 6];
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    for u in usages {
        match Unit::try_from(u.unit) {
            Ok(Unit::Bytes) => {
                out[0] = n(u.total);
                out[1] = n(u.available);
                out[2] = n(u.used);
            }
            Ok(Unit::Inodes) => {
                out[3] = n(u.total);
                out[4] = n(u.available);
                out[5] = n(u.used);
            }
            _ => tracing::warn!(unit = u.unit, "unknown unit in a NodeGetVolumeStats usage"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeagent_proto::csi::VolumeUsage;
    use nodeagent_proto::csi::volume_usage::Unit;

    /// What a set-up noted comes back in a new instance (a restarted service), and a pod
    /// with no volumes with stats leaves no record.
    #[tokio::test]
    async fn a_restarted_service_knows_the_pods_volumes_with_stats() {
        let root = tempfile::tempdir().unwrap();
        let csi = Csi::new(root.path(), None, "node".into());
        let pod = |uid: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": uid}}))
            .unwrap()
        };
        let source = Source {
            name: "data".into(),
            claim: Some("claim".into()),
            path: root
                .path()
                .join("pods/uid-1/volumes/kubernetes.io~csi/pv/mount"),
            how: How::Csi,
        };
        let first = VolumeStats::new(csi.clone(), Duration::from_secs(10));
        first.set_pod(&pod("uid-1"), vec![source.clone()]);
        first.set_pod(&pod("uid-2"), vec![]);
        assert!(!root.path().join("pods/uid-2").join(RECORD).exists());
        let again = VolumeStats::new(csi, Duration::from_secs(10));
        again.restore();
        let state = again.lock();
        assert_eq!(state.pods.len(), 1);
        assert_eq!(state.pods["uid-1"].namespace, "ns");
        assert_eq!(state.pods["uid-1"].sources, vec![source]);
    }

    /// csi_metrics_test.go's `TestGetMetricsDriverNotSupportStats` answer
    /// (`getRawVolumeInfo`: bytes available 10, total 10, used 2; inodes 100, 100, 20)
    /// maps as upstream's `NodeGetVolumeStats` client maps it (Available, Capacity, Used,
    /// InodesFree, Inodes, InodesUsed).
    #[test]
    fn usages_map_as_upstreams_client_maps_them() {
        let usage = |unit: Unit, available, total, used| VolumeUsage {
            available,
            total,
            used,
            unit: unit as i32,
        };
        assert_eq!(
            usage_of(&[
                usage(Unit::Bytes, 10, 10, 2),
                usage(Unit::Inodes, 100, 100, 20),
                usage(Unit::Unknown, 1, 1, 1),
            ]),
            // capacity, available, used, inodes, inodes free, inodes used
            [10, 10, 2, 100, 100, 20]
        );
        // Only bytes: inodes stay 0 (upstream starts every quantity at 0).
        assert_eq!(
            usage_of(&[usage(Unit::Bytes, 1, 3, -1)]),
            [3, 1, 0, 0, 0, 0]
        );
    }

    #[test]
    fn claimed_csi_and_local_volumes_have_stats_and_host_paths_do_not() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "claim-1"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "local", "persistentVolumeClaim": {"claimName": "claim-2"}},
                {"name": "host", "persistentVolumeClaim": {"claimName": "claim-3"}},
                {"name": "inline", "csi": {"driver": "d"}},
                {"name": "cache", "emptyDir": {}}
            ]}
        }))
        .unwrap();
        let claimed: BTreeMap<String, (String, PathBuf)> = [
            ("data", "kubernetes.io/csi:d", "/a"),
            ("scratch", "kubernetes.io/csi:d", "/b"),
            ("local", "kubernetes.io/local-volume", "/c"),
            ("host", "kubernetes.io/host-path", "/d"),
        ]
        .into_iter()
        .map(|(n, p, path)| (n.to_string(), (p.to_string(), PathBuf::from(path))))
        .collect();
        let inline = BTreeMap::from([("inline".to_string(), PathBuf::from("/e"))]);
        let got: Vec<(String, Option<String>, How)> = sources(&pod, &claimed, &inline)
            .into_iter()
            .map(|s| (s.name, s.claim, s.how))
            .collect();
        let s = |x: &str| x.to_string();
        assert_eq!(
            got,
            vec![
                (s("data"), Some(s("claim-1")), How::Csi),
                (s("inline"), None, How::Csi),
                (s("local"), Some(s("claim-2")), How::StatFs),
                // Upstream's ephemeral.VolumeClaimName: <pod>-<volume>.
                (s("scratch"), Some(s("p-scratch")), How::Csi),
            ]
        );
    }
}
