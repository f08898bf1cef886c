//! Who gets into the kubelet API and how much one client can take from the others:
//! TokenReview and SubjectAccessReview against the test API server (401 and 403 where
//! upstream gives them, and their caches), standalone nodes, the read-only port's default,
//! slow clients, 1,000 concurrent requests beside /healthz, and two http-server instances
//! sharing port 10250 through a restart.
//! Needs root and the containerd that `deploy/runtime/setup.sh` starts.

use nodeagent_config::Service;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::kubelet_client::{Credentials, KubeletClient};
use nodeagent_tests::pki::{Identity, TestCa};
use nodeagent_tests::websocket::ChannelClient;
use nodeagent_tests::{Node, NodeOptions, binary, eventually, require_runtime, wait_serving};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A client CA of the test's own, in a file the node's auth config can name before the
/// node's directory exists.
struct ClientCa {
    ca: TestCa,
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
}

impl ClientCa {
    fn new() -> ClientCa {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("kubelet-auth-test-ca");
        let file = dir.path().join("ca.crt");
        std::fs::write(&file, ca.cert_pem()).unwrap();
        ClientCa {
            ca,
            _dir: dir,
            file,
        }
    }

    fn admin(&self) -> Identity {
        self.ca.issue_client("test-admin", &["system:masters"])
    }
}

fn auth_config(ca: &Path, anonymous: bool, mode: &str) -> String {
    format!(
        "authentication:\n  x509:\n    clientCAFile: {}\n  webhook:\n    enabled: true\n    cacheTTL: 2m\n\
         \x20 anonymous:\n    enabled: {anonymous}\nauthorization:\n  mode: {mode}\n  webhook:\n\
         \x20   cacheAuthorizedTTL: 5m\n    cacheUnauthorizedTTL: 30s\n",
        ca.display()
    )
}

async fn wait_api(client: &KubeletClient) {
    eventually(
        "/healthz on the secure port",
        Duration::from_secs(30),
        || async {
            let r = client.get("/healthz").await?;
            (r.status == 200)
                .then_some(())
                .ok_or_else(|| format!("{}: {}", r.status, r.text()))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_and_access_are_reviewed_by_the_api_server_and_cached() {
    if !require_runtime("kubelet auth webhooks") {
        return;
    }
    let ca = ClientCa::new();
    let server = ApiServer::start(ApiState::default(), 0).await;
    let policy = server.state.auth.clone();
    policy.add_token("alice-token", "alice", &["dev"]);
    policy.add_token("bob-token", "bob", &[]);
    policy.allow("test-admin", "*", "*");
    policy.allow("alice", "get", "pods");
    policy.allow("alice", "get", "stats");
    let options = NodeOptions {
        kubeconfig: Some(server.kubeconfig()),
        auth_config: Some(auth_config(&ca.file, false, "Webhook")),
        ..NodeOptions::default()
    };
    let node = Node::start("kubelet_auth_webhooks", options).await;
    let admin = node.api.with(Credentials::Cert(ca.admin()));
    wait_api(&admin).await;

    // No credentials, a certificate from another CA, a token the API server rejects: 401.
    let none = node.api.with(Credentials::None).get("/pods").await.unwrap();
    assert_eq!((none.status, none.text().as_str()), (401, "Unauthorized"));
    let stranger = TestCa::new("another-ca").issue_client("test-admin", &["system:masters"]);
    let foreign = node
        .api
        .with(Credentials::Cert(stranger))
        .get("/pods")
        .await
        .unwrap();
    assert_eq!(
        (foreign.status, foreign.text().as_str()),
        (401, "Unauthorized")
    );
    let forged = node.api.with(Credentials::Token("forged".into()));
    for _ in 0..2 {
        let r = forged.get("/pods").await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (401, "Unauthorized"));
    }
    let reviews_of = |token: &str| {
        policy
            .token_reviews()
            .iter()
            .filter(|s| s["token"] == token)
            .count()
    };
    assert_eq!(
        reviews_of("forged"),
        1,
        "a rejected token is cached too, as upstream"
    );

    // A valid token that SubjectAccessReview denies: 403 with upstream's wording.
    let bob = node.api.with(Credentials::Token("bob-token".into()));
    let denied = bob.get("/pods").await.unwrap();
    assert_eq!(denied.status, 403);
    assert_eq!(
        denied.text(),
        "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    let denied = bob.get("/stats/summary").await.unwrap();
    assert_eq!(
        (denied.status, denied.text().as_str()),
        (
            403,
            "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[stats])\n"
        )
    );

    // Allowed: 200; the review named the node, the user and the fine-grained subresource.
    let alice = node.api.with(Credentials::Token("alice-token".into()));
    let pods = alice.get("/pods").await.unwrap();
    assert_eq!(pods.status, 200, "{}", pods.text());
    let asked: Vec<serde_json::Value> = policy
        .access_reviews()
        .into_iter()
        .filter(|s| s["user"] == "alice")
        .collect();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        asked[0]["groups"],
        serde_json::json!(["dev", "system:authenticated"])
    );
    assert_eq!(asked[0]["uid"], "alice-uid");
    let attrs = &asked[0]["resourceAttributes"];
    assert_eq!(attrs["resource"], "nodes");
    assert_eq!(attrs["name"], node.name.as_str());
    assert_eq!(attrs["subresource"], "pods");
    assert_eq!(attrs["verb"], "get");
    assert_eq!(attrs["version"], "v1");
    // A path without a fine-grained rule of its own falls back to proxy.
    let configz = alice.get("/configz").await.unwrap();
    assert_eq!(
        (configz.status, configz.text().as_str()),
        (
            403,
            "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[configz proxy])\n"
        )
    );

    // A WebSocket client (a browser) may carry its token as a subprotocol instead:
    // `/pods` answers 200 (not 101: it is no streaming endpoint) for alice, 403 for bob,
    // 401 for a forged token or a token with no other subprotocol to choose.
    let anonymous = node.api.with(Credentials::None);
    let as_protocol = |token: &str| {
        use base64::Engine;
        format!(
            "base64url.bearer.authorization.k8s.io.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
        )
    };
    for (protocols, status) in [
        (
            vec![as_protocol("alice-token"), "v4.channel.k8s.io".into()],
            200,
        ),
        (
            vec![as_protocol("bob-token"), "v4.channel.k8s.io".into()],
            403,
        ),
        (vec![as_protocol("forged"), "v4.channel.k8s.io".into()], 401),
        (vec![as_protocol("alice-token")], 401),
    ] {
        let protocols: Vec<&str> = protocols.iter().map(String::as_str).collect();
        match ChannelClient::connect(&anonymous, "/pods", &protocols).await {
            Err(Ok(refused)) => assert_eq!(refused.status, status, "{protocols:?}: {refused:?}"),
            Ok(_) => panic!("/pods upgraded"),
            Err(Err(e)) => panic!("{e}"),
        }
    }

    // Caching: more requests, no more reviews (allowed answers for 5m, denied for 30s).
    let (tokens_before, access_before) =
        (policy.token_reviews().len(), policy.access_reviews().len());
    for _ in 0..3 {
        assert_eq!(alice.get("/pods").await.unwrap().status, 200);
        assert_eq!(bob.get("/pods").await.unwrap().status, 403);
    }
    assert_eq!(policy.token_reviews().len(), tokens_before);
    assert_eq!(policy.access_reviews().len(), access_before);
    assert_eq!(reviews_of("alice-token"), 1);
    assert_eq!(reviews_of("bob-token"), 1);

    // x509 users are authorized through the webhook too.
    assert_eq!(admin.get("/configz").await.unwrap().status, 200);
    assert!(
        policy
            .access_reviews()
            .iter()
            .any(|s| s["user"] == "test-admin"
                && s["groups"] == serde_json::json!(["system:masters", "system:authenticated"]))
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standalone_node_with_webhook_modes_refuses_clearly() {
    if !require_runtime("standalone webhook modes") {
        return;
    }
    let ca = ClientCa::new();
    let options = NodeOptions {
        auth_config: Some(auth_config(&ca.file, true, "Webhook")),
        ..NodeOptions::default()
    };
    let node = Node::start("kubelet_auth_standalone", options).await;
    let admin = node.api.with(Credentials::Cert(ca.admin()));
    let forbidden = eventually("the secure port", Duration::from_secs(30), || async {
        let r = admin.get("/pods").await?;
        (r.status == 403)
            .then_some(r)
            .ok_or_else(|| "not yet 403".to_string())
    })
    .await;
    let text = forbidden.text();
    assert!(
        text.starts_with(
            "Forbidden (user=test-admin, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("standalone") && text.contains("AlwaysAllow"),
        "{text}"
    );
    // No API server to review tokens: 401, even with anonymous enabled (a credential
    // that fails is never taken for anonymous).
    let token = node.api.with(Credentials::Token("some-token".into()));
    let r = token.get("/pods").await.unwrap();
    assert_eq!((r.status, r.text().as_str()), (401, "Unauthorized"));
    // Anonymous is authenticated, then denied like everyone else.
    let anonymous = node
        .api
        .with(Credentials::None)
        .get("/healthz")
        .await
        .unwrap();
    assert_eq!(anonymous.status, 403);
    assert!(
        anonymous.text().contains("user=system:anonymous"),
        "{}",
        anonymous.text()
    );
    let log = node.log(Service::HttpServer);
    assert!(log.contains("bearer tokens cannot be reviewed"), "{log}");
    node.stop().await;
}

/// Writes `request` on a fresh TLS connection and reads until the server closes it or
/// `limit` passes; returns what was read and how long the server took to close.
async fn exchange(
    client: &KubeletClient,
    request: &[u8],
    limit: Duration,
) -> (String, Option<Duration>) {
    let mut stream = client.connect().await.unwrap();
    stream.write_all(request).await.unwrap();
    stream.flush().await.unwrap();
    read_until_closed(&mut stream, limit).await
}

async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> (String, Option<Duration>) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (
                    String::from_utf8_lossy(&got).into_owned(),
                    Some(started.elapsed()),
                );
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), None),
        }
    }
}

/// The node's config.yaml without its `readOnlyPort` line: upstream's default applies.
fn drop_read_only_port(node: &Node) {
    let path = node.path("config.yaml");
    let config = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = config
        .lines()
        .filter(|l| !l.starts_with("readOnlyPort:"))
        .collect();
    assert_eq!(kept.len() + 1, config.lines().count());
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_clients_are_cut_off_and_the_read_only_port_is_off_by_default() {
    if !require_runtime("slow clients") {
        return;
    }
    let options = NodeOptions {
        no_services: true,
        ..NodeOptions::default()
    };
    let mut node = Node::start("kubelet_slow_clients", options).await;
    drop_read_only_port(&node);
    for s in Service::ALL {
        node.spawn(s);
    }
    wait_api(&node.api).await;

    // readOnlyPort unset: 0, nothing listens.
    let configz = node.api.get("/configz").await.unwrap();
    let config: serde_json::Value = serde_json::from_slice(&configz.body).unwrap();
    assert_eq!(config["kubeletconfig"]["readOnlyPort"], 0);
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", node.read_only_port)).await;
    assert_eq!(
        refused.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );

    // Oversized heads and bodies are refused without reading them.
    let big_header = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 << 10)
    );
    let (reply, _) = exchange(&node.api, big_header.as_bytes(), Duration::from_secs(10)).await;
    assert!(reply.starts_with("HTTP/1.1 431"), "{reply}");
    let big_body = "POST /pods HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n";
    let (reply, _) = exchange(&node.api, big_body.as_bytes(), Duration::from_secs(10)).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");

    // Slow clients, all at once: half a request head, nothing at all after the TLS
    // handshake, an HTTP/2 client that never sends its preface, a TCP connection that never
    // starts TLS, half a head on the healthz port. Each is cut off within the 10 s limits.
    let cut = Duration::from_secs(16);
    let half_head = exchange(&node.api, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", cut);
    let silent = exchange(&node.api, b"", cut);
    let h2_client = {
        let mut h2 = node.api.clone();
        h2.credentials = Credentials::None;
        async move {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", h2.port))
                .await
                .unwrap();
            let mut tls = (*h2.tls_config().unwrap()).clone();
            tls.alpn_protocols = vec![b"h2".to_vec()];
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut stream = connector.connect(name, tcp).await.unwrap();
            assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
            read_until_closed(&mut stream, cut).await
        }
    };
    let no_tls = async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", node.port))
            .await
            .unwrap();
        read_until_closed(&mut tcp, cut).await
    };
    let healthz_port = async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", node.healthz_port))
            .await
            .unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        read_until_closed(&mut tcp, cut).await
    };
    let (half_head, silent, h2_client, no_tls, healthz_port) =
        tokio::join!(half_head, silent, h2_client, no_tls, healthz_port);
    for (what, (reply, closed)) in [
        ("half a head", half_head),
        ("a silent client", silent),
        ("an HTTP/2 client without its preface", h2_client),
        ("a client that never starts TLS", no_tls),
        ("half a head on the healthz port", healthz_port),
    ] {
        let closed = closed.unwrap_or_else(|| panic!("{what} was not cut off within {cut:?}"));
        assert!(
            closed >= Duration::from_secs(5),
            "{what} was cut off after only {closed:?}"
        );
        assert!(!reply.contains(" 200 "), "{what} got an answer: {reply}");
    }
    // And the node still answers.
    assert_eq!(node.api.get("/healthz").await.unwrap().status, 200);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_concurrent_requests_leave_healthz_answering() {
    if !require_runtime("healthz under load") {
        return;
    }
    let node = Node::start("kubelet_api_load", NodeOptions::default()).await;
    wait_api(&node.api).await;
    // Slow clients that hold connections open for the whole run.
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut s = node.api.connect().await.unwrap();
        s.write_all(b"GET /pods HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    let load = tokio::spawn({
        let api = node.api.clone();
        async move {
            let requests = (0..1000).map(|i| {
                let api = api.clone();
                tokio::spawn(async move {
                    let path = ["/pods", "/metrics", "/healthz", "/configz"][i % 4];
                    api.get(path).await.map(|r| r.status)
                })
            });
            let results = futures::future::join_all(requests).await;
            results
                .into_iter()
                .map(|r| r.map_err(|e| e.to_string()).and_then(|r| r))
                .collect::<Vec<_>>()
        }
    });
    // /healthz on both ports while the load runs: the checks themselves run apart from
    // the load, so the answer is right (200) and comes in bounded time.
    let mut probes = 0;
    let (mut slowest_plain, mut slowest_secure) = (Duration::ZERO, Duration::ZERO);
    while !load.is_finished() {
        let started = Instant::now();
        let plain = nodeagent_tests::http_get(node.healthz_port, "/healthz").await;
        slowest_plain = slowest_plain.max(started.elapsed());
        assert!(
            matches!(&plain, Ok((200, _))),
            "healthz port under load: {plain:?}"
        );
        let started = Instant::now();
        let secure = node.api.get("/healthz").await.map(|r| (r.status, r.text()));
        slowest_secure = slowest_secure.max(started.elapsed());
        assert!(
            matches!(&secure, Ok((200, _))),
            "/healthz on 10250 under load: {secure:?}"
        );
        probes += 1;
    }
    let results = load.await.unwrap();
    let failed: Vec<_> = results.iter().filter(|r| **r != Ok(200)).collect();
    assert!(
        failed.is_empty(),
        "{} of 1000 failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    assert!(probes >= 1, "the load ended before /healthz was asked");
    eprintln!(
        "1000 requests: /healthz asked {probes} times on both ports, slowest \
         {slowest_plain:?} (healthz port) and {slowest_secure:?} (10250, a new TLS connection)"
    );
    assert!(slowest_plain < Duration::from_secs(5), "{slowest_plain:?}");
    assert!(
        slowest_secure < Duration::from_secs(10),
        "{slowest_secure:?}"
    );
    drop(held);
    node.stop().await;
}

/// A second http-server process of the same node, on its own gRPC socket.
struct SecondInstance {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl SecondInstance {
    fn spawn(node: &Node) -> SecondInstance {
        let socket = node.path("sockets/http-server-2.sock");
        let log = std::fs::File::create(node.path("logs/http-server-2.log")).unwrap();
        let child = std::process::Command::new(binary(Service::HttpServer))
            .args(node.args())
            .arg("--service-endpoint")
            .arg(format!("http-server=unix://{}", socket.display()))
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        SecondInstance { child, socket }
    }

    async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        eventually(
            "the second instance to exit",
            Duration::from_secs(15),
            || {
                let exited = self.child.try_wait().unwrap().is_some();
                async move { exited.then_some(()).ok_or_else(|| "running".to_string()) }
            },
        )
        .await;
    }
}

impl Drop for SecondInstance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    refused: usize,
    other: Vec<String>,
}

/// Clients hammering the shared port at once in the restart test.
const CLIENTS: usize = 6;

/// Two instances share 10250; each is stopped in turn while clients keep connecting. No
/// connection may be refused or reset: the stopping instance drains its accept queue, and
/// with `net.ipv4.tcp_migrate_req=1` (which http-server sets) SYNs that reach its listener
/// as it closes move to the other instance.
#[tokio::test(flavor = "multi_thread")]
async fn two_instances_share_the_port_and_a_restart_refuses_no_connection() {
    if !require_runtime("SO_REUSEPORT") {
        return;
    }
    // The sysctl is the host's and outlives every run: reset it, so that only this node's
    // http-server can have set it back (this test holds the host alone: .config/nextest.toml).
    std::fs::write("/proc/sys/net/ipv4/tcp_migrate_req", "0").expect("reset tcp_migrate_req");
    let mut node = Node::start("kubelet_reuseport", NodeOptions::default()).await;
    wait_api(&node.api).await;
    let second = SecondInstance::spawn(&node);
    let second_address = nodeagent_config::Address::Unix(second.socket.clone());
    wait_serving(&second_address, "the second http-server").await;
    let second_log = node.path("logs/http-server-2.log");
    eventually(
        "the second instance on the secure port",
        Duration::from_secs(10),
        || async {
            let log = std::fs::read_to_string(&second_log).unwrap_or_default();
            log.contains("serving the kubelet API over TLS")
                .then_some(())
                .ok_or(log)
        },
    )
    .await;

    // Clients that ask /healthz over a new connection, again and again, several at once so
    // that SYNs keep arriving while an instance closes its listener.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Answers so far, for the phases below to wait on.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let looping: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let api = node.api.clone();
            let stop = stop.clone();
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    match api.get("/healthz").await {
                        Ok(r) if r.status == 200 => {
                            tally.ok += 1;
                            answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(r) => tally.other.push(format!("{}: {}", r.status, r.text())),
                        Err(e) if e.contains("refused") => tally.refused += 1,
                        Err(e) => tally.other.push(e),
                    }
                }
                tally
            })
        })
        .collect();
    // Stop the first instance: the second serves alone. Then start the first again and
    // stop the second: the first serves alone.
    // Each phase lasts until the client has had this many more answers.
    let answers = |n: usize| {
        let answered = answered.clone();
        async move {
            let until = answered.load(std::sync::atomic::Ordering::SeqCst) + n;
            eventually(
                "answers to the looping client",
                Duration::from_secs(30),
                || {
                    let seen = answered.load(std::sync::atomic::Ordering::SeqCst);
                    async move {
                        (seen >= until)
                            .then_some(())
                            .ok_or(format!("{seen} of {until}"))
                    }
                },
            )
            .await;
        }
    };
    answers(10).await;
    let status = node
        .signal(Service::HttpServer, nix::sys::signal::Signal::SIGTERM)
        .await;
    assert!(status.success(), "the first instance exited with {status}");
    answers(20).await;
    node.spawn(Service::HttpServer);
    node.wait_serving(Service::HttpServer).await;
    // The restarted instance listens on the secure port again (its log says so twice).
    eventually(
        "the restarted instance on the secure port",
        Duration::from_secs(10),
        || {
            let log = node.log(Service::HttpServer);
            let listening = log.matches("serving the kubelet API over TLS").count();
            async move {
                (listening >= 2)
                    .then_some(())
                    .ok_or(format!("{listening} listens logged"))
            }
        },
    )
    .await;
    answers(10).await;
    second.stop().await;
    answers(20).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut tally = Tally::default();
    for client in looping {
        let t = client.await.unwrap();
        tally.ok += t.ok;
        tally.refused += t.refused;
        tally.other.extend(t.other);
    }
    eprintln!("through two restarts: {tally:?}");
    assert_eq!(tally.refused, 0, "{tally:?}");
    assert!(tally.other.is_empty(), "{tally:?}");
    assert!(tally.ok > 20, "{tally:?}");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req")
            .map(|v| v.trim().to_string())
            .ok()
            .as_deref(),
        Some("1"),
        "http-server sets net.ipv4.tcp_migrate_req"
    );
    node.stop().await;
}

/// upstream: apiserver's x509 CommonNameUserConversion gives no user for a certificate
/// without a CN (x509_test.go "empty dn"). Attack: a certificate from the trusted client CA
/// with an empty CN and O=system:masters, against a node that allows every authenticated
/// user (AlwaysAllow) and no anonymous access: it must get 401, not user "".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_without_a_common_name_is_not_a_user() {
    if !require_runtime("x509 empty CN") {
        return;
    }
    let node = Node::start("kubelet-empty-cn", NodeOptions::default()).await;
    wait_api(&node.api).await;
    let nameless = KubeletClient {
        port: node.port,
        server_cert: node.api.server_cert.clone(),
        credentials: Credentials::Cert(node.ca.issue_client("", &["system:masters"])),
    };
    for path in ["/pods", "/configz", "/runningpods/"] {
        let r = nameless.get(path).await.expect("request");
        assert_eq!(r.status, 401, "{path}: {}", r.text());
    }
    // The same CA's named certificate still gets in.
    assert_eq!(node.api.get("/pods").await.expect("request").status, 200);
    node.stop().await;
}
