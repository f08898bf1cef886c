//! The device manager (upstream's `pkg/kubelet/cm/devicemanager`): device plugins register
//! on `<root-dir>/device-plugins/kubelet.sock`, list their devices and their health over
//! `ListAndWatch`, and the node's capacity and allocatable of each extended resource
//! follow (a plugin that goes away leaves its devices unhealthy: allocatable drops to zero
//! at once, capacity after upstream's five minutes). At a pod's admission, each container
//! that asks for an extended resource a plugin serves gets devices of its own (the
//! plugin's `GetPreferredAllocation` first when it offers one, and its `Allocate` answer
//! kept); the answer's devices, mounts, environment, annotations and CDI names go into the
//! container's CRI config. Assignments are upstream's checkpoint file, written at every
//! change and read at start, so that no restart gives a device twice or takes one from a
//! running pod.

mod allocate;
pub mod checkpoint;
mod choice;
pub mod plugins;
#[cfg(test)]
mod tests;
#[cfg(test)]
use choice::{Choice, Chosen};

use checkpoint::{Checkpoint, Data, DevicesPerNuma, Entry};
use k8s_openapi::api::core::v1::{Container, Pod};
use nodeagent_proto::deviceplugin::device_plugin_client::DevicePluginClient;
use nodeagent_proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, Device, DevicePluginOptions, PreStartContainerRequest,
    PreferredAllocationRequest,
};
use nodeagent_proto::podresources::{ContainerDevices, NumaNode, TopologyInfo};
use nodeagent_transport::Channel;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// upstream's `endpointStopGracePeriod`: how long a resource whose plugin went away keeps
/// its capacity (its devices unhealthy) before it is dropped from the node.
pub const STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

/// upstream's `pluginapi.Healthy`.
pub const HEALTHY: &str = "Healthy";

/// The NUMA node of a device without topology, in the checkpoint.
const NO_TOPOLOGY: i64 = -1;

/// The device plugins' directory under the root directory (upstream's
/// `/var/lib/kubelet/device-plugins`).
pub fn dir(root_dir: &Path) -> PathBuf {
    root_dir.join("device-plugins")
}

/// A registered plugin, or one that is gone (or only known from the checkpoint).
struct Endpoint {
    /// `None`: stopped.
    client: Option<DevicePluginClient<Channel>>,
    options: DevicePluginOptions,
    stopped_at: Option<Instant>,
    /// Which registration this is, so a stream that ends late does not stop a newer one.
    generation: u64,
}

/// What a container was given of one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub ids: DevicesPerNuma,
    pub response: ContainerAllocateResponse,
}

impl Allocation {
    fn devices(&self) -> BTreeSet<String> {
        self.ids.values().flatten().cloned().collect()
    }
}

/// pod UID -> container -> resource -> allocation.
type PodDevices = BTreeMap<String, BTreeMap<String, BTreeMap<String, Allocation>>>;

#[derive(Default)]
struct State {
    endpoints: BTreeMap<String, Endpoint>,
    /// resource -> device ID -> device, as its plugin last listed them.
    devices: BTreeMap<String, BTreeMap<String, Device>>,
    healthy: BTreeMap<String, BTreeSet<String>>,
    unhealthy: BTreeMap<String, BTreeSet<String>>,
    pods: PodDevices,
    /// Resources dropped after their plugin's grace period: the node reports zero of them.
    retired: BTreeSet<String>,
    next_generation: u64,
}

impl State {
    fn in_use(&self, resource: &str) -> BTreeSet<String> {
        self.pods
            .values()
            .flat_map(|cs| cs.values())
            .filter_map(|rs| rs.get(resource))
            .flat_map(Allocation::devices)
            .collect()
    }

    /// upstream's `isDevicePluginResource`: a plugin registered it, or a pod holds some.
    fn is_plugin_resource(&self, resource: &str) -> bool {
        self.healthy.contains_key(resource)
            || self
                .pods
                .values()
                .flat_map(|cs| cs.values())
                .any(|rs| rs.contains_key(resource))
    }

    fn checkpoint(&self) -> Checkpoint {
        let mut entries = Vec::new();
        for (uid, containers) in &self.pods {
            for (container, resources) in containers {
                for (resource, a) in resources {
                    entries.push(Entry {
                        pod_uid: uid.clone(),
                        container: container.clone(),
                        resource: resource.clone(),
                        device_ids: Some(a.ids.clone()),
                        alloc_resp: Some(a.response.encode_to_vec()),
                    });
                }
            }
        }
        let registered = self
            .healthy
            .iter()
            .map(|(r, ids)| (r.clone(), ids.iter().cloned().collect()))
            .collect();
        Checkpoint::of(Data {
            entries: Some(entries),
            registered: Some(registered),
        })
    }

    fn numa_of(&self, resource: &str, id: &str) -> Vec<i64> {
        let nodes: Vec<i64> = self
            .devices
            .get(resource)
            .and_then(|ds| ds.get(id))
            .and_then(|d| d.topology.as_ref())
            .map(|t| t.nodes.iter().map(|n| n.id).collect())
            .unwrap_or_default();
        if nodes.is_empty() {
            vec![NO_TOPOLOGY]
        } else {
            nodes
        }
    }
}

/// What the node reports of the plugins' resources (upstream's `GetCapacity`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    pub capacity: BTreeMap<String, u64>,
    pub allocatable: BTreeMap<String, u64>,
    /// Resources no plugin serves any more: zero on the node.
    pub retired: Vec<String>,
}

/// The devices, mounts, environment, annotations and CDI names a container gets from its
/// plugins (upstream's `DeviceRunContainerOptions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOptions {
    pub envs: Vec<(String, String)>,
    pub mounts: Vec<nodeagent_proto::deviceplugin::Mount>,
    pub devices: Vec<nodeagent_proto::deviceplugin::DeviceSpec>,
    pub annotations: Vec<(String, String)>,
    pub cdi_devices: Vec<String>,
}

pub struct DeviceManager {
    dir: PathBuf,
    state: Mutex<State>,
    /// One pod's allocation at a time (upstream's kubelet admits one pod at a time).
    allocating: tokio::sync::Mutex<()>,
    /// How long a plugin has to answer `Allocate`, `GetPreferredAllocation` or
    /// `PreStartContainer`: a plugin that hangs refuses its pod (or fails its container's
    /// start) instead of holding every pod that asks for a device (upstream waits without
    /// end).
    call_timeout: Duration,
}

/// [`DeviceManager::call_timeout`].
pub const PLUGIN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl DeviceManager {
    /// upstream's `Start`: the sockets left in the directory are removed (a plugin watches
    /// its socket, and registers again when it goes), and the checkpoint is read: the pods'
    /// devices are theirs again, and every resource it names is known with no device
    /// until its plugin registers. A checkpoint that cannot be read is logged, as upstream,
    /// and the start goes on without it.
    pub fn start(root_dir: &Path) -> Result<Self, String> {
        let dir = dir(root_dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        cleanup_sockets(&dir);
        let manager = Self {
            dir,
            state: Mutex::default(),
            allocating: tokio::sync::Mutex::new(()),
            call_timeout: PLUGIN_CALL_TIMEOUT,
        };
        match manager.read_checkpoint() {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                entries = n,
                "device manager: assignments restored from the checkpoint"
            ),
            Err(e) => {
                tracing::error!(error = %e, file = checkpoint::FILE, "Continue after failing to read checkpoint file. Device allocation info may NOT be up-to-date")
            }
        }
        Ok(manager)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("kubelet.sock")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(checkpoint::FILE)
    }

    fn read_checkpoint(&self) -> Result<usize, String> {
        let bytes = match std::fs::read(self.checkpoint_path()) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e.to_string()),
        };
        let cp = Checkpoint::decode(&bytes)?;
        let mut st = self.lock();
        let entries = cp.data.entries.unwrap_or_default();
        let n = entries.len();
        for e in entries {
            let response = match &e.alloc_resp {
                Some(b) => ContainerAllocateResponse::decode(&b[..])
                    .map_err(|err| format!("entry of pod {}: {err}", e.pod_uid))?,
                None => ContainerAllocateResponse::default(),
            };
            st.pods
                .entry(e.pod_uid)
                .or_default()
                .entry(e.container)
                .or_default()
                .insert(
                    e.resource,
                    Allocation {
                        ids: e.device_ids.unwrap_or_default(),
                        response,
                    },
                );
        }
        // Until its plugin registers again, a resource has no device (and capacity zero).
        let now = Instant::now();
        for resource in cp.data.registered.unwrap_or_default().into_keys() {
            st.healthy.insert(resource.clone(), BTreeSet::new());
            st.unhealthy.insert(resource.clone(), BTreeSet::new());
            st.endpoints.insert(
                resource,
                Endpoint {
                    client: None,
                    options: DevicePluginOptions::default(),
                    stopped_at: Some(now),
                    generation: 0,
                },
            );
        }
        Ok(n)
    }

    fn save(&self, st: &State) {
        let bytes = st.checkpoint().encode();
        if let Err(e) = nodeagent_config::state::write_atomically(&self.checkpoint_path(), &bytes) {
            tracing::error!(error = %e, "Failed to write checkpoint file");
        }
    }

    /// A plugin registered (upstream's `PluginConnected`): it replaces any earlier one of
    /// the same resource. The generation names this registration.
    pub(crate) fn connected(
        &self,
        resource: &str,
        client: DevicePluginClient<Channel>,
        options: DevicePluginOptions,
    ) -> u64 {
        let mut st = self.lock();
        st.next_generation += 1;
        let generation = st.next_generation;
        st.endpoints.insert(
            resource.to_string(),
            Endpoint {
                client: Some(client),
                options,
                stopped_at: None,
                generation,
            },
        );
        st.retired.remove(resource);
        generation
    }

    /// The plugin's stream ended (upstream's `PluginDisconnected`): its devices are
    /// unhealthy until it registers again, or its grace period ends.
    pub(crate) fn disconnected(&self, resource: &str, generation: u64) {
        let mut st = self.lock();
        let Some(ep) = st.endpoints.get_mut(resource) else {
            return;
        };
        if ep.generation != generation {
            return; // a newer registration of the resource serves it now
        }
        ep.client = None;
        ep.stopped_at = Some(Instant::now());
        let healthy = std::mem::take(st.healthy.entry(resource.to_string()).or_default());
        st.unhealthy
            .entry(resource.to_string())
            .or_default()
            .extend(healthy);
        tracing::warn!(resource, "device plugin gone: its devices are unhealthy");
    }

    /// A `ListAndWatch` answer (upstream's `genericDeviceUpdateCallback`).
    pub(crate) fn listed(&self, resource: &str, generation: u64, devices: Vec<Device>) {
        let mut st = self.lock();
        if st.endpoints.get(resource).map(|e| e.generation) != Some(generation) {
            return;
        }
        let mut healthy = BTreeSet::new();
        let mut unhealthy = BTreeSet::new();
        let mut all = BTreeMap::new();
        for d in devices {
            if d.health == HEALTHY {
                healthy.insert(d.id.clone());
            } else {
                unhealthy.insert(d.id.clone());
            }
            all.insert(d.id.clone(), d);
        }
        tracing::info!(
            resource,
            total = all.len(),
            healthy = healthy.len(),
            "Processed device updates for resource"
        );
        st.healthy.insert(resource.to_string(), healthy);
        st.unhealthy.insert(resource.to_string(), unhealthy);
        st.devices.insert(resource.to_string(), all);
        self.save(&st);
    }

    /// upstream's `GetCapacity`: each resource's devices (capacity) and healthy devices
    /// (allocatable); a resource whose plugin has been gone longer than its grace period
    /// is dropped and reported retired.
    pub fn capacity(&self) -> Capacity {
        self.capacity_at(Instant::now())
    }

    fn capacity_at(&self, now: Instant) -> Capacity {
        let mut st = self.lock();
        // A set: a resource with healthy and unhealthy devices is named once.
        let expired: BTreeSet<String> = st
            .healthy
            .keys()
            .chain(st.unhealthy.keys())
            .filter(|r| match st.endpoints.get(*r) {
                None => true,
                Some(ep) => ep
                    .stopped_at
                    .is_some_and(|t| now.saturating_duration_since(t) >= STOP_GRACE_PERIOD),
            })
            .cloned()
            .collect();
        for r in &expired {
            st.endpoints.remove(r);
            st.healthy.remove(r);
            st.unhealthy.remove(r);
            st.devices.remove(r);
            st.retired.insert(r.clone());
        }
        if !expired.is_empty() {
            tracing::info!(resources = ?expired, "device plugin resources dropped after their grace period");
            self.save(&st);
        }
        let mut out = Capacity::default();
        for (r, ids) in &st.healthy {
            out.capacity.insert(r.clone(), ids.len() as u64);
            out.allocatable.insert(r.clone(), ids.len() as u64);
        }
        for (r, ids) in &st.unhealthy {
            *out.capacity.entry(r.clone()).or_default() += ids.len() as u64;
            out.allocatable.entry(r.clone()).or_default();
        }
        out.retired = st.retired.iter().cloned().collect();
        out
    }

    /// upstream's `UpdateAllocatedDevices`: the devices of pods no longer active are free
    /// again. Only called once every source has listed its pods.
    pub fn release_inactive(&self, active: &BTreeSet<String>) -> Vec<String> {
        let mut st = self.lock();
        let gone: Vec<String> = st
            .pods
            .keys()
            .filter(|uid| !active.contains(*uid))
            .cloned()
            .collect();
        for uid in &gone {
            st.pods.remove(uid);
        }
        if !gone.is_empty() {
            self.save(&st);
        }
        gone
    }

    /// upstream's `deviceRunContainerOptions`: what each of the container's allocations
    /// asks for, merged (an environment variable, mount, device or annotation named twice
    /// is given once, the first).
    pub fn run_options(&self, uid: &str, container: &str) -> Option<RunOptions> {
        let st = self.lock();
        let resources = st.pods.get(uid)?.get(container)?;
        let mut out = RunOptions::default();
        let mut envs = BTreeMap::new();
        let mut annotations = BTreeMap::new();
        for a in resources.values() {
            let r = &a.response;
            for (k, v) in &r.envs {
                envs.entry(k.clone()).or_insert_with(|| v.clone());
            }
            for (k, v) in &r.annotations {
                annotations.entry(k.clone()).or_insert_with(|| v.clone());
            }
            for m in &r.mounts {
                if !out
                    .mounts
                    .iter()
                    .any(|o| o.container_path == m.container_path)
                {
                    out.mounts.push(m.clone());
                }
            }
            for d in &r.devices {
                if !out.devices.iter().any(|o| o.host_path == d.host_path) {
                    out.devices.push(d.clone());
                }
            }
            for cdi in &r.cdi_devices {
                if !out.cdi_devices.contains(&cdi.name) {
                    out.cdi_devices.push(cdi.name.clone());
                }
            }
        }
        out.envs = envs.into_iter().collect();
        out.annotations = annotations.into_iter().collect();
        Some(out)
    }

    /// The container's devices for the pod-resources API: one entry per device (and per
    /// NUMA node of it), as upstream's `containerDevicesFromResourceDeviceInstances`.
    pub fn container_devices(&self, uid: &str, container: &str) -> Vec<ContainerDevices> {
        let st = self.lock();
        let Some(resources) = st.pods.get(uid).and_then(|cs| cs.get(container)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (resource, a) in resources {
            let mut per_device: BTreeMap<&String, Vec<i64>> = BTreeMap::new();
            for (node, ids) in &a.ids {
                for id in ids {
                    per_device.entry(id).or_default().push(*node);
                }
            }
            for (id, nodes) in per_device {
                out.extend(device_entries(resource, id, &nodes));
            }
        }
        out
    }

    /// The healthy devices, for `GetAllocatableResources`.
    pub fn allocatable_devices(&self) -> Vec<ContainerDevices> {
        let st = self.lock();
        let mut out = Vec::new();
        for (resource, ids) in &st.healthy {
            for id in ids {
                out.extend(device_entries(resource, id, &st.numa_of(resource, id)));
            }
        }
        out
    }
}

fn device_entries(resource: &str, id: &str, nodes: &[i64]) -> Vec<ContainerDevices> {
    nodes
        .iter()
        .map(|n| ContainerDevices {
            resource_name: resource.to_string(),
            device_ids: vec![id.to_string()],
            topology: (*n != NO_TOPOLOGY).then(|| TopologyInfo {
                nodes: vec![NumaNode { id: *n }],
            }),
        })
        .collect()
}

/// upstream's `CleanupPluginDirectory`: every socket in the directory goes (the
/// checkpoint, directories and other files stay).
fn cleanup_sockets(dir: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_socket())
            && let Err(err) = std::fs::remove_file(e.path())
        {
            tracing::error!(path = %e.path().display(), error = %err, "Failed to remove file");
        }
    }
}

/// upstream's `UpdateAllocatedDevices`, also run on its own: the devices of pods that are
/// no longer active go back, once every source has listed its pods.
pub mod release {
    use crate::PodSync;
    use std::sync::Arc;
    use std::time::Duration;

    const PERIOD: Duration = Duration::from_secs(10);

    pub async fn run(sync: Arc<PodSync>) {
        let mut tick = tokio::time::interval(PERIOD);
        loop {
            tokio::select! {
                _ = sync.shutdown.wait() => return,
                _ = tick.tick() => {
                    let Some(active) = sync.lock().active_uids() else { continue };
                    for uid in sync.device_manager.release_inactive(&active) {
                        tracing::info!(k8s.pod.uid = %uid, "device manager: the pod's devices are free again");
                    }
                }
            }
        }
    }
}
