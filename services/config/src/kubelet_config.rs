//! `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`): the fields the node agent
//! honours, with upstream names and defaults. Fields we do not implement are accepted and
//! reported once at start-up, so that a user's existing file loads.

use crate::duration::serde_go;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletConfiguration {
    pub api_version: String,
    pub kind: String,
    /// Directory (or single file) of static pod manifests.
    pub static_pod_path: Option<PathBuf>,
    #[serde(with = "serde_go")]
    pub sync_frequency: Duration,
    #[serde(with = "serde_go")]
    pub file_check_frequency: Duration,
    #[serde(with = "serde_go")]
    pub http_check_frequency: Duration,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    pub address: String,
    pub port: u16,
    /// 0 disables the read-only port (the upstream default).
    pub read_only_port: u16,
    /// 0 disables the healthz endpoint.
    pub healthz_port: u16,
    pub healthz_bind_address: String,
    pub container_runtime_endpoint: String,
    pub image_service_endpoint: String,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    pub cgroup_driver: String,
    pub cgroup_root: String,
    /// The cgroup of the node agent's own processes, reported as the `kubelet` system
    /// container of `/stats/summary`. Unset: found from the services' processes.
    pub kubelet_cgroups: Option<String>,
    /// The container runtime's cgroup, reported as the `runtime` system container of
    /// `/stats/summary`. Unset: the cgroup of the process serving containerRuntimeEndpoint.
    pub runtime_cgroups: Option<String>,
    pub pod_logs_dir: PathBuf,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    pub resolv_conf: PathBuf,
    pub max_pods: u32,
    #[serde(with = "serde_go")]
    pub runtime_request_timeout: Duration,
    #[serde(with = "serde_go")]
    pub node_status_update_frequency: Duration,
    /// An unchanged node status is written to the API server only this often.
    #[serde(with = "serde_go")]
    pub node_status_report_frequency: Duration,
    pub pod_pids_limit: i64,
    /// The node Lease's duration; it is renewed every quarter of it (upstream).
    pub node_lease_duration_seconds: i32,
    pub enable_server: bool,
    pub serialize_image_pulls: bool,
    /// Unsafe sysctls (names, or prefixes ending in `*`) pods may set besides the safe set.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The serving certificate of port 10250; with neither file set, a self-signed pair is
    /// generated in `--cert-dir` as upstream.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// Rotate the client certificate (bootstrapped from `--bootstrap-kubeconfig`) before
    /// it expires, with certificate signing requests.
    pub rotate_certificates: bool,
    /// Request the serving certificate of port 10250 from the API server (signer
    /// `kubernetes.io/kubelet-serving`) instead of self-signing it, and rotate it.
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: bool,
    pub authentication: KubeletAuthentication,
    pub authorization: KubeletAuthorization,
    /// Serves `/exec`, `/attach`, `/portForward`, `/run`, `/containerLogs` and `/logs/`.
    pub enable_debugging_handlers: bool,
    /// Leave the kernel tunables the agent would set alone and only warn when they differ
    /// (upstream: fail). The one tunable set today is `net.ipv4.tcp_migrate_req`.
    pub protect_kernel_defaults: bool,
    /// Rotate a container's log when it reaches this size (a resource quantity, `10Mi`).
    pub container_log_max_size: String,
    /// How many log files (the live one included) to keep per container.
    pub container_log_max_files: i32,
    /// An exec, attach or port-forward stream with no bytes either way for this long is
    /// closed (0: never).
    #[serde(with = "serde_go")]
    pub streaming_connection_idle_timeout: Duration,
    /// How often the disk usage of pod volumes is recomputed for `/stats/summary` (0: never,
    /// no volume stats).
    #[serde(with = "serde_go")]
    pub volume_stats_agg_period: Duration,
    /// Hard eviction thresholds (`memory.available: 100Mi`, `nodefs.available: 10%`).
    /// Unset: upstream's defaults; set: only these (unless mergeDefaultEvictionSettings).
    pub eviction_hard: Option<BTreeMap<String, String>>,
    /// Soft eviction thresholds; each needs its evictionSoftGracePeriod.
    pub eviction_soft: BTreeMap<String, String>,
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// How long a pressure condition stays True after its threshold was last met.
    #[serde(with = "serde_go")]
    pub eviction_pressure_transition_period: Duration,
    /// The most grace a pod evicted on a soft threshold gets, in seconds.
    pub eviction_max_pod_grace_period: i32,
    /// Once a threshold is met it is held until this much more than the threshold is free.
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// Fill the signals evictionHard leaves out with upstream's defaults.
    pub merge_default_eviction_settings: bool,
    /// Resources (`cpu`, `memory`, `ephemeral-storage`, `pid`) set aside for the node
    /// agent and the runtime, and for the system: taken out of the node's allocatable.
    pub kube_reserved: BTreeMap<String, String>,
    pub system_reserved: BTreeMap<String, String>,
    /// Image GC runs when the image filesystem is this full (percent; 100 disables it)...
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    /// ...and frees images until it is this full.
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    /// An image younger than this (since first seen) is never collected.
    #[serde(rename = "imageMinimumGCAge", with = "serde_go")]
    pub image_minimum_gc_age: Duration,
    /// An image unused this long is collected whatever the disk usage (0: never).
    #[serde(rename = "imageMaximumGCAge", with = "serde_go")]
    pub image_maximum_gc_age: Duration,
    /// How long a node shutdown is delayed for its pods (0: graceful shutdown off).
    #[serde(with = "serde_go")]
    pub shutdown_grace_period: Duration,
    /// Of that, the part kept for critical pods (priority ≥ 2000000000), stopped last.
    #[serde(with = "serde_go")]
    pub shutdown_grace_period_critical_pods: Duration,
}

/// `authentication` (upstream's `KubeletAuthentication`, v1beta1 defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAuthentication {
    pub x509: KubeletX509Authentication,
    pub webhook: KubeletWebhookAuthentication,
    pub anonymous: KubeletAnonymousAuthentication,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletX509Authentication {
    /// Client certificates signed by a CA in this bundle authenticate as their CN (user)
    /// and O (groups).
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletWebhookAuthentication {
    /// Bearer tokens are checked with a TokenReview.
    pub enabled: bool,
    #[serde(rename = "cacheTTL", with = "serde_go")]
    pub cache_ttl: Duration,
}

impl Default for KubeletWebhookAuthentication {
    fn default() -> Self {
        Self {
            enabled: true,
            cache_ttl: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAnonymousAuthentication {
    /// Requests with no credentials act as `system:anonymous` (group
    /// `system:unauthenticated`) instead of getting 401.
    pub enabled: bool,
}

/// `authorization` (upstream's `KubeletAuthorization`, v1beta1 defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAuthorization {
    /// `AlwaysAllow` or `Webhook` (SubjectAccessReview).
    pub mode: String,
    pub webhook: KubeletWebhookAuthorization,
}

impl Default for KubeletAuthorization {
    fn default() -> Self {
        Self {
            mode: "Webhook".into(),
            webhook: KubeletWebhookAuthorization::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletWebhookAuthorization {
    #[serde(rename = "cacheAuthorizedTTL", with = "serde_go")]
    pub cache_authorized_ttl: Duration,
    #[serde(rename = "cacheUnauthorizedTTL", with = "serde_go")]
    pub cache_unauthorized_ttl: Duration,
}

impl Default for KubeletWebhookAuthorization {
    fn default() -> Self {
        Self {
            cache_authorized_ttl: Duration::from_secs(300),
            cache_unauthorized_ttl: Duration::from_secs(30),
        }
    }
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        Self {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            static_pod_path: None,
            sync_frequency: Duration::from_secs(60),
            file_check_frequency: Duration::from_secs(20),
            http_check_frequency: Duration::from_secs(20),
            static_pod_url: None,
            static_pod_url_header: BTreeMap::new(),
            address: "0.0.0.0".into(),
            port: 10250,
            read_only_port: 0,
            healthz_port: 10248,
            healthz_bind_address: "127.0.0.1".into(),
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            image_service_endpoint: String::new(),
            cgroups_per_qos: true,
            cgroup_driver: "cgroupfs".into(),
            cgroup_root: "/".into(),
            kubelet_cgroups: None,
            runtime_cgroups: None,
            pod_logs_dir: "/var/log/pods".into(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: "/etc/resolv.conf".into(),
            max_pods: 110,
            runtime_request_timeout: Duration::from_secs(120),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            pod_pids_limit: -1,
            node_lease_duration_seconds: 40,
            enable_server: true,
            serialize_image_pulls: true,
            allowed_unsafe_sysctls: Vec::new(),
            tls_cert_file: None,
            rotate_certificates: false,
            server_tls_bootstrap: false,
            tls_private_key_file: None,
            authentication: KubeletAuthentication::default(),
            authorization: KubeletAuthorization::default(),
            enable_debugging_handlers: true,
            protect_kernel_defaults: false,
            container_log_max_size: "10Mi".into(),
            container_log_max_files: 5,
            streaming_connection_idle_timeout: Duration::from_secs(4 * 3600),
            volume_stats_agg_period: Duration::from_secs(60),
            eviction_hard: None,
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_pressure_transition_period: Duration::from_secs(300),
            eviction_max_pod_grace_period: 0,
            eviction_minimum_reclaim: BTreeMap::new(),
            merge_default_eviction_settings: false,
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: Duration::from_secs(120),
            image_maximum_gc_age: Duration::ZERO,
            shutdown_grace_period: Duration::ZERO,
            shutdown_grace_period_critical_pods: Duration::ZERO,
        }
    }
}

/// Every top-level field name this struct knows, as written in the file.
pub(crate) fn known_fields() -> Vec<String> {
    match serde_json::to_value(KubeletConfiguration::default()) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

impl KubeletConfiguration {
    /// Checks what upstream's validation checks for the fields we honour.
    pub fn validate(&self) -> Result<(), String> {
        let mut errs = Vec::new();
        if self.api_version != API_VERSION {
            errs.push(format!(
                "apiVersion: unsupported value {:?}, want {API_VERSION:?}",
                self.api_version
            ));
        }
        if self.kind != KIND {
            errs.push(format!(
                "kind: unsupported value {:?}, want {KIND:?}",
                self.kind
            ));
        }
        for (name, d) in [
            ("syncFrequency", self.sync_frequency),
            ("fileCheckFrequency", self.file_check_frequency),
            ("httpCheckFrequency", self.http_check_frequency),
            ("runtimeRequestTimeout", self.runtime_request_timeout),
            (
                "nodeStatusUpdateFrequency",
                self.node_status_update_frequency,
            ),
            (
                "nodeStatusReportFrequency",
                self.node_status_report_frequency,
            ),
        ] {
            if d.is_zero() {
                errs.push(format!(
                    "invalid configuration: {name} ({d:?}) must be greater than zero"
                ));
            }
        }
        if !matches!(self.cgroup_driver.as_str(), "cgroupfs" | "systemd") {
            errs.push(format!(
                "invalid configuration: cgroupDriver ({:?}) must be \"cgroupfs\" or \"systemd\"",
                self.cgroup_driver
            ));
        }
        if self.cgroup_driver == "systemd" {
            errs.push("invalid configuration: cgroupDriver \"systemd\" is not supported by this node agent yet; use \"cgroupfs\"".into());
        }
        if self.container_runtime_endpoint.is_empty() {
            errs.push("invalid configuration: containerRuntimeEndpoint must be set".into());
        }
        if self.node_lease_duration_seconds <= 0 {
            errs.push(format!(
                "invalid configuration: nodeLeaseDurationSeconds ({}) must be greater than zero",
                self.node_lease_duration_seconds
            ));
        }
        if !matches!(self.authorization.mode.as_str(), "AlwaysAllow" | "Webhook") {
            errs.push(format!(
                "invalid configuration: authorization.mode ({:?}) must be \"AlwaysAllow\" or \"Webhook\"",
                self.authorization.mode
            ));
        }
        if self.tls_cert_file.is_some() != self.tls_private_key_file.is_some() {
            errs.push(
                "invalid configuration: tlsCertFile and tlsPrivateKeyFile must be set together"
                    .into(),
            );
        }
        if self.container_log_max_files < 2 {
            errs.push(format!(
                "invalid configuration: containerLogMaxFiles ({}) must be greater than 1",
                self.container_log_max_files
            ));
        }
        if let Err(e) = crate::quantity::parse_bytes(&self.container_log_max_size) {
            errs.push(format!(
                "invalid configuration: containerLogMaxSize ({:?}): {e}",
                self.container_log_max_size
            ));
        }
        if let Err(e) = crate::eviction::Thresholds::from_config(self) {
            errs.push(format!("invalid configuration: {e}"));
        }
        for (name, reserved) in [
            ("kubeReserved", &self.kube_reserved),
            ("systemReserved", &self.system_reserved),
        ] {
            for (resource, q) in reserved {
                if !matches!(
                    resource.as_str(),
                    "cpu" | "memory" | "ephemeral-storage" | "pid"
                ) {
                    errs.push(format!(
                        "invalid configuration: {name}: unsupported resource {resource:?} (cpu, memory, ephemeral-storage or pid)"
                    ));
                } else if crate::quantity::bytes(q).is_none() {
                    errs.push(format!(
                        "invalid configuration: {name}[{resource}]: {q:?} is not a quantity"
                    ));
                }
            }
        }
        for (name, v) in [
            (
                "imageGCHighThresholdPercent (--image-gc-high-threshold)",
                self.image_gc_high_threshold_percent,
            ),
            (
                "imageGCLowThresholdPercent (--image-gc-low-threshold)",
                self.image_gc_low_threshold_percent,
            ),
        ] {
            if !(0..=100).contains(&v) {
                errs.push(format!(
                    "invalid configuration: {name} {v} must be between 0 and 100, inclusive"
                ));
            }
        }
        if self.image_gc_low_threshold_percent >= self.image_gc_high_threshold_percent {
            errs.push(format!(
                "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {}",
                self.image_gc_low_threshold_percent, self.image_gc_high_threshold_percent
            ));
        }
        if !self.image_maximum_gc_age.is_zero()
            && self.image_maximum_gc_age <= self.image_minimum_gc_age
        {
            errs.push(format!(
                "invalid configuration: imageMaximumGCAge {:?} must be greater than imageMinimumGCAge {:?}",
                self.image_maximum_gc_age, self.image_minimum_gc_age
            ));
        }
        if self.shutdown_grace_period_critical_pods > self.shutdown_grace_period {
            errs.push(format!(
                "invalid configuration: shutdownGracePeriodCriticalPods {:?} must be <= shutdownGracePeriod {:?}",
                self.shutdown_grace_period_critical_pods, self.shutdown_grace_period
            ));
        }
        if self.max_pods == 0 {
            errs.push("invalid configuration: maxPods (0) must be greater than zero".into());
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }
}
