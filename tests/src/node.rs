//! A node agent made of the seven real binaries, in a temp dir.

use crate::CONTAINERD_SOCKET;
use crate::apiserver::{ApiServer, ApiState};
use crate::kubelet_client::{Credentials, KubeletClient};
use crate::pki::TestCa;
use crate::runtime::{Runtime, RuntimeLease};
use nodeagent_config::{Address, Service};
use nodeagent_cri::Cri;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Where cargo put the binaries of this workspace (the test runs from target/<profile>/deps),
/// or `NODEAGENT_TEST_BIN_DIR` (to run a suite against other builds, e.g. target/previous).
pub fn binary(service: Service) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = match std::env::var_os("NODEAGENT_TEST_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf(),
    };
    let path = dir.join(format!("nodeagent-{}", service.name()));
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests (the README's test command does)",
        path.display()
    );
    path
}

/// A helper binary of the tests package (`nodeagent-test-*`), beside the services where
/// cargo put them (the cgroup v2 guest copies it there too).
pub fn test_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests (the README's test command does)",
        path.display()
    );
    path
}

/// Skips a test (returns false) only where root or the runtime truly cannot exist; in CI
/// (CI=true) a missing runtime is a failure.
pub fn require_runtime(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    let socket = Path::new(CONTAINERD_SOCKET).exists();
    if root && socket {
        return true;
    }
    let why = format!(
        "{test} needs root and the containerd started by deploy/runtime/setup.sh (root: {root}, socket {CONTAINERD_SOCKET}: {socket})"
    );
    crate::skip_unless_ci(&why)
}

/// Waits (90 s at most) until the gRPC server at `address`, named `name` in the wait,
/// answers its health check.
///
/// 90 s, the suites' deadline: in the cgroup v2 guest (emulated, no KVM, beside the host's
/// tests) a debug pod-sync once took over 30 s from exec to serving after a SIGKILL
/// (stop 58's CI, cpu_manager::static_policy...); a service that never serves still fails.
pub async fn wait_serving(address: &Address, name: &str) {
    crate::eventually(
        &format!("{name} serving"),
        Duration::from_secs(90),
        || async {
            nodeagent_transport::check_health(
                nodeagent_transport::connect(address),
                "",
                Duration::from_secs(1),
            )
            .await
        },
    )
    .await;
}

/// A TCP port on 127.0.0.1 for a service of the test to listen on, kept for this test
/// alone until its process exits.
///
/// Taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`): a port that
/// was free a moment ago in that range can be taken by any outgoing connection (another
/// test's client) before the service binds it, which is how CI failed once
/// (http-server: "cannot listen on 127.0.0.1:36143: Address already in use"). Tests running
/// side by side in their own processes (nextest) are kept apart by a lock on a file per
/// port, held until the process exits.
pub fn free_port() -> u16 {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let (low, high) = port_range_outside_ephemeral();
    let dir = std::env::temp_dir().join("nodeagent-test-ports");
    std::fs::create_dir_all(&dir).expect("the port lock directory");
    let span = u32::from(high - low) + 1;
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    for i in 0..span {
        let port = low + ((seed.wrapping_add(i)) % span) as u16;
        let Ok(lock) = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        HELD.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
        return port;
    }
    panic!("no free port in {low}..={high}");
}

/// The ports [`free_port`] picks from: below the ephemeral range where it leaves room,
/// else above it.
fn port_range_outside_ephemeral() -> (u16, u16) {
    let (eph_low, eph_high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    // From 20000: upstream's fixed ports (10248, 10250, 10255, 10256, 10257, 10259) that the
    // docker compose and systemd tests' nodes listen on stay clear.
    if eph_low >= 22_000 {
        (20_000, eph_low - 1)
    } else {
        (eph_high.saturating_add(1).max(1024), u16::MAX)
    }
}

#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// Extra lines for the KubeletConfiguration file.
    pub extra_config: String,
    /// Prepare the node (dirs, config) without starting any service.
    pub no_services: bool,
    /// Extra environment of every service (e.g. OTEL_EXPORTER_OTLP_ENDPOINT).
    pub env: Vec<(String, String)>,
    /// A kubeconfig (its text): the node connects to that API server.
    pub kubeconfig: Option<String>,
    /// A bootstrap kubeconfig (its text), given as `--bootstrap-kubeconfig` with a
    /// `--kubeconfig` that does not exist yet: node-status requests the client
    /// certificate and writes it.
    pub bootstrap_kubeconfig: Option<String>,
    /// The `authentication` and `authorization` sections of the config (YAML), instead of
    /// the default: x509 against the node's test CA, no bearer tokens, no anonymous
    /// access, AlwaysAllow (with tokens it would be refused on a node with an API server).
    pub auth_config: Option<String>,
    /// Do not start the default probe instance (a test that runs `--probe-instance`s).
    pub no_default_probe: bool,
    /// pleg's `--pleg-relist-period` (default 500ms).
    pub pleg_relist_period: Option<String>,
    /// `syncFrequency` (default 10s).
    pub sync_frequency: Option<String>,
    /// Flags for one service only, after the shared ones (a later flag wins), e.g. pleg's
    /// `--container-runtime-endpoint` through a fault-injecting proxy.
    pub service_args: Vec<(Service, Vec<String>)>,
}

pub struct Node {
    pub dir: tempfile::TempDir,
    pub name: String,
    pub read_only_port: u16,
    pub healthz_port: u16,
    /// The kubelet API's TLS port (upstream's 10250).
    pub port: u16,
    /// The CA whose clients the node's x509 authenticator accepts (`<dir>/pki/ca.crt`).
    pub ca: Arc<TestCa>,
    /// The kubelet API as `test-admin` (group `system:masters`), with a client certificate.
    pub api: KubeletClient,
    pub cri: Cri,
    procs: BTreeMap<Service, Child>,
    /// Probe instances started with `--probe-instance <id>`, by id.
    probe_instances: BTreeMap<String, Child>,
    /// More http-server instances (sharing the ports, each on its own gRPC socket), by id.
    http_instances: BTreeMap<String, Child>,
    env: Vec<(String, String)>,
    kubeconfig: bool,
    bootstrap_kubeconfig: bool,
    pleg_relist_period: String,
    service_args: BTreeMap<Service, Vec<String>>,
    stopped: bool,
    /// The image holder pod runs (`hold_images_if_collected`).
    holds_images: bool,
    /// The container runtime this node owns while the test runs (`crate::runtime`).
    lease: RuntimeLease,
}

/// What the harness puts in every node's config unless the test's own config sets the key.
/// The tests share one containerd and its locally built images, which no registry can
/// bring back: no node collects images unless its test asks for it. Nor does a node see
/// pressure its test did not make: upstream's default hard thresholds
/// (imagefs.available<15%, ...) would be met on a machine whose real disk is fuller, and
/// every node would then collect images and refuse pods.
const HARNESS_DEFAULTS: [(&str, &str); 2] = [
    (
        "imageGCHighThresholdPercent",
        "imageGCHighThresholdPercent: 100\n",
    ),
    ("evictionHard", "evictionHard: {}\n"),
];

fn harness_defaults(extra: &str) -> String {
    HARNESS_DEFAULTS
        .iter()
        .filter(|(key, _)| !extra.contains(key))
        .map(|(_, line)| *line)
        .collect()
}

impl Node {
    /// Starts all seven services. The node name is unique, so that every pod name (which
    /// static pods suffix with it) belongs to this test alone.
    pub async fn start(test: &str, options: NodeOptions) -> Node {
        Node::start_on(test, options, crate::runtime::lease().await).await
    }

    /// As [`Node::start`], on a runtime the test leased already (`runtime::leases`, for a
    /// test of several nodes).
    pub async fn start_on(test: &str, options: NodeOptions, lease: RuntimeLease) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("nodeagent-test-")
            .tempdir()
            .expect("temp dir");
        let suffix: String = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .chars()
            .rev()
            .take(6)
            .collect::<String>()
            .to_lowercase();
        let name = format!(
            "{}-{}",
            test.replace('_', "-"),
            suffix.replace(|c: char| !c.is_ascii_alphanumeric(), "x")
        );
        for sub in [
            "manifests",
            "root",
            "sockets",
            "logs",
            "pod-logs",
            "pki",
            "cert-dir",
        ] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        let read_only_port = free_port();
        let healthz_port = free_port();
        let port = free_port();
        let ca = Arc::new(TestCa::new(&format!("{name}-ca")));
        std::fs::write(dir.path().join("pki/ca.crt"), ca.cert_pem()).expect("write the CA");
        let auth_config = options.auth_config.clone().unwrap_or_else(|| {
            format!(
                "authentication:\n  x509:\n    clientCAFile: {}/pki/ca.crt\n  webhook:\n    enabled: false\n\
                 \x20 anonymous:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
                dir.path().display()
            )
        });
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             staticPodPath: {d}/manifests\ncontainerRuntimeEndpoint: {endpoint}\n\
             address: 127.0.0.1\nreadOnlyPort: {read_only_port}\nhealthzPort: {healthz_port}\n\
             fileCheckFrequency: 2s\npodLogsDir: {d}/pod-logs\nsyncFrequency: {sync}\nport: {port}\n\
             {auth_config}{defaults}{extra}",
            d = dir.path().display(),
            endpoint = lease.runtime.endpoint(),
            defaults = harness_defaults(&options.extra_config),
            sync = options.sync_frequency.as_deref().unwrap_or("10s"),
            extra = options.extra_config,
        );
        std::fs::write(dir.path().join("config.yaml"), config).expect("write config");
        if let Some(kubeconfig) = &options.kubeconfig {
            std::fs::write(dir.path().join("kubeconfig"), kubeconfig).expect("write kubeconfig");
        }
        if let Some(bootstrap) = &options.bootstrap_kubeconfig {
            std::fs::write(dir.path().join("bootstrap-kubeconfig"), bootstrap)
                .expect("write the bootstrap kubeconfig");
        }
        let cri = Cri::connect(
            &lease.runtime.endpoint().parse().unwrap(),
            Duration::from_secs(30),
        );
        let api = KubeletClient {
            port,
            server_cert: dir.path().join("cert-dir/kubelet.crt"),
            credentials: Credentials::Cert(ca.issue_client("test-admin", &["system:masters"])),
        };
        let mut node = Node {
            dir,
            name,
            read_only_port,
            healthz_port,
            port,
            ca,
            api,
            cri,
            procs: BTreeMap::new(),
            probe_instances: BTreeMap::new(),
            http_instances: BTreeMap::new(),
            env: options.env.clone(),
            kubeconfig: options.kubeconfig.is_some() || options.bootstrap_kubeconfig.is_some(),
            bootstrap_kubeconfig: options.bootstrap_kubeconfig.is_some(),
            pleg_relist_period: options
                .pleg_relist_period
                .clone()
                .unwrap_or_else(|| "500ms".into()),
            service_args: options.service_args.iter().cloned().collect(),
            stopped: false,
            holds_images: false,
            lease,
        };
        node.hold_images_if_collected(&options.extra_config).await;
        if !options.no_services {
            for s in Service::ALL {
                if !(options.no_default_probe && s == Service::Probe) {
                    node.spawn(s);
                }
            }
        }
        node
    }

    /// The pod named `name` (before the node suffix) from /pods, if listed.
    pub async fn pod(&self, name: &str) -> Result<serde_json::Value, String> {
        let full = self.pod_name(name);
        self.pods()
            .await?
            .into_iter()
            .find(|p| p["metadata"]["name"] == full.as_str())
            .ok_or_else(|| format!("{full} is not listed"))
    }

    /// Starts a test API server (empty, on a free port), then the node (as [`Node::start`])
    /// connected to it: `options` with the server's kubeconfig.
    pub async fn start_with_api_server(test: &str, options: NodeOptions) -> (ApiServer, Node) {
        let server = ApiServer::start(ApiState::default(), 0).await;
        let options = NodeOptions {
            kubeconfig: Some(server.kubeconfig()),
            ..options
        };
        let node = Node::start(test, options).await;
        (server, node)
    }

    /// Waits until the service answers its gRPC health check.
    pub async fn wait_serving(&self, service: Service) {
        wait_serving(&self.socket(service), service.name()).await;
    }

    /// The container runtime this node owns.
    pub fn runtime(&self) -> &Runtime {
        &self.lease.runtime
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn log_path(&self, service: Service) -> PathBuf {
        self.path(&format!("logs/{}.log", service.name()))
    }

    pub fn log(&self, service: Service) -> String {
        std::fs::read_to_string(self.log_path(service)).unwrap_or_default()
    }

    /// config-source's log line refusing the static pod manifest `file` (upstream's
    /// kubelet skips an invalid manifest with its validation error in the log), once it
    /// is there.
    pub async fn refused_manifest(&self, file: &str, deadline: std::time::Duration) -> String {
        crate::eventually(&format!("{file} refused in the log"), deadline, || async {
            self.log(Service::ConfigSource)
                .lines()
                .find(|l| l.contains("invalid static pod manifest") && l.contains(file))
                .map(str::to_string)
                .ok_or_else(|| "not yet".to_string())
        })
        .await
    }

    /// The flags every service of this node gets.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--config".into(),
            self.path("config.yaml").display().to_string(),
            "--root-dir".into(),
            self.path("root").display().to_string(),
            "--socket-dir".into(),
            self.path("sockets").display().to_string(),
            "--hostname-override".into(),
            self.name.clone(),
            "--pleg-relist-period".into(),
            self.pleg_relist_period.clone(),
            "--cert-dir".into(),
            self.path("cert-dir").display().to_string(),
        ];
        // No node page history (a Summary every 15 s on every node of the suite) unless a
        // test asks http-server for it.
        let history_asked = self
            .service_args
            .get(&Service::HttpServer)
            .is_some_and(|a| a.iter().any(|a| a.starts_with("--ui-history-period")));
        if !history_asked {
            args.push("--ui-history-period".into());
            args.push("0s".into());
        }
        if self.kubeconfig {
            args.push("--kubeconfig".into());
            args.push(self.path("kubeconfig").display().to_string());
        }
        if self.bootstrap_kubeconfig {
            args.push("--bootstrap-kubeconfig".into());
            args.push(self.path("bootstrap-kubeconfig").display().to_string());
        }
        args
    }

    pub fn socket(&self, service: Service) -> Address {
        Address::Unix(self.path(&format!("sockets/{}.sock", service.name())))
    }

    /// The next relist pleg reports after the one at `after` (unix nanos, as pleg's Health
    /// gives it): (its time, its duration in ms); 60 s at most.
    pub async fn next_relist(&self, after: i64) -> (i64, f64) {
        crate::eventually_every(
            "pleg's next relist",
            Duration::from_secs(60),
            Duration::from_millis(50),
            || async {
                let mut pleg = nodeagent_proto::api::pleg_client::PlegClient::new(
                    nodeagent_transport::connect(&self.socket(Service::Pleg)),
                );
                let h = pleg
                    .health(nodeagent_proto::api::PlegHealthRequest {})
                    .await
                    .map_err(|e| e.message().to_string())?
                    .into_inner();
                (h.last_relist_unix_nanos > after)
                    .then_some((
                        h.last_relist_unix_nanos,
                        h.last_relist_duration_seconds * 1000.0,
                    ))
                    .ok_or_else(|| "no new relist yet".to_string())
            },
        )
        .await
    }

    /// Waits until pleg has finished `count` relists that started after this call (each
    /// one a complete look at the runtime). A relist's time is when it started: one that
    /// started before this call may have missed what happened since.
    pub async fn wait_relists(&self, count: usize) {
        let mut after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        for _ in 0..count {
            after = self.next_relist(after).await.0;
        }
    }

    /// Sets the flags `service` gets after the shared ones (for services started after this).
    pub fn set_service_args(&mut self, service: Service, args: Vec<String>) {
        self.service_args.insert(service, args);
    }

    /// Starts every service (a node started with `no_services`).
    pub fn spawn_all(&mut self) {
        for s in Service::ALL {
            self.spawn(s);
        }
    }

    /// Starts (or restarts) one service, appending to its log.
    pub fn spawn(&mut self, service: Service) {
        self.spawn_from(service, &binary(service));
    }

    /// Starts (or restarts) one service from another build of its binary (the upgrade test),
    /// with the flags that build knows: an older build's unit file would not name flags
    /// added since (`--cert-dir`, say), and clap refuses unknown ones.
    pub fn spawn_from(&mut self, service: Service, binary: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(service))
            .expect("open log");
        let help = Command::new(binary)
            .arg("--help")
            .output()
            .expect("run --help");
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        let mut args: Vec<String> = self
            .args()
            .chunks(2)
            .filter(|pair| help.contains(&format!("{} <", pair[0])))
            .flatten()
            .cloned()
            .collect();
        args.extend(self.service_args.get(&service).cloned().unwrap_or_default());
        let child = Command::new(binary)
            .args(args)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn service");
        if let Some(mut old) = self.procs.insert(service, child) {
            let _ = old.kill();
            let _ = old.wait();
        }
    }

    /// Starts probe instance `id` (`--probe-instance id`), logging to `logs/probe-<id>.log`.
    pub fn spawn_probe_instance(&mut self, id: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("logs/probe-{id}.log")))
            .expect("open log");
        let child = Command::new(binary(Service::Probe))
            .args(self.args())
            .args(["--probe-instance", id])
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn probe instance");
        if let Some(mut old) = self.probe_instances.insert(id.to_string(), child) {
            let _ = old.kill();
            let _ = old.wait();
        }
    }

    /// Starts (or restarts) another http-server instance `id`: the same ports (SO_REUSEPORT)
    /// and its own gRPC socket (`sockets/http-server-<id>.sock`), logging to
    /// `logs/http-server-<id>.log`.
    pub fn spawn_http_server_instance(&mut self, id: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("logs/http-server-{id}.log")))
            .expect("open log");
        let socket = self.path(&format!("sockets/http-server-{id}.sock"));
        let child = Command::new(binary(Service::HttpServer))
            .args(self.args())
            .arg("--service-endpoint")
            .arg(format!("http-server=unix://{}", socket.display()))
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn an http-server instance");
        if let Some(mut old) = self.http_instances.insert(id.to_string(), child) {
            let _ = old.kill();
            let _ = old.wait();
        }
    }

    /// Where http-server instance `id` serves gRPC health.
    pub fn http_server_instance_socket(&self, id: &str) -> Address {
        Address::Unix(self.path(&format!("sockets/http-server-{id}.sock")))
    }

    /// SIGKILLs http-server instance `id` and waits for it to exit.
    pub fn kill_http_server_instance(&mut self, id: &str) {
        if let Some(mut child) = self.http_instances.remove(id) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Where probe instance `id` serves `Prober.Watch`.
    pub fn probe_instance_socket(&self, id: &str) -> Address {
        self.socket(Service::Probe)
            .probe_instance(id)
            .expect("a unix socket")
    }

    /// Sends `signal` to probe instance `id` and waits (15 s at most) for it to exit.
    pub async fn signal_probe_instance(&mut self, id: &str, signal: nix::sys::signal::Signal) {
        let mut child = self.probe_instances.remove(id).expect("instance running");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("kill");
        let exited = tokio::task::spawn_blocking(move || child.wait());
        if tokio::time::timeout(Duration::from_secs(15), exited)
            .await
            .is_err()
        {
            panic!("probe instance {id} did not exit after {signal}");
        }
    }

    /// Sends `signal` to one service and waits for it to exit; returns its exit status.
    pub async fn signal(
        &mut self,
        service: Service,
        signal: nix::sys::signal::Signal,
    ) -> std::process::ExitStatus {
        let mut child = self.procs.remove(&service).expect("service running");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("kill");
        // Waits for the exit itself (waitpid on the blocking pool), 15 s at most.
        let exited = tokio::task::spawn_blocking(move || child.wait());
        match tokio::time::timeout(Duration::from_secs(15), exited).await {
            Ok(status) => status.expect("join").expect("wait"),
            Err(_) => panic!("{} did not exit after {signal}", service.name()),
        }
    }

    pub fn write_manifest(&self, file: &str, text: &str) {
        // Write then rename, as editors and config management do.
        let tmp = self.path(&format!("manifests/.{file}.tmp"));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, self.path(&format!("manifests/{file}"))).expect("rename manifest");
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.path(&format!("manifests/{file}"))).expect("remove manifest");
    }

    /// The full pod name a static pod named `name` gets on this node.
    pub fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.name)
    }

    /// `/pods` from the read-only port, as JSON items.
    pub async fn pods(&self) -> Result<Vec<serde_json::Value>, String> {
        let (code, body) = crate::http_get(self.read_only_port, "/pods").await?;
        if code != 200 {
            return Err(format!("/pods answered {code}: {body}"));
        }
        let list: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// CRI containers of pods of this node.
    pub async fn containers(&self) -> Vec<nodeagent_proto::cri::Container> {
        let all = self
            .cri
            .list_containers(None)
            .await
            .expect("ListContainers");
        let suffix = format!("-{}", self.name);
        all.into_iter()
            .filter(|c| {
                c.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with(&suffix))
            })
            .collect()
    }

    /// The CRI container ids (any state, sorted) of pod `namespace/pod_name` in this node's
    /// runtime, static or not (an API pod's name has no node suffix; the runtime is this
    /// node's alone while the test holds its lease).
    pub async fn runtime_container_ids(&self, namespace: &str, pod_name: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .cri
            .list_containers(None)
            .await
            .expect("ListContainers")
            .into_iter()
            .filter(|c| {
                c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(pod_name)
                    && c.labels
                        .get("io.kubernetes.pod.namespace")
                        .map(String::as_str)
                        == Some(namespace)
            })
            .map(|c| c.id)
            .collect();
        ids.sort();
        ids
    }

    /// The CRI container ids (any state, sorted) of the pod whose full name is `pod_name`.
    pub async fn container_ids(&self, pod_name: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .containers()
            .await
            .into_iter()
            .filter(|c| c.labels["io.kubernetes.pod.name"] == pod_name)
            .map(|c| c.id)
            .collect();
        ids.sort();
        ids
    }

    /// The id of the newest CRI container named `container` in pod `pod` (the name before
    /// the node suffix).
    pub async fn container_id(&self, pod: &str, container: &str) -> Option<String> {
        let full = self.pod_name(pod);
        self.containers()
            .await
            .into_iter()
            .filter(|c| {
                c.labels.get("io.kubernetes.pod.name") == Some(&full)
                    && c.metadata.as_ref().is_some_and(|m| m.name == container)
            })
            .max_by_key(|c| c.created_at)
            .map(|c| c.id)
    }

    /// The pid of this node's `service`, while the harness runs it.
    pub fn service_pid(&self, service: Service) -> Option<u32> {
        self.procs.get(&service).map(Child::id)
    }

    /// Stops the node's only sandbox behind the agent's back, as a crash of the pod's
    /// infrastructure would; returns its id.
    pub async fn stop_only_sandbox(&self) -> String {
        let old = self.sandboxes().await;
        assert_eq!(old.len(), 1, "one sandbox: {old:?}");
        let mut rt = self.cri.runtime.clone();
        rt.stop_pod_sandbox(nodeagent_proto::cri::StopPodSandboxRequest {
            pod_sandbox_id: old[0].id.clone(),
        })
        .await
        .expect("StopPodSandbox");
        old[0].id.clone()
    }

    /// Runs `cmd` in a container through CRI ExecSync; its stdout, or why it failed.
    pub async fn exec(&self, container_id: &str, cmd: &[&str]) -> Result<String, String> {
        let mut rt = self.cri.runtime.clone();
        let r = rt
            .exec_sync(nodeagent_proto::cri::ExecSyncRequest {
                container_id: container_id.to_string(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: 10,
            })
            .await
            .map_err(|e| e.message().to_string())?
            .into_inner();
        if r.exit_code != 0 {
            return Err(format!(
                "{cmd:?} exited {}: {}",
                r.exit_code,
                String::from_utf8_lossy(&r.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&r.stdout).into_owned())
    }

    pub async fn sandboxes(&self) -> Vec<nodeagent_proto::cri::PodSandbox> {
        let all = self.cri.list_sandboxes(None).await.expect("ListPodSandbox");
        let suffix = format!("-{}", self.name);
        all.into_iter()
            .filter(|s| {
                s.metadata
                    .as_ref()
                    .is_some_and(|m| m.name.ends_with(&suffix))
            })
            .collect()
    }

    /// Adds `extra` to the node's config (for services started after this), in place of
    /// the harness's defaults for the keys it sets.
    pub async fn append_config(&mut self, extra: &str) {
        let path = self.path("config.yaml");
        let mut config = std::fs::read_to_string(&path).expect("read config");
        for (key, line) in HARNESS_DEFAULTS {
            if extra.contains(key) {
                config = config.replace(line, "");
            }
        }
        config.push_str(extra);
        std::fs::write(&path, config).expect("write config");
        self.hold_images_if_collected(extra).await;
    }

    /// A node its test lets collect images (the image GC, or eviction, whose node-level
    /// reclaim removes every unused image) finds busybox in use from the start by a pod
    /// made directly over CRI, which no node sees (it has no pod labels) and
    /// `remove_sandboxes_of` removes with the node's own (its name ends with the node's).
    async fn hold_images_if_collected(&mut self, config: &str) {
        let lower = config.to_lowercase();
        if self.holds_images || !(lower.contains("imagegc") || lower.contains("eviction")) {
            return;
        }
        crate::raw_pod::raw_pod(
            &self.cri,
            "nodeagent-tests",
            &format!("image-holder-{}", self.name),
            "trap 'exit 0' TERM; while true; do sleep 60; done",
            &self.path("logs"),
            false,
        )
        .await;
        self.holds_images = true;
    }

    /// Stops every service with SIGTERM, then removes whatever CRI objects of this node
    /// are left (a failed test must not leak pods into the next).
    pub async fn stop(mut self) {
        let services: Vec<Service> = self.procs.keys().copied().collect();
        for s in services {
            let _ = self.signal(s, nix::sys::signal::Signal::SIGTERM).await;
        }
        let instances: Vec<String> = self.probe_instances.keys().cloned().collect();
        for id in instances {
            self.signal_probe_instance(&id, nix::sys::signal::Signal::SIGTERM)
                .await;
        }
        let instances: Vec<String> = self.http_instances.keys().cloned().collect();
        for id in instances {
            self.kill_http_server_instance(&id);
        }
        self.force_cleanup().await;
        self.stopped = true;
    }

    async fn force_cleanup(&self) {
        remove_sandboxes_of(&self.cri, &self.name).await;
        crate::unmount_all_under(self.dir.path());
    }
}

/// Stops and removes every sandbox (and so every container) of pods of node `name`.
async fn remove_sandboxes_of(cri: &Cri, name: &str) {
    use nodeagent_proto::cri::{RemovePodSandboxRequest, StopPodSandboxRequest};
    let suffix = format!("-{name}");
    let Ok(all) = cri.list_sandboxes(None).await else {
        return;
    };
    for s in all.into_iter().filter(|s| {
        s.metadata
            .as_ref()
            .is_some_and(|m| m.name.ends_with(&suffix))
    }) {
        let mut rt = cri.runtime.clone();
        let _ = rt
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: s.id.clone(),
            })
            .await;
        let _ = rt
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: s.id.clone(),
            })
            .await;
        if let Some(m) = &s.metadata {
            crate::cgroup::remove_pod(&m.uid);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        if std::thread::panicking() {
            // The services' own words are the best clue to a failure: show their tails.
            for s in Service::ALL {
                let log = self.log(s);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("----- {} log (last {} lines) -----", s.name(), tail.len());
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        if std::thread::panicking() {
            for id in self.probe_instances.keys() {
                let log = std::fs::read_to_string(self.path(&format!("logs/probe-{id}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                eprintln!("----- probe-{id} log (last {} lines) -----", tail.len());
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        for (_, mut child) in std::mem::take(&mut self.probe_instances)
            .into_iter()
            .chain(std::mem::take(&mut self.http_instances))
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        for (_, mut child) in std::mem::take(&mut self.procs) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failed test: remove its pods on a runtime of our own (the test's is unwinding).
        let name = self.name.clone();
        let endpoint = self.runtime().endpoint();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let cri = Cri::connect(&endpoint.parse().unwrap(), Duration::from_secs(30));
                remove_sandboxes_of(&cri, &name).await;
            });
        })
        .join();
        crate::unmount_all_under(self.dir.path());
    }
}

/// VmRSS of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_outside_the_ephemeral_range_and_not_handed_out_twice() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let mut it = range.split_whitespace().map(|v| v.parse::<u16>().unwrap());
        let (low, high) = (it.next().unwrap(), it.next().unwrap());
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        for p in &ports {
            assert!(
                !(low..=high).contains(p),
                "{p} is in the ephemeral range {low}-{high}"
            );
            assert!(*p >= 1024, "{p}");
        }
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
    }
}
