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

pub mod checkpoint;
pub mod plugins;
#[cfg(test)]
mod tests;

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

    /// The pod's admission (upstream's `Allocate` for its init containers, then its
    /// containers): `Err` in upstream's words when a container's devices cannot be had;
    /// nothing of the pod is then kept. `active`: the pods whose devices stay taken
    /// (`None` until every source has listed its pods: nothing is freed).
    pub async fn admit(&self, pod: &Pod, active: Option<&BTreeSet<String>>) -> Result<(), String> {
        let spec = pod.spec.as_ref();
        let wants = spec
            .into_iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .any(|c| !self.requests(c).is_empty());
        if !wants {
            return Ok(());
        }
        let _one_at_a_time = self.allocating.lock().await;
        if let Some(active) = active {
            self.release_inactive(active);
        }
        let uid = nodeagent_proto::k8s::pod_uid(pod).to_string();
        let had = self.lock().pods.get(&uid).cloned();
        let result = self.allocate_pod(&uid, pod).await;
        let mut st = self.lock();
        if result.is_err() {
            match had {
                Some(h) => st.pods.insert(uid, h),
                None => st.pods.remove(&uid),
            };
        } else if st.pods.get(&uid) != had.as_ref() {
            // Written only when the pod's devices changed (a pod admitted again keeps
            // what it had, and the file is not rewritten for it).
            self.save(&st);
        }
        result
    }

    /// The container's limits of resources a plugin serves, by name.
    fn requests(&self, c: &Container) -> Vec<(String, usize)> {
        let st = self.lock();
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .into_iter()
            .flatten()
            .filter(|(name, _)| st.is_plugin_resource(name))
            .map(|(name, q)| {
                let n = nodeagent_config::quantity::bytes(&q.0).map_or(0, |v| v.max(0) as usize);
                (name.clone(), n)
            })
            .collect()
    }

    async fn allocate_pod(&self, uid: &str, pod: &Pod) -> Result<(), String> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        // upstream's devicesToReuse: a non-restartable init container's devices go to the
        // containers after it; a sidecar's stay its own.
        let mut reuse: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for c in spec.init_containers.iter().flatten() {
            let got = self.allocate_container(uid, c, &reuse).await?;
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            for (resource, ids) in got {
                let set = reuse.entry(resource).or_default();
                if sidecar {
                    set.retain(|id| !ids.contains(id));
                } else {
                    set.extend(ids);
                }
            }
        }
        for c in &spec.containers {
            let got = self.allocate_container(uid, c, &reuse).await?;
            for (resource, ids) in got {
                if let Some(set) = reuse.get_mut(&resource) {
                    set.retain(|id| !ids.contains(id));
                }
            }
        }
        Ok(())
    }

    /// upstream's `allocateContainerResources`: the container's devices of each resource
    /// (those it has already, or new ones, which its plugin's `Allocate` prepares).
    async fn allocate_container(
        &self,
        uid: &str,
        c: &Container,
        reuse: &BTreeMap<String, BTreeSet<String>>,
    ) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
        let mut got = BTreeMap::new();
        for (resource, needed) in self.requests(c) {
            let empty = BTreeSet::new();
            let reusable = reuse.get(&resource).unwrap_or(&empty);
            let (existing, healthy, in_use, endpoint) = {
                let st = self.lock();
                let existing = st
                    .pods
                    .get(uid)
                    .and_then(|cs| cs.get(&c.name))
                    .and_then(|rs| rs.get(&resource))
                    .map(Allocation::devices);
                let endpoint = st
                    .endpoints
                    .get(&resource)
                    .map(|e| (e.client.clone(), e.options));
                (
                    existing,
                    st.healthy.get(&resource).cloned(),
                    st.in_use(&resource),
                    endpoint,
                )
            };
            let preferred_client = endpoint
                .as_ref()
                .filter(|(_, o)| o.get_preferred_allocation_available)
                .and_then(|(client, _)| client.clone());
            let choice = Choice {
                resource: &resource,
                needed,
                existing: existing.as_ref(),
                healthy: healthy.as_ref(),
                in_use: &in_use,
                reusable,
            };
            let chosen = match choice.start()? {
                Chosen::Already(ids) => {
                    got.insert(resource, ids);
                    continue;
                }
                Chosen::Done(ids) => ids,
                Chosen::Ask {
                    allocated,
                    available,
                } => {
                    let preferred = match preferred_client {
                        Some(client) => {
                            self.preferred(client, &available, &allocated, needed)
                                .await?
                        }
                        None => Vec::new(),
                    };
                    choice.finish(allocated, &available, &preferred)?
                }
            };
            let Some((Some(mut client), _)) = endpoint else {
                return Err(format!("unknown Device Plugin {resource}"));
            };
            let devs: Vec<String> = chosen.iter().cloned().collect();
            tracing::info!(resource = %resource, k8s.container.name = %c.name, devices = ?devs, "allocating devices");
            let started = Instant::now();
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest { devices_ids: devs }],
            };
            let response = self.call("Allocate", client.allocate(request)).await;
            nodeagent_telemetry::metrics::kubelet::DEVICE_PLUGIN_ALLOC_DURATION
                .get_or_create(&vec![("resource_name", resource.clone())])
                .observe(nodeagent_telemetry::metrics::seconds_since(started));
            let response = response?;
            let Some(first) = response.container_responses.first().cloned() else {
                return Err(format!(
                    "no containers return in allocation response {response:?}"
                ));
            };
            let mut st = self.lock();
            let mut ids = DevicesPerNuma::new();
            for id in &chosen {
                for node in st.numa_of(&resource, id) {
                    ids.entry(node).or_default().push(id.clone());
                }
            }
            st.pods
                .entry(uid.to_string())
                .or_default()
                .entry(c.name.clone())
                .or_default()
                .insert(
                    resource.clone(),
                    Allocation {
                        ids,
                        response: first,
                    },
                );
            got.insert(resource, chosen);
        }
        Ok(got)
    }

    /// A call to a plugin, within [`DeviceManager::call_timeout`], its error as upstream's
    /// gRPC client prints one.
    async fn call<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(e)) => Err(format!(
                "rpc error: code = {:?} desc = {}",
                e.code(),
                e.message()
            )),
            Err(_) => Err(format!(
                "rpc error: code = DeadlineExceeded desc = the device plugin did not answer {what} within {:?}",
                self.call_timeout
            )),
        }
    }

    /// upstream's `callGetPreferredAllocationIfAvailable`'s call.
    async fn preferred(
        &self,
        mut client: DevicePluginClient<Channel>,
        available: &BTreeSet<String>,
        must_include: &BTreeSet<String>,
        size: usize,
    ) -> Result<Vec<String>, String> {
        let request = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.union(must_include).cloned().collect(),
                must_include_device_i_ds: must_include.iter().cloned().collect(),
                allocation_size: size as i32,
            }],
        };
        let response = self
            .call(
                "GetPreferredAllocation",
                client.get_preferred_allocation(request),
            )
            .await
            .map_err(|e| {
                format!("device plugin GetPreferredAllocation rpc failed with err: {e}")
            })?;
        Ok(response
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default())
    }

    /// upstream's `callPreStartContainerIfNeeded`, for each resource of the container whose
    /// plugin asked for it.
    pub async fn pre_start(&self, uid: &str, container: &str) -> Result<(), String> {
        let calls: Vec<(String, Option<DevicePluginClient<Channel>>, Vec<String>)> = {
            let st = self.lock();
            let Some(resources) = st.pods.get(uid).and_then(|cs| cs.get(container)) else {
                return Ok(());
            };
            resources
                .iter()
                .filter_map(|(r, a)| {
                    let ep = st.endpoints.get(r)?;
                    ep.options.pre_start_required.then(|| {
                        (
                            r.clone(),
                            ep.client.clone(),
                            a.devices().into_iter().collect(),
                        )
                    })
                })
                .collect()
        };
        for (resource, client, devices_ids) in calls {
            let Some(mut client) = client else {
                return Err(format!(
                    "device plugin PreStartContainer rpc failed with err: the plugin of {resource} is not registered"
                ));
            };
            let request = PreStartContainerRequest { devices_ids };
            self.call("PreStartContainer", client.pre_start_container(request))
                .await
                .map_err(|e| format!("device plugin PreStartContainer rpc failed with err: {e}"))?;
        }
        Ok(())
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

/// upstream's `devicesToAllocate`, without the plugin calls: which devices a container
/// gets of one resource.
struct Choice<'a> {
    resource: &'a str,
    needed: usize,
    existing: Option<&'a BTreeSet<String>>,
    healthy: Option<&'a BTreeSet<String>>,
    in_use: &'a BTreeSet<String>,
    reusable: &'a BTreeSet<String>,
}

#[derive(Debug, PartialEq)]
enum Chosen {
    /// The container has its devices already (a container that restarts).
    Already(BTreeSet<String>),
    /// All from the devices an init container left.
    Done(BTreeSet<String>),
    /// Those taken so far, and the free ones the rest come from (after the plugin's
    /// preference, when it has one).
    Ask {
        allocated: BTreeSet<String>,
        available: BTreeSet<String>,
    },
}

impl Choice<'_> {
    fn start(&self) -> Result<Chosen, String> {
        let resource = self.resource;
        if let Some(existing) = self.existing
            && existing.len() != self.needed
        {
            return Err(format!(
                "container changed request for resource {resource:?} from {} to {}",
                existing.len(),
                self.needed
            ));
        }
        let Some(healthy) = self.healthy else {
            return Err(format!("cannot allocate unregistered device {resource}"));
        };
        if healthy.is_empty() {
            return Err(format!(
                "no healthy devices present; cannot allocate unhealthy devices {resource}"
            ));
        }
        if let Some(existing) = self.existing {
            if !existing.is_subset(healthy) {
                return Err(format!(
                    "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
                ));
            }
            return Ok(Chosen::Already(existing.clone()));
        }
        let mut allocated = BTreeSet::new();
        for id in self.reusable {
            if allocated.len() == self.needed {
                break;
            }
            allocated.insert(id.clone());
        }
        if allocated.len() == self.needed {
            return Ok(Chosen::Done(allocated));
        }
        let available: BTreeSet<String> = healthy.difference(self.in_use).cloned().collect();
        let still = self.needed - allocated.len();
        if available.len() < still {
            return Err(format!(
                "requested number of devices unavailable for {resource}. Requested: {still}, Available: {}",
                available.len()
            ));
        }
        Ok(Chosen::Ask {
            allocated,
            available,
        })
    }

    /// The rest from the plugin's preference (those of it that are free), then from the
    /// free devices in order.
    fn finish(
        &self,
        mut allocated: BTreeSet<String>,
        available: &BTreeSet<String>,
        preferred: &[String],
    ) -> Result<BTreeSet<String>, String> {
        let candidates = preferred
            .iter()
            .filter(|id| available.contains(*id))
            .chain(available.iter());
        for id in candidates {
            if allocated.len() == self.needed {
                break;
            }
            allocated.insert(id.clone());
        }
        if allocated.len() < self.needed {
            return Err(format!(
                "unexpectedly allocated less resources than required. Requested: {}, Got: {}",
                self.needed,
                allocated.len()
            ));
        }
        Ok(allocated)
    }
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
