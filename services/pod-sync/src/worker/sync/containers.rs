//! One container's life inside a sync: its start (with subPaths, hooks and the non-root
//! check), its restart after the crash-loop back-off, and the replacement of one that a
//! probe killed.

use super::*;

impl PodSync {
    /// runAsNonRoot (upstream `verifyRunAsNonRoot`), from runAsUser or else the image's
    /// user as the runtime reports it.
    pub(crate) async fn verify_non_root(&self, pod: &Pod, c: &Container) -> Result<(), String> {
        let (mut uid, mut user) = (None, String::new());
        if crate::runtime_spec::security::needs_image_user(pod, c) {
            let mut images = self.cri.image.clone();
            let image = images
                .image_status(self.cri.request(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: c.image.clone().unwrap_or_default(),
                        ..Default::default()
                    }),
                    verbose: false,
                }))
                .await
                .map_err(|e| format!("cannot read the image's user: {}", e.message()))?
                .into_inner()
                .image
                .ok_or_else(|| "cannot read the image's user: image not found".to_string())?;
            uid = image.uid.map(|v| v.value);
            user = image.username;
        }
        crate::runtime_spec::security::verify_run_as_non_root(pod, c, uid, &user)
    }

    /// Restarts an exited container once its crash-loop back-off has passed; returns how
    /// long is left otherwise.
    pub(crate) async fn restart_after_backoff(
        self: &Arc<Self>,
        pod: &Pod,
        c: &Container,
        exited: &RuntimeContainer,
        sandbox_id: &str,
        pod_ip: &str,
        volumes: &HashMap<String, String>,
    ) -> anyhow::Result<Option<Duration>> {
        let uid = k8s::pod_uid(pod);
        let ran_for = Duration::from_nanos(
            (exited.finished_at_unix_nanos - exited.started_at_unix_nanos).max(0) as u64,
        );
        let restarts = exited.attempt.saturating_sub(exited.backoff_base);
        let backoff = crash_backoff(restarts, ran_for);
        let since_exit = Duration::from_nanos(
            (crate::worker::workers::now_nanos() - exited.finished_at_unix_nanos).max(0) as u64,
        );
        if since_exit < backoff {
            let left = backoff - since_exit;
            self.events.container(
                pod,
                &c.name,
                EventType::Warning,
                "BackOff",
                &format!(
                    "Back-off restarting failed container {} in pod {}({uid})",
                    c.name,
                    k8s::pod_full_name(pod)
                ),
            );
            self.set_waiting(
                uid,
                &c.name,
                "CrashLoopBackOff",
                &format!(
                    "back-off {} restarting failed container={} pod={}({uid})",
                    go_duration(backoff),
                    c.name,
                    k8s::pod_full_name(pod)
                ),
            );
            return Ok(Some(left));
        }
        let base = next_backoff_base(exited.attempt, exited.backoff_base, ran_for);
        let started = self
            .start_container(
                pod,
                c,
                (exited.attempt + 1, base),
                sandbox_id,
                pod_ip,
                volumes,
            )
            .await?;
        // Keep only the newest dead instance (it is the lastState); older ones go.
        self.remove_dead_except(uid, &c.name, &exited.id).await;
        Ok(started)
    }

    /// Starts the next instance of a container this sync has just killed for a changed
    /// spec, at once and whatever the restart policy: upstream starts it in the same
    /// SyncPod, and its back-off key (which includes the spec hash) is new. Older dead
    /// instances go.
    pub(crate) async fn replace_killed(
        self: &Arc<Self>,
        pod: &Pod,
        c: &Container,
        killed: &RuntimeContainer,
        (sandbox_id, pod_ip, volumes): (&str, &str, &HashMap<String, String>),
    ) -> anyhow::Result<Option<Duration>> {
        let ran_for = Duration::from_nanos(
            (crate::worker::workers::now_nanos() - killed.started_at_unix_nanos).max(0) as u64,
        );
        let base = next_backoff_base(killed.attempt, killed.backoff_base, ran_for);
        let attempt = (killed.attempt + 1, base);
        let started = self
            .start_container(pod, c, attempt, sandbox_id, pod_ip, volumes)
            .await?;
        self.remove_dead_except(k8s::pod_uid(pod), &c.name, &killed.id)
            .await;
        Ok(started)
    }

    /// Pulls if needed, creates and starts one container. Returns a retry delay when it
    /// could not (the reason is recorded as the container's waiting state).
    pub(crate) async fn start_container(
        self: &Arc<Self>,
        pod: &Pod,
        c: &Container,
        attempt: (u32, u32),
        sandbox_id: &str,
        pod_ip: &str,
        volumes: &HashMap<String, String>,
    ) -> anyhow::Result<Option<Duration>> {
        self.create_and_start(pod, c, attempt, (sandbox_id, pod_ip, volumes), None)
            .await
    }

    /// `start_container`, for an ephemeral container with a `targetContainerName`: in the
    /// PID namespace of that container (`pid_target`, its id), as upstream's
    /// `getTargetID` and `NamespaceMode_TARGET`.
    pub(crate) async fn create_and_start(
        self: &Arc<Self>,
        pod: &Pod,
        c: &Container,
        (attempt, backoff_base): (u32, u32),
        (sandbox_id, pod_ip, volumes): (&str, &str, &HashMap<String, String>),
        pid_target: Option<&str>,
    ) -> anyhow::Result<Option<Duration>> {
        let uid = k8s::pod_uid(pod).to_string();
        if let Err((reason, message, retry)) = self.ensure_image(pod, c).await {
            tracing::warn!(k8s.container.name = %c.name, %reason, %message, "image not available");
            self.set_waiting(&uid, &c.name, reason, &message);
            // Upstream's "Error: ErrImagePull" (the error's reason, after the pull's own
            // event).
            self.failed(pod, c, reason);
            return Ok(Some(retry));
        }
        if let Err(message) = self.verify_non_root(pod, c).await {
            tracing::warn!(k8s.container.name = %c.name, %message, "CreateContainerConfigError");
            self.config_error(pod, c, &message);
            return Ok(Some(Duration::from_secs(10)));
        }
        let env_refs = match self.env_refs(pod, c).await {
            Ok(refs) => refs,
            Err(message) => {
                self.config_error(pod, c, &message);
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        let sub_paths = match self.prepare_sub_paths(pod, c, pod_ip, &env_refs).await {
            Ok(paths) => paths,
            Err(message) => {
                tracing::warn!(k8s.container.name = %c.name, %message, "subPath refused");
                self.config_error(pod, c, &message);
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        let mut config = match runtime_spec::container_config(ContainerInputs {
            pod,
            container: c,
            attempt,
            backoff_base,
            volumes,
            pod_ip,
            node: &self.node,
            env_refs: &env_refs,
        })
        .and_then(|mut cfg| {
            runtime_spec::set_sub_path_mounts(&mut cfg, c, &sub_paths).map(|()| cfg)
        }) {
            Ok(cfg) => cfg,
            Err(message) => {
                self.config_error(pod, c, &message);
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        if let Some(target) = pid_target {
            runtime_spec::target_pid_namespace(&mut config, target);
        }
        // upstream's PreCreateContainer: the CPU manager's cpuset (the container's own
        // CPUs, or the shared set), under the static policy.
        let cpuset = self.cpu_manager.cpuset(&uid, &c.name);
        if let (Some(cpus), Some(resources)) = (
            &cpuset,
            config.linux.as_mut().and_then(|l| l.resources.as_mut()),
        ) {
            resources.cpuset_cpus = cpus.clone();
        }
        // upstream's GetDeviceRunContainerOptions: the plugins' PreStartContainer (for
        // those that ask for it), then what their Allocate answers give the container.
        if let Err(message) = self.device_manager.pre_start(&uid, &c.name).await {
            tracing::warn!(k8s.container.name = %c.name, %message, "PreStartContainer failed");
            self.config_error(pod, c, &message);
            return Ok(Some(Duration::from_secs(10)));
        }
        if let Some(devices) = self.device_manager.run_options(&uid, &c.name) {
            apply_device_options(&mut config, devices);
        }
        let sandbox_config = runtime_spec::sandbox_config(pod, 0, &self.node);
        let mut runtime = self.cri.runtime.clone();
        let created = runtime
            .create_container(self.cri.request(CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_string(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            }))
            .await;
        self.acted(&uid);
        let id = match created {
            Ok(r) => {
                let id = r.into_inner().container_id;
                if let Some(cpus) = &cpuset {
                    self.cpu_manager.applied(&id, cpus);
                }
                id
            }
            Err(e) => {
                tracing::warn!(k8s.container.name = %c.name, error = %e.message(), "CreateContainer failed");
                self.set_waiting(&uid, &c.name, "CreateContainerError", e.message());
                self.failed(pod, c, e.message());
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        self.events.container(
            pod,
            &c.name,
            EventType::Normal,
            "Created",
            &format!("Created container: {}", c.name),
        );
        if self.start_created(pod, c, &id).await {
            self.post_start(pod, c, &id).await;
        }
        Ok(None)
    }

    /// Runs the postStart hook; a failed hook kills the container (upstream
    /// `FailedPostStartHook`), and the restart policy decides what follows.
    pub(crate) async fn post_start(&self, pod: &Pod, c: &Container, id: &str) {
        let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return;
        };
        let timeout = Duration::from_secs(grace_seconds(pod).max(2) as u64);
        if let Err(e) = self.run_hook(pod, c, id, hook, timeout).await {
            tracing::warn!(k8s.container.name = %c.name, error = %e, "FailedPostStartHook");
            // Upstream: without the hook's output, so no secret leaks into an event.
            self.events.container(
                pod,
                &c.name,
                EventType::Warning,
                "FailedPostStartHook",
                POST_START_HOOK_FAILED,
            );
            // Upstream's Killing message for this kill is the reason itself.
            let grace = grace_seconds(pod);
            self.kill_container(Some(pod), &c.name, id, grace, Some("FailedPostStartHook"))
                .await;
            self.acted(k8s::pod_uid(pod));
        }
    }

    /// Starts a created container; true when it started.
    pub(crate) async fn start_created(&self, pod: &Pod, c: &Container, id: &str) -> bool {
        let uid = k8s::pod_uid(pod);
        let mut runtime = self.cri.runtime.clone();
        let started = runtime
            .start_container(self.cri.request(StartContainerRequest {
                container_id: id.to_string(),
            }))
            .await;
        self.acted(uid);
        match started {
            Ok(_) => {
                tracing::info!(k8s.container.name = %c.name, container.id = %id, "container started");
                self.clear_waiting(uid, &c.name);
                self.events.container(
                    pod,
                    &c.name,
                    EventType::Normal,
                    "Started",
                    &format!("Started container {}", c.name),
                );
                true
            }
            Err(e) => {
                tracing::warn!(k8s.container.name = %c.name, error = %e.message(), "StartContainer failed");
                self.set_waiting(uid, &c.name, "RunContainerError", e.message());
                self.failed(pod, c, e.message());
                false
            }
        }
    }

    /// What init_plan needs to know of an init container's newest instance in the
    /// current sandbox.
    pub(crate) fn init_view(&self, c: &Container, latest: Option<&RuntimeContainer>) -> InitView {
        let st = self.lock();
        let probes = plan::ProbeResults {
            unhealthy: Some(&st.liveness_failed),
            started: Some(&st.started),
        };
        plan::init_view(c, latest, probes)
    }

    /// Has the volume service resolve and bind-mount the container's subPaths (it runs in
    /// the host mount namespace and never follows a symlink out of a volume); returns mount
    /// index -> host path.
    pub(crate) async fn prepare_sub_paths(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ip: &str,
        env_refs: &runtime_spec::EnvRefs,
    ) -> Result<HashMap<u32, String>, String> {
        let env = runtime_spec::container_env(pod, c, &self.node, pod_ip, env_refs)?;
        let mounts = runtime_spec::sub_path_mounts(c, &env)?;
        if mounts.is_empty() {
            return Ok(HashMap::new());
        }
        let mut volume = self.volume.clone();
        volume
            .prepare_sub_paths(PrepareSubPathsRequest {
                pod_json: k8s::encode_pod(pod),
                container_name: c.name.clone(),
                mounts,
                trace: nodeagent_telemetry::current_trace_context(),
            })
            .await
            .map(|r| r.into_inner().host_paths.into_iter().collect())
            .map_err(|e| {
                format!(
                    "failed to prepare subPath for container {:?}: {}",
                    c.name,
                    e.message()
                )
            })
    }
}

/// The container's devices from its plugins' `Allocate` answers, as upstream's kuberuntime
/// puts them in the CRI config: the devices, the mounts, the environment before the
/// container's own (which wins over it), the annotations under the kubelet's own, and the
/// CDI names.
fn apply_device_options(
    config: &mut nodeagent_proto::cri::ContainerConfig,
    o: crate::container_manager::device_manager::RunOptions,
) {
    use nodeagent_proto::cri::{CdiDevice, Device, KeyValue, Mount};
    config.devices.extend(o.devices.into_iter().map(|d| Device {
        container_path: d.container_path,
        host_path: d.host_path,
        permissions: d.permissions,
    }));
    config.mounts.extend(o.mounts.into_iter().map(|m| Mount {
        container_path: m.container_path,
        host_path: m.host_path,
        readonly: m.read_only,
        ..Default::default()
    }));
    let own = std::mem::take(&mut config.envs);
    config.envs = o
        .envs
        .into_iter()
        .map(|(key, value)| KeyValue { key, value })
        .chain(own)
        .collect();
    for (k, v) in o.annotations {
        config.annotations.entry(k).or_insert(v);
    }
    config
        .cdi_devices
        .extend(o.cdi_devices.into_iter().map(|name| CdiDevice { name }));
}

#[cfg(test)]
mod device_option_tests {
    use super::apply_device_options;
    use crate::container_manager::device_manager::RunOptions;
    use nodeagent_proto::cri::{ContainerConfig, KeyValue};
    use nodeagent_proto::deviceplugin::{DeviceSpec, Mount};

    /// upstream's kuberuntime with a device plugin's options: the plugin's environment
    /// comes before the container's own (`GenerateRunContainerOptions` appends the
    /// container's after it, so the container's wins in the runtime), the kubelet's
    /// annotations win over the plugin's (`newContainerAnnotations` sets them after), the
    /// CDI names go in CRI's `CDI_devices` (containerd 1.7 and later act on them).
    #[test]
    fn a_plugins_answer_in_the_cri_config() {
        let mut config = ContainerConfig {
            envs: vec![KeyValue {
                key: "DEV".into(),
                value: "mine".into(),
            }],
            annotations: [("io.kubernetes.container.hash".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        apply_device_options(
            &mut config,
            RunOptions {
                envs: vec![("DEV".into(), "theirs".into()), ("ONLY".into(), "x".into())],
                mounts: vec![Mount {
                    container_path: "/lib/x".into(),
                    host_path: "/opt/x".into(),
                    read_only: true,
                }],
                devices: vec![DeviceSpec {
                    container_path: "/dev/x0".into(),
                    host_path: "/dev/x0".into(),
                    permissions: "rw".into(),
                }],
                annotations: vec![
                    ("io.kubernetes.container.hash".into(), "bad".into()),
                    ("vendor.com/x".into(), "x0".into()),
                ],
                cdi_devices: vec!["vendor.com/x=x0".into()],
            },
        );
        let envs: Vec<(&str, &str)> = config
            .envs
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(envs, [("DEV", "theirs"), ("ONLY", "x"), ("DEV", "mine")]);
        assert_eq!(config.annotations["io.kubernetes.container.hash"], "1");
        assert_eq!(config.annotations["vendor.com/x"], "x0");
        assert_eq!(config.devices[0].host_path, "/dev/x0");
        assert_eq!(config.devices[0].permissions, "rw");
        assert!(config.mounts[0].readonly);
        assert_eq!(config.cdi_devices[0].name, "vendor.com/x=x0");
    }
}
