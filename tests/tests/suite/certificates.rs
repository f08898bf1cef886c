//! The certificate manager against the test API server over TLS (`apiserver_csr`: client
//! certificates authenticate each request at request time, a CSR approver and a signer
//! with lifetimes of seconds):
//!
//! - the client certificate is bootstrapped from a bootstrap token (a CSR for
//!   `system:node:<n>` in `system:nodes`, approved, written to `--cert-dir` and a
//!   kubeconfig), then rotated at 70–90 % of its 30 s lifetime while the pod watch opened
//!   with the first certificate stays open: a pod created after the first certificate
//!   expired still reaches the node through that watch, no second pod watch is opened,
//!   no request is refused, and a running pod's phase and readiness never move;
//! - the serving certificate (`serverTLSBootstrap`): a denied CSR is logged and counted
//!   and retried; a pending one is reported with its name until `kubectl certificate
//!   approve` approves it; the issued pair is served, and it is rotated while a
//!   `/pods` loop (a new TLS connection per request, plus one keep-alive connection
//!   opened before the rotation) never fails.
//!
//! Needs root and containerd.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use nodeagent_config::Service;
use nodeagent_config::certificate::Pair;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::apiserver_csr::{Approval, Logged};
use nodeagent_tests::kubelet_client::{Credentials, KubeletClient};
use nodeagent_tests::pki::Identity;
use nodeagent_tests::{Node, NodeOptions, api_pod, api_pod_in_phase, eventually, require_runtime};
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

const DEADLINE: Duration = Duration::from_secs(90);
const TOKEN: &str = "abcdef.0123456789abcdef";
const LIFETIME: Duration = Duration::from_secs(30);

/// The API server over TLS with the bootstrap token, 30 s certificates, and `serving` for
/// serving CSRs.
async fn tls_server(serving: Approval) -> ApiServer {
    let server = ApiServer::start_tls(ApiState::default()).await;
    server.state.certificates.add_bootstrap_token(TOKEN);
    server.state.certificates.set_lifetime(LIFETIME);
    server.state.certificates.set_serving_approval(serving);
    server
}

fn current(node: &Node, which: &str) -> Result<Pair, String> {
    Pair::read(&node.path(&format!("cert-dir/kubelet-{which}-current.pem")))
        .map_err(|e| format!("{e:#}"))
}

/// The node's requests (any service) in the server's log.
fn from_node(server: &ApiServer, node: &Node) -> Vec<Logged> {
    let user = format!("system:node:{}", node.name);
    server
        .state
        .certificates
        .log()
        .into_iter()
        .filter(|l| l.user == user)
        .collect()
}

fn pod_watches(log: &[Logged], node: &Node) -> Vec<Logged> {
    log.iter()
        .filter(|l| {
            l.path == "/api/v1/pods"
                && l.query.contains("watch=true")
                && l.query.contains(&node.name)
        })
        .cloned()
        .collect()
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A node whose client certificate is bootstrapped from `server` with `extra` config.
async fn bootstrapped_node(server: &ApiServer, test: &str, extra: &str) -> Node {
    Node::start(
        test,
        NodeOptions {
            bootstrap_kubeconfig: Some(server.bootstrap_kubeconfig(TOKEN)),
            extra_config: extra.into(),
            ..Default::default()
        },
    )
    .await
}

/// Creates pod `name` on the node and waits until it is Running and Ready.
async fn ready_pod(pods: &Api<Pod>, node: &Node, name: &str) -> String {
    let name = node.pod_name(name);
    pods.create(
        &PostParams::default(),
        &api_pod(&name, &node.name, serde_json::json!({})),
    )
    .await
    .unwrap();
    api_pod_in_phase(pods, &name, "Running", DEADLINE).await;
    eventually(&format!("{name} Ready"), DEADLINE, || async {
        let p = pods.get(&name).await.map_err(|e| e.to_string())?;
        ready(&p).then_some(()).ok_or("not Ready".to_string())
    })
    .await;
    name
}

/// Samples what users see of a running pod (phase and readiness at the API) until
/// stopped; every sample that is not Running and Ready is a flip.
struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Sampler {
    fn start(pods: &Api<Pod>, name: &str) -> Sampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (pods, name, stopped) = (pods.clone(), name.to_string(), stop.clone());
        let task = tokio::spawn(async move {
            let mut flips = Vec::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                match pods.get(&name).await {
                    Ok(p) => {
                        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                        if phase.as_deref() != Some("Running") || !ready(&p) {
                            flips.push(format!("{phase:?} ready={}", ready(&p)));
                        }
                    }
                    Err(e) => flips.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            flips
        });
        Sampler { stop, task }
    }

    async fn flips(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_is_bootstrapped_and_rotated_under_an_open_pod_watch() {
    if !require_runtime("the certificate manager") {
        return;
    }
    let server = tls_server(Approval::Manual).await;
    let node = bootstrapped_node(&server, "clientcert", "rotateCertificates: true\n").await;

    // Bootstrap: the CSR came from the bootstrap token and was approved; the pair and the
    // kubeconfig are in place, and the node now speaks as itself.
    let first = eventually("the bootstrapped client certificate", DEADLINE, || async {
        current(&node, "client")
    })
    .await;
    // The kubeconfig is written right after the pair.
    eventually("the written kubeconfig", DEADLINE, || async {
        nodeagent_config::certificate::kubeconfig_usable(&node.path("kubeconfig"))
            .then_some(())
            .ok_or("not yet".to_string())
    })
    .await;
    let csrs = Api::<CertificateSigningRequest>::all(server.client())
        .list(&Default::default())
        .await
        .unwrap();
    let bootstrap_csr = csrs
        .items
        .iter()
        .find(|c| c.spec.username.as_deref() == Some("system:bootstrap:abcdef"))
        .expect("a CSR from the bootstrap token");
    assert_eq!(
        bootstrap_csr.spec.signer_name,
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let early = ready_pod(&pods, &node, "early").await;
    let watches_before = pod_watches(&from_node(&server, &node), &node);
    assert!(
        watches_before
            .iter()
            .any(|w| w.serial.as_deref() == Some(first.serial.as_str())),
        "the pod watch is opened with the first certificate: {watches_before:?}"
    );

    // Watch what users see while the certificate rotates: the running pod must stay
    // Running and Ready throughout.
    let sampler = Sampler::start(&pods, &early);

    // Rotation at 70–90 % of 30 s, with no restart.
    let second = eventually("the rotated client certificate", DEADLINE, || async {
        let now = current(&node, "client")?;
        (now.serial != first.serial)
            .then_some(now)
            .ok_or("not rotated yet".to_string())
    })
    .await;
    let lived = SystemTime::now()
        .duration_since(first.not_before)
        .unwrap_or_default();
    assert!(
        lived >= LIFETIME.mul_f64(0.65),
        "rotated after {lived:?}, before 70 % of {LIFETIME:?}"
    );
    eventually("a request with the new certificate", DEADLINE, || async {
        from_node(&server, &node)
            .iter()
            .any(|l| l.serial.as_deref() == Some(second.serial.as_str()))
            .then_some(())
            .ok_or("none yet".to_string())
    })
    .await;
    // The first certificate expires; the watch it opened must still deliver.
    refused_once_expired(&server, &node, &first).await;
    ready_pod(&pods, &node, "late").await;

    let log = from_node(&server, &node);
    let watches_after = pod_watches(&log, &node);
    assert_eq!(
        watches_after.len(),
        watches_before.len(),
        "a pod watch was opened again: {watches_after:?}"
    );
    let refused: Vec<_> = log
        .iter()
        .filter(|l| l.status == 401 && !l.query.contains(EXPIRY_PROBE))
        .collect();
    assert!(refused.is_empty(), "requests refused: {refused:?}");
    assert!(
        node.log(Service::NodeStatus).contains("certificate issued"),
        "node-status logs the rotation"
    );
    let flips = sampler.flips().await;
    assert!(flips.is_empty(), "the running pod moved: {flips:?}");

    let metrics = node.api.get("/metrics").await.expect("metrics").text();
    let ttl = metric(&metrics, "kubelet_certificate_manager_client_ttl_seconds");
    assert!(ttl > 0.0 && ttl <= LIFETIME.as_secs_f64(), "{ttl}");
    assert_eq!(
        metric(
            &metrics,
            "kubelet_certificate_manager_client_expiration_renew_errors"
        ),
        0.0
    );
    // Served under upstream's exact name, without `_total` (kubernetes-mixin's
    // KubeletClientCertificateRenewalErrors reads it so).
    assert!(
        metrics.contains(
            "# TYPE kubelet_certificate_manager_client_expiration_renew_errors counter\n"
        ),
        "{metrics}"
    );
    node.stop().await;
}

/// The API server's CA, in a file of the node's directory (to verify a server with it).
fn ca_file(server: &ApiServer, node: &Node) -> std::path::PathBuf {
    let ca = node.path("apiserver-ca.crt");
    std::fs::write(&ca, server.state.root_ca_pem()).unwrap();
    ca
}

/// Marks the test's own requests with an expired certificate in the server's log.
const EXPIRY_PROBE: &str = "labelSelector=test-expiry-probe";

/// Waits until the API server refuses `pair`: it accepts it (200) until it expires, then
/// refuses the handshake or answers 401. Under TLS 1.3 the server checks the client's
/// certificate after the client has finished its side of the handshake, so the refusal
/// may arrive as the server's fatal alert on the request instead (a run failed on that).
/// The test makes these requests itself (marked with [`EXPIRY_PROBE`]), as the node whose
/// certificate it is.
async fn refused_once_expired(server: &ApiServer, node: &Node, pair: &Pair) {
    let client = KubeletClient {
        port: server.port,
        server_cert: ca_file(server, node),
        credentials: Credentials::Cert(Identity {
            cert_pem: pair.cert_pem.clone(),
            key_pem: pair.key_pem.clone(),
        }),
    };
    let deadline = LIFETIME + DEADLINE;
    eventually(
        "the API server refuses the expired certificate",
        deadline,
        || async {
            match client.get(&format!("/api/v1/nodes?{EXPIRY_PROBE}")).await {
                Ok(r) if r.status == 401 => Ok(()),
                Ok(r) => Err(format!("still answered {}", r.status)),
                Err(e) if refused_on_tls(&e) => Ok(()),
                Err(e) => Err(e),
            }
        },
    )
    .await;
}

/// Whether a request's error is the server's TLS refusal: the handshake failed, or (TLS
/// 1.3) the server's fatal alert, or its close right after it, came on the request.
fn refused_on_tls(error: &str) -> bool {
    error.starts_with("TLS")
        || [
            "received fatal alert",
            "Connection reset by peer",
            "connection closed before message completed",
        ]
        .iter()
        .any(|s| error.contains(s))
}

/// `kubectl certificate approve <csr>`, as an administrator approves a serving CSR.
async fn kubectl_approve(server: &ApiServer, node: &Node, csr: &str) {
    let kubeconfig = node.path("admin.kubeconfig");
    std::fs::write(&kubeconfig, server.admin_kubeconfig()).unwrap();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(node.path("kubectl-cache"))
        .args(["certificate", "approve", csr])
        .env("HOME", node.path("."))
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("kubectl (deploy/runtime/setup.sh installs kubernetes-client)");
    assert!(
        out.status.success(),
        "kubectl certificate approve {csr}: {}{}\nits requests: {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server
            .state
            .certificates
            .log()
            .into_iter()
            .filter(|l| l.user == "test-admin")
            .collect::<Vec<_>>()
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("approved"), "{said}");
}

/// The value of a series without labels (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// One TLS connection to the node's port 10250, verifying the serving certificate
/// against the API server's CA under the node's name; returns the HTTP sender and the
/// serial of the certificate served.
async fn connect(node: &Node, ca: &std::path::Path) -> Result<(Sender, String), String> {
    let client = KubeletClient {
        server_cert: ca.to_path_buf(),
        ..node.api.clone()
    };
    let stream = client.connect_as(&node.name).await?;
    let der = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no server certificate")?
        .to_vec();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| e.to_string())?;
    let serial = cert.raw_serial_as_string().replace(':', "").to_uppercase();
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok((sender, serial))
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>;

async fn get_pods(sender: &mut Sender, node: &Node) -> Result<(), String> {
    let body = get(sender, node, "/pods").await?;
    if !body.starts_with('{') {
        return Err(format!("not a pod list: {body}"));
    }
    Ok(())
}

/// GET `path` over the connection as the node's admin; the body of a 200.
async fn get(sender: &mut Sender, node: &Node, path: &str) -> Result<String, String> {
    use http_body_util::BodyExt;
    sender.ready().await.map_err(|e| e.to_string())?;
    let request = hyper::Request::get(path)
        .header("host", format!("{}:{}", node.name, node.port))
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    if status != 200 {
        return Err(format!("{status}: {body}"));
    }
    Ok(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificate_denied_then_issued_and_rotated_under_a_request_loop() {
    if !require_runtime("the certificate manager") {
        return;
    }
    let server = tls_server(Approval::Deny("NotTrusted".into())).await;
    let node = bootstrapped_node(
        &server,
        "servingcert",
        "rotateCertificates: true\nserverTLSBootstrap: true\n",
    )
    .await;

    // Denied: a clear error in the log, counted, retried; the self-signed pair is served
    // meanwhile.
    eventually("the denial in http-server's log", DEADLINE, || async {
        let log = node.log(Service::HttpServer);
        log.contains("was denied, reason: NotTrusted")
            .then_some(())
            .ok_or("not yet".to_string())
    })
    .await;
    let metrics = node.api.get("/metrics").await.expect("metrics").text();
    // Upstream's name, without `_total` (kubernetes-mixin's
    // KubeletServerCertificateRenewalErrors reads it so).
    assert!(metric(&metrics, "kubelet_server_expiration_renew_errors") >= 1.0);

    // Pending: upstream's default for serving CSRs (nobody approves them automatically).
    // The wait is reported with the CSR's name, and `kubectl certificate approve` ends it.
    server
        .state
        .certificates
        .set_serving_approval(Approval::Manual);
    let pending = eventually("a pending serving CSR reported", DEADLINE, || async {
        let log = node.log(Service::HttpServer);
        let line = log
            .lines()
            .rfind(|l| l.contains("is still not approved and signed"))
            .ok_or("no reminder yet")?;
        let name = line
            .split("kubectl certificate approve ")
            .nth(1)
            .and_then(|r| r.split(|c: char| c == '"' || c.is_whitespace()).next())
            .ok_or(format!("no CSR name in {line}"))?;
        Ok::<_, String>(name.to_string())
    })
    .await;
    kubectl_approve(&server, &node, &pending).await;
    let approved = Api::<CertificateSigningRequest>::all(server.client())
        .get(&pending)
        .await
        .unwrap();
    let conditions = approved
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c.type_ == "Approved"
            && c.status == "True"
            && c.reason.as_deref() == Some("KubectlApprove")),
        "{conditions:?}"
    );
    let first = eventually("the issued serving certificate", DEADLINE, || async {
        current(&node, "server")
    })
    .await;
    server
        .state
        .certificates
        .set_serving_approval(Approval::Auto);
    let csrs = Api::<CertificateSigningRequest>::all(server.client())
        .list(&Default::default())
        .await
        .unwrap();
    assert!(csrs.items.iter().any(|c| {
        c.spec.signer_name == "kubernetes.io/kubelet-serving"
            && c.spec.username.as_deref() == Some(&format!("system:node:{}", node.name))
    }));
    let ca = ca_file(&server, &node);

    // The issued pair is served (verified against the cluster CA under the node's name).
    let (mut kept, served) = eventually("the issued pair served", DEADLINE, || async {
        let (sender, serial) = connect(&node, &ca).await?;
        (serial == first.serial)
            .then_some((sender, serial))
            .ok_or("not served yet".to_string())
    })
    .await;
    get_pods(&mut kept, &node)
        .await
        .expect("/pods over the kept connection");

    // A /pods loop until a rotated certificate is served: a new connection per request,
    // and the connection opened before the rotation reused each time.
    let mut serials = BTreeSet::from([served]);
    let mut failures = Vec::new();
    let mut requests = 0;
    let started = std::time::Instant::now();
    while serials.len() < 2 && started.elapsed() < DEADLINE {
        match connect(&node, &ca).await {
            Ok((mut sender, serial)) => {
                serials.insert(serial);
                if let Err(e) = get_pods(&mut sender, &node).await {
                    failures.push(format!("new connection: {e}"));
                }
            }
            Err(e) => failures.push(format!("connect: {e}")),
        }
        if let Err(e) = get_pods(&mut kept, &node).await {
            failures.push(format!("kept connection: {e}"));
        }
        requests += 1;
    }
    assert!(
        failures.is_empty(),
        "{} of {requests} failed: {failures:?}",
        failures.len()
    );
    assert_eq!(
        serials.len(),
        2,
        "no rotation within {DEADLINE:?}: {serials:?}"
    );
    let second = current(&node, "server").unwrap();
    assert!(serials.contains(&second.serial));

    let metrics = get(&mut kept, &node, "/metrics").await.expect("metrics");
    assert!(
        metric(
            &metrics,
            "kubelet_certificate_manager_server_rotation_seconds_count"
        ) >= 1.0
    );
    let ttl = metric(&metrics, "kubelet_certificate_manager_server_ttl_seconds");
    assert!(ttl > 0.0 && ttl <= LIFETIME.as_secs_f64(), "{ttl}");
    node.stop().await;
}

/// A small fixed-seed generator for kill moments (the same run every time).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_managers_survive_sigkill_and_an_expired_client_certificate() {
    if !require_runtime("the certificate manager") {
        return;
    }
    use nix::sys::signal::Signal;
    let server = tls_server(Approval::Auto).await;
    let mut node = bootstrapped_node(
        &server,
        "certkill",
        "rotateCertificates: true\nserverTLSBootstrap: true\n",
    )
    .await;
    let client_first = eventually("the client certificate", DEADLINE, || async {
        current(&node, "client")
    })
    .await;
    let server_first = eventually("the serving certificate", DEADLINE, || async {
        current(&node, "server")
    })
    .await;
    let ca = ca_file(&server, &node);
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let steady = ready_pod(&pods, &node, "steady").await;
    let sampler = Sampler::start(&pods, &steady);

    // SIGKILL the two managers at random moments across the first rotation window.
    let mut random = Lcg(14);
    let started = std::time::Instant::now();
    let mut kills = 0;
    while kills < 4
        || (current(&node, "client").map(|p| p.serial) == Ok(client_first.serial.clone())
            || current(&node, "server").map(|p| p.serial) == Ok(server_first.serial.clone()))
    {
        assert!(
            started.elapsed() < DEADLINE,
            "the certificates were not rotated within {DEADLINE:?} of kills"
        );
        tokio::time::sleep(Duration::from_millis(500 + 500 * random.below(12))).await;
        let service = if random.below(2) == 0 {
            Service::NodeStatus
        } else {
            Service::HttpServer
        };
        node.signal(service, Signal::SIGKILL).await;
        node.spawn(service);
        node.wait_serving(service).await;
        kills += 1;
        if service == Service::HttpServer {
            // The issued pair is served again at once, not the self-signed one.
            let now = current(&node, "server").unwrap();
            let (_, served) = connect(&node, &ca)
                .await
                .expect("a verified TLS connection after the restart");
            assert_eq!(
                served, now.serial,
                "http-server serves the issued pair after a restart"
            );
        }
    }
    let bootstraps = |server: &ApiServer| {
        server
            .state
            .objects("certificatesigningrequests")
            .iter()
            .filter(|c| c["spec"]["username"] == "system:bootstrap:abcdef")
            .count()
    };
    assert_eq!(bootstraps(&server), 1, "a restart bootstrapped again");

    // node-status is down until the client certificate expired: upstream's kubelet then
    // fails to start; ours bootstraps again with the bootstrap token, and the other
    // services follow the new files.
    node.signal(Service::NodeStatus, Signal::SIGKILL).await;
    let expiring = current(&node, "client").unwrap();
    refused_once_expired(&server, &node, &expiring).await;
    assert!(!expiring.valid_now());
    node.spawn(Service::NodeStatus);
    node.wait_serving(Service::NodeStatus).await;
    assert_eq!(
        bootstraps(&server),
        2,
        "the expired certificate was bootstrapped again"
    );
    let renewed = current(&node, "client").unwrap();
    assert!(renewed.valid_now());
    ready_pod(&pods, &node, "after").await;

    let flips = sampler.flips().await;
    assert!(flips.is_empty(), "the running pod moved: {flips:?}");
    node.stop().await;
}
