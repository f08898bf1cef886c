//! A pod's devices at its admission (upstream's `Allocate`, with `GetPreferredAllocation`
//! first when the plugin offers it) and before each of its containers starts
//! (`PreStartContainer`).

use super::choice::{Choice, Chosen};
use super::*;

impl DeviceManager {
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
}
