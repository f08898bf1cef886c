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
    /// Serves `/exec`, `/attach`, `/portForward`, `/run`, `/containerLogs`, `/logs/`,
    /// `/runningpods/` and `/configz` (upstream's `InstallDebuggingHandlers`).
    pub enable_debugging_handlers: bool,
    /// Serves the node's log files under `/logs/` (upstream: on by default).
    pub enable_system_log_handler: bool,
    /// A container (and sandbox) whose pod sets no seccomp profile runs RuntimeDefault
    /// instead of Unconfined.
    pub seccomp_default: bool,
    /// The lowest TLS version port 10250 accepts: `VersionTLS12` or `VersionTLS13` (Go's
    /// names; empty: TLS 1.2).
    pub tls_min_version: String,
    /// The cipher suites port 10250 offers for TLS 1.2 (Go's IANA names; empty: the TLS
    /// library's defaults). A suite this node cannot offer is refused at start.
    pub tls_cipher_suites: Vec<String>,
    /// Refuse to start while swap is on (upstream's default).
    pub fail_swap_on: bool,
    /// Register the Node with the API server (upstream's default); false: only update a
    /// Node someone else created.
    pub register_node: bool,
    /// Taints the Node is registered with (`--register-with-taints`).
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// The Node's `spec.providerID` at registration (`--provider-id`).
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// Leave the kernel tunables the agent would set alone and only warn when they differ
    /// (upstream: fail). The one tunable set today is `net.ipv4.tcp_migrate_req`.
    pub protect_kernel_defaults: bool,
    /// Rotate a container's log when it reaches this size (a resource quantity, `10Mi`).
    pub container_log_max_size: String,
    /// How many log files (the live one included) to keep per container.
    pub container_log_max_files: i32,
    /// How often container logs are checked for rotation.
    #[serde(with = "serde_go")]
    pub container_log_monitor_interval: Duration,
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
    /// Feature gates by name. The one acted on is `MemoryQoS` (alpha upstream, off by
    /// default): on cgroup v2, memory requests become `memory.min` of the container, pod
    /// and QoS cgroups and limits a `memory.high` below `memory.max`. Any other gate is
    /// accepted and named in the start-up warning.
    pub feature_gates: BTreeMap<String, bool>,
    /// With `MemoryQoS`, how far between its request and its limit (or node allocatable
    /// memory, without a limit) a container's `memory.high` sits (upstream's default 0.9).
    pub memory_throttling_factor: f64,
    /// The CPU manager's policy: `none` (every container shares every CPU, upstream's
    /// default) or `static` (whole CPUs of their own for the containers of Guaranteed pods
    /// that request whole CPUs; its state in `<root-dir>/cpu_manager_state`).
    pub cpu_manager_policy: String,
    /// Options of the static policy; none of upstream's is implemented, so any is refused.
    pub cpu_manager_policy_options: BTreeMap<String, String>,
    /// How often the CPU manager makes every running container's cpuset what its state says.
    #[serde(with = "serde_go")]
    pub cpu_manager_reconcile_period: Duration,
    /// CPUs (a cpuset, `0,1` or `0-3`) kept for the system and the node agent; the static
    /// policy never gives them to a container of its own, and they replace the cpu of
    /// kubeReserved and systemReserved (upstream's `--reserved-cpus`).
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: String,
    /// Where node allocatable is enforced (upstream's default `["pods"]`): with `pods`, the
    /// `kubepods` cgroup is limited to capacity less kubeReserved and systemReserved, else to
    /// capacity; with `system-reserved` and `kube-reserved`, the existing cgroups
    /// systemReservedCgroup and kubeReservedCgroup name get systemReserved and kubeReserved
    /// as their limits.
    pub enforce_node_allocatable: Vec<String>,
    /// The existing cgroup of the system's daemons (`/system.slice`), limited to
    /// systemReserved under `enforceNodeAllocatable: [system-reserved]`.
    pub system_reserved_cgroup: String,
    /// The existing cgroup of the node agent and the runtime, limited to kubeReserved under
    /// `enforceNodeAllocatable: [kube-reserved]`.
    pub kube_reserved_cgroup: String,
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
    /// `logging` (component-base's `LoggingConfiguration`): `--logging-format` and `-v`
    /// override it, as upstream's flags override the file.
    pub logging: LoggingConfiguration,
}

/// The part of upstream's `LoggingConfiguration` we act on. `flushFrequency` and `options`
/// are named as ignored (every line is written at once, unbuffered).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoggingConfiguration {
    /// `text` (klog's lines) or `json` (component-base's).
    pub format: String,
    pub verbosity: u8,
    /// Per-file verbosity (component-base's `VModuleConfiguration`), under `--vmodule`.
    pub vmodule: Vec<VModuleItem>,
}

/// One `vmodule` entry: source files whose name (without its extension) matches
/// `filePattern` (a glob) log at `verbosity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VModuleItem {
    pub file_pattern: String,
    pub verbosity: u8,
}

impl Default for LoggingConfiguration {
    fn default() -> Self {
        Self {
            format: "text".into(),
            verbosity: 0,
            vmodule: Vec::new(),
        }
    }
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
            enable_system_log_handler: true,
            seccomp_default: false,
            tls_min_version: String::new(),
            tls_cipher_suites: Vec::new(),
            protect_kernel_defaults: false,
            fail_swap_on: true,
            register_node: true,
            register_with_taints: Vec::new(),
            provider_id: String::new(),
            container_log_max_size: "10Mi".into(),
            container_log_max_files: 5,
            container_log_monitor_interval: Duration::from_secs(10),
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
            system_reserved_cgroup: String::new(),
            kube_reserved_cgroup: String::new(),
            feature_gates: BTreeMap::new(),
            memory_throttling_factor: 0.9,
            cpu_manager_policy: "none".into(),
            cpu_manager_policy_options: BTreeMap::new(),
            cpu_manager_reconcile_period: Duration::from_secs(10),
            reserved_system_cpus: String::new(),
            enforce_node_allocatable: vec!["pods".into()],
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: Duration::from_secs(120),
            image_maximum_gc_age: Duration::ZERO,
            shutdown_grace_period: Duration::ZERO,
            shutdown_grace_period_critical_pods: Duration::ZERO,
            logging: LoggingConfiguration::default(),
        }
    }
}

/// The document of a default configuration: every field this struct knows, at every
/// depth, as written in the file.
pub(crate) fn default_document() -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(KubeletConfiguration::default()) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// `staticPodURL` is http:// or https://, and `staticPodURLHeader` names are HTTP tokens
/// whose values hold no CR, LF or NUL: a header may never add another header or a request
/// of its own. The URL's query string is never repeated (it may hold a token).
fn static_pod_url_errors(
    url: Option<&str>,
    headers: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let mut errs = Vec::new();
    if let Some(url) = url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        let shown = url.split_once('?').map_or(url, |(base, _)| base);
        errs.push(format!(
            "staticPodURL: unsupported value {shown:?}: want an http:// or https:// URL"
        ));
    }
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    for (name, values) in headers {
        if name.is_empty() || !name.chars().all(token) {
            errs.push(format!(
                "staticPodURLHeader: invalid header name {name:?}: want an HTTP token"
            ));
        }
        if values.iter().any(|v| v.contains(['\r', '\n', '\0'])) {
            errs.push(format!(
                "staticPodURLHeader[{name}]: a value may not contain CR, LF or NUL"
            ));
        }
    }
    errs
}

/// The feature gates acted on (see [`KubeletConfiguration::feature_gates`]).
pub const KNOWN_FEATURE_GATES: &[&str] = &["MemoryQoS"];

impl KubeletConfiguration {
    /// Whether the `MemoryQoS` feature gate is on.
    pub fn memory_qos(&self) -> bool {
        self.feature_gates.get("MemoryQoS") == Some(&true)
    }

    /// `cgroupDriver` (validated: anything else than the two names is refused at load).
    pub fn cgroup_driver(&self) -> crate::cgroup_name::CgroupDriver {
        crate::cgroup_name::CgroupDriver::parse(&self.cgroup_driver).unwrap_or_default()
    }

    /// Upstream's defaulting of a decoded file (pkg/kubelet/apis/config/v1beta1/defaults.go,
    /// `SetDefaults_KubeletConfiguration`): a field whose Go type is a plain value (not a
    /// pointer) and holds its zero value takes the default, so `syncFrequency: 0s`, which
    /// kubeadm writes for every duration it leaves alone, is one minute, not an error.
    /// Fields upstream keeps as pointers (healthzPort, readOnlyPort's 0 = off,
    /// imageMaximumGCAge, shutdownGracePeriod) keep an explicit zero.
    pub fn apply_upstream_defaults(&mut self) {
        let d = Self::default();
        let zero = Duration::ZERO;
        for (field, default) in [
            (&mut self.sync_frequency, d.sync_frequency),
            (&mut self.file_check_frequency, d.file_check_frequency),
            (&mut self.http_check_frequency, d.http_check_frequency),
            (&mut self.runtime_request_timeout, d.runtime_request_timeout),
            (
                &mut self.node_status_update_frequency,
                d.node_status_update_frequency,
            ),
            (
                &mut self.node_status_report_frequency,
                d.node_status_report_frequency,
            ),
            (
                &mut self.streaming_connection_idle_timeout,
                d.streaming_connection_idle_timeout,
            ),
            (&mut self.volume_stats_agg_period, d.volume_stats_agg_period),
            (
                &mut self.eviction_pressure_transition_period,
                d.eviction_pressure_transition_period,
            ),
            (&mut self.image_minimum_gc_age, d.image_minimum_gc_age),
            (
                &mut self.cpu_manager_reconcile_period,
                d.cpu_manager_reconcile_period,
            ),
            (
                &mut self.authentication.webhook.cache_ttl,
                d.authentication.webhook.cache_ttl,
            ),
            (
                &mut self.authorization.webhook.cache_authorized_ttl,
                d.authorization.webhook.cache_authorized_ttl,
            ),
            (
                &mut self.authorization.webhook.cache_unauthorized_ttl,
                d.authorization.webhook.cache_unauthorized_ttl,
            ),
        ] {
            if *field == zero {
                *field = default;
            }
        }
        for (field, default) in [
            (&mut self.address, d.address),
            (&mut self.healthz_bind_address, d.healthz_bind_address),
            (
                &mut self.container_runtime_endpoint,
                d.container_runtime_endpoint,
            ),
            (&mut self.cgroup_driver, d.cgroup_driver),
            (&mut self.cpu_manager_policy, d.cpu_manager_policy),
            (&mut self.container_log_max_size, d.container_log_max_size),
            (&mut self.authorization.mode, d.authorization.mode),
        ] {
            if field.is_empty() {
                *field = default;
            }
        }
        if self.port == 0 {
            self.port = d.port;
        }
        if self.max_pods == 0 {
            self.max_pods = d.max_pods;
        }
        if self.node_lease_duration_seconds == 0 {
            self.node_lease_duration_seconds = d.node_lease_duration_seconds;
        }
        // Unset: upstream's DefaultEvictionHard (also merged in under
        // mergeDefaultEvictionSettings); `{}` stays empty, as upstream's non-nil map.
        if self.eviction_hard.is_none() || self.merge_default_eviction_settings {
            let hard = self.eviction_hard.get_or_insert_default();
            for (signal, value) in crate::eviction::DEFAULT_EVICTION_HARD {
                hard.entry(signal.to_string())
                    .or_insert_with(|| value.to_string());
            }
        }
    }

    /// The configuration as `/configz` shows it: every defaulted field with its value
    /// (evictionHard included), and, as upstream's `omitempty`, no field that is unset.
    pub fn effective_document(&self) -> serde_json::Value {
        fn drop_nulls(v: &mut serde_json::Value) {
            if let serde_json::Value::Object(map) = v {
                map.retain(|_, v| !v.is_null());
                map.values_mut().for_each(drop_nulls);
            }
        }
        let mut doc = serde_json::to_value(self).unwrap_or_default();
        drop_nulls(&mut doc);
        doc
    }

    /// Checks what upstream's validation checks for the fields we honour.
    /// The CPU manager's fields (upstream's validation and `NewManager`, their words).
    fn cpu_manager_errors(&self) -> Vec<String> {
        let mut errs = Vec::new();
        if !matches!(self.cpu_manager_policy.as_str(), "none" | "static") {
            errs.push(format!(
                "invalid configuration: cpuManagerPolicy (--cpu-manager-policy): unknown policy: {:?} (\"none\" or \"static\")",
                self.cpu_manager_policy
            ));
        }
        for (name, value) in &self.cpu_manager_policy_options {
            // upstream's NewStaticPolicyOptions, in its words.
            if CPU_MANAGER_OPTIONS.contains(&name.as_str()) {
                if go_parse_bool(value).is_none() {
                    errs.push(format!(
                        "invalid configuration: cpuManagerPolicyOptions: bad value for option {name:?}: strconv.ParseBool: parsing {value:?}: invalid syntax"
                    ));
                }
                continue;
            }
            errs.push(format!(
                "invalid configuration: cpuManagerPolicyOptions: unsupported cpumanager option: {name:?} ({value}): this node agent implements only {} of the static policy's options",
                CPU_MANAGER_OPTIONS.join(" and ")
            ));
        }
        if self.cpu_manager_reconcile_period.is_zero() {
            errs.push(
                "invalid configuration: cpuManagerReconcilePeriod (--cpu-manager-reconcile-period) must be greater than zero".into(),
            );
        }
        if !self.reserved_system_cpus.is_empty()
            && (!self.system_reserved_cgroup.is_empty() || !self.kube_reserved_cgroup.is_empty())
        {
            errs.push("invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)".into());
        }
        if let Err(e) = crate::cpuset::CpuSet::parse(&self.reserved_system_cpus) {
            errs.push(format!(
                "invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus) {}, error: {e}",
                self.reserved_system_cpus
            ));
        }
        errs
    }

    /// upstream's `server.go`: with reservedSystemCPUs set, its size is systemReserved's
    /// cpu and kubeReserved has none (allocatable and the static policy count it once).
    pub fn apply_reserved_system_cpus(&mut self) {
        let Ok(cpus) = crate::cpuset::CpuSet::parse(&self.reserved_system_cpus) else {
            return;
        };
        if cpus.is_empty() {
            return;
        }
        self.kube_reserved.remove("cpu");
        self.system_reserved
            .insert("cpu".into(), cpus.size().to_string());
    }

    /// The static policy's `full-pcpus-only` option (upstream's `FullPhysicalCPUsOnly`):
    /// whole physical cores only.
    pub fn cpu_manager_full_pcpus_only(&self) -> bool {
        self.cpu_manager_option(FULL_PCPUS_ONLY)
    }

    /// The static policy's `strict-cpu-reservation` option (upstream's
    /// `StrictCPUReservation`, beta): the reserved CPUs are out of the shared pool too.
    pub fn cpu_manager_strict_cpu_reservation(&self) -> bool {
        self.cpu_manager_option(STRICT_CPU_RESERVATION)
    }

    fn cpu_manager_option(&self, name: &str) -> bool {
        self.cpu_manager_policy_options
            .get(name)
            .and_then(|v| go_parse_bool(v))
            .unwrap_or(false)
    }

    /// The CPU kept for the system and the node agent (kubeReserved + systemReserved), in
    /// millicores.
    pub fn reserved_cpu_millis(&self) -> i64 {
        [&self.kube_reserved, &self.system_reserved]
            .iter()
            .filter_map(|m| m.get("cpu"))
            .filter_map(|q| crate::quantity::cpu_millis(q))
            .sum()
    }

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
        errs.extend(static_pod_url_errors(
            self.static_pod_url.as_deref(),
            &self.static_pod_url_header,
        ));
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
        // upstream's validation.go.
        if !(self.memory_throttling_factor > 0.0 && self.memory_throttling_factor <= 1.0) {
            errs.push(format!(
                "invalid configuration: memoryThrottlingFactor {} must be greater than 0 and less than or equal to 1.0",
                self.memory_throttling_factor
            ));
        }
        if !matches!(self.cgroup_driver.as_str(), "cgroupfs" | "systemd") {
            errs.push(format!(
                "invalid configuration: cgroupDriver ({:?}) must be \"cgroupfs\" or \"systemd\"",
                self.cgroup_driver
            ));
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
        // Upstream's validation of enforceNodeAllocatable (its words).
        for value in &self.enforce_node_allocatable {
            match value.as_str() {
                "system-reserved" if self.system_reserved_cgroup.is_empty() => errs.push(
                    "invalid configuration: systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)".into(),
                ),
                "kube-reserved" if self.kube_reserved_cgroup.is_empty() => errs.push(
                    "invalid configuration: kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)".into(),
                ),
                "pods" | "system-reserved" | "kube-reserved" => {}
                "none" if self.enforce_node_allocatable.len() > 1 => errs.push(
                    "invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified".into(),
                ),
                "none" => {}
                other => errs.push(format!(
                    "invalid configuration: option {other:?} specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are \"pods\", \"system-reserved\", \"kube-reserved\", or \"none\""
                )),
            }
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
        errs.extend(self.cpu_manager_errors());
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }
}

/// upstream's `FullPCPUsOnlyOption`.
pub const FULL_PCPUS_ONLY: &str = "full-pcpus-only";
/// upstream's `StrictCPUReservationOption`.
pub const STRICT_CPU_RESERVATION: &str = "strict-cpu-reservation";
/// The static policy's options this node implements (each a Go bool).
pub const CPU_MANAGER_OPTIONS: &[&str] = &[FULL_PCPUS_ONLY, STRICT_CPU_RESERVATION];

/// Go's `strconv.ParseBool`.
pub fn go_parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}
