//! Port 10250 under abuse by clients that never authenticate, while an authorized client
//! (x509, Webhook authorization) keeps getting `/pods` and an exec answered within a stated
//! time. Each flood is bounded in count and time and stays on loopback:
//! - bogus bearer tokens against a slow API server (each one a 2 s TokenReview): they
//!   once took every in-flight slot before authentication; now only authorized requests
//!   take a slot and token reviews queue among themselves;
//! - slow TLS handshakes, more than the connection cap: the cap was taken before the
//!   handshake, so they filled it; now handshakes take no slot;
//! - idle HTTP/2 connections that answer keep-alive pings: they were never closed; now
//!   one with no request under way is closed after the idle timeout (upstream's
//!   `IdleTimeout`, 90 s; `--http-idle-timeout` shortens it here).

use nodeagent_config::Service;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::kubelet_client::KubeletClient;
use nodeagent_tests::websocket::ChannelClient;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The most an authorized request may take while a flood runs.
const STATED: Duration = Duration::from_secs(2);
/// What upstream's kubelet would cap at: the old connection cap, exceeded.
const SLOW_HANDSHAKES: usize = 4200;
const IDLE_H2: usize = 200;
const BOGUS_CLIENTS: usize = 48;
const IDLE_TIMEOUT: Duration = Duration::from_secs(3);

/// `/pods` and an `echo` exec as the node's admin, each timed; panics past [`STATED`].
async fn authorized_round(api: &KubeletClient, pod: &str, what: &str) -> Duration {
    let started = Instant::now();
    let r = tokio::time::timeout(STATED, api.get("/pods"))
        .await
        .unwrap_or_else(|_| panic!("{what}: /pods took over {STATED:?}"))
        .expect("/pods");
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    let pods_took = started.elapsed();
    let started = Instant::now();
    let path = format!("/exec/default/{pod}/c?command=echo&command=ok&output=1");
    let exec = async {
        let mut session = ChannelClient::connect(api, &path, &["v4.channel.k8s.io"])
            .await
            .map_err(|e| format!("{e:?}"))?;
        session.read_to_close(STATED).await
    };
    let got = tokio::time::timeout(STATED, exec)
        .await
        .unwrap_or_else(|_| panic!("{what}: the exec took over {STATED:?}"))
        .unwrap_or_else(|e| panic!("{what}: exec: {e}"));
    assert_eq!(got.text(1), "ok\n", "{what}: {got:?}");
    pods_took.max(started.elapsed())
}

/// Runs authorized rounds until `stop` is set, counting them in `rounds`; the slowest.
async fn keep_checking(
    api: KubeletClient,
    pod: String,
    what: &'static str,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
) -> Duration {
    let mut slowest = Duration::ZERO;
    while !stop.load(Ordering::SeqCst) || rounds.load(Ordering::SeqCst) == 0 {
        slowest = slowest.max(authorized_round(&api, &pod, what).await);
        rounds.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rounds = rounds.load(Ordering::SeqCst);
    eprintln!("{what}: {rounds} authorized rounds, the slowest {slowest:?}");
    slowest
}

/// Authorized rounds each flood must see answered while it is in full swing: a stage
/// lasts until they were, not a fixed time (each round takes over 200 ms).
const ROUNDS_UNDER_FLOOD: usize = 12;
/// How long a stage may take to get there on a slow machine.
const STAGE_DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn floods_of_bogus_tokens_slow_handshakes_and_idle_http2_starve_no_authorized_client() {
    if !require_runtime("kubelet API abuse") {
        return;
    }
    let server = ApiServer::start(ApiState::default(), 0).await;
    let ca_dir = tempfile::tempdir().unwrap();
    let ca = nodeagent_tests::pki::TestCa::new("abuse-client-ca");
    let ca_file = ca_dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let auth = format!(
        "authentication:\n  x509:\n    clientCAFile: {}\n  webhook:\n    enabled: true\n    cacheTTL: 2m\n\
         \x20 anonymous:\n    enabled: false\nauthorization:\n  mode: Webhook\n",
        ca_file.display()
    );
    server.state.auth.allow("test-admin", "*", "*");
    let node = Node::start(
        "abuse",
        NodeOptions {
            kubeconfig: Some(server.kubeconfig()),
            auth_config: Some(auth),
            service_args: vec![(
                Service::HttpServer,
                vec![format!("--http-idle-timeout={}s", IDLE_TIMEOUT.as_secs())],
            )],
            ..Default::default()
        },
    )
    .await;
    let api = node
        .api
        .with(nodeagent_tests::kubelet_client::Credentials::Cert(
            ca.issue_client("test-admin", &["system:masters"]),
        ));
    node.write_manifest(
        "target.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: target\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n",
    );
    node.running_container("target", "c", Duration::from_secs(90))
        .await;
    let pod = node.pod_name("target");
    eventually("the admin served", Duration::from_secs(30), || async {
        let r = api.get("/pods").await?;
        (r.status == 200).then_some(()).ok_or(r.text())
    })
    .await;
    authorized_round(&api, &pod, "before the floods").await;

    // 1. Bogus bearer tokens, each reviewed for 2 s by a slow API server, for 8 s.
    server
        .state
        .auth
        .delay_token_reviews(Duration::from_secs(2));
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let bogus: Vec<_> = (0..BOGUS_CLIENTS)
        .map(|i| {
            let (api, stop, refused) = (node.api.clone(), stop.clone(), refused.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let liar = api.with(nodeagent_tests::kubelet_client::Credentials::Token(
                        format!("bogus-{i}-{n}"),
                    ));
                    if let Ok(r) = liar.get("/pods").await {
                        assert_ne!(r.status, 200, "a bogus token got in");
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    n += 1;
                }
            })
        })
        .collect();
    let rounds = Arc::new(AtomicUsize::new(0));
    let checker = tokio::spawn(keep_checking(
        api.clone(),
        pod.clone(),
        "bogus tokens",
        stop.clone(),
        rounds.clone(),
    ));
    // Until as many bogus requests were refused as there are bogus clients (the review
    // queue went round once, full all along) and the authorized client was answered
    // that many times meanwhile.
    eventually(
        "the bogus-token flood in full swing",
        STAGE_DEADLINE,
        || async {
            let (r, n) = (
                refused.load(Ordering::SeqCst),
                rounds.load(Ordering::SeqCst),
            );
            (r >= BOGUS_CLIENTS && n >= ROUNDS_UNDER_FLOOD)
                .then_some(())
                .ok_or(format!("{r} bogus requests refused, {n} authorized rounds"))
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    checker.await.unwrap();
    for b in bogus {
        b.await.unwrap();
    }
    assert!(
        refused.load(Ordering::SeqCst) > 0,
        "no bogus request was answered"
    );
    server.state.auth.delay_token_reviews(Duration::ZERO);

    // 2. Slow handshakes: more TCP connections than the old cap, saying nothing, for 6 s.
    let mut silent = Vec::with_capacity(SLOW_HANDSHAKES);
    for _ in 0..SLOW_HANDSHAKES {
        silent.push(
            tokio::net::TcpStream::connect(("127.0.0.1", node.port))
                .await
                .expect("connect"),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let checker = tokio::spawn(keep_checking(
        api.clone(),
        pod.clone(),
        "slow handshakes",
        stop.clone(),
        rounds.clone(),
    ));
    // Until the authorized client was answered that many times while the silent
    // connections are held open.
    eventually(
        "rounds beside the silent connections",
        STAGE_DEADLINE,
        || async {
            let n = rounds.load(Ordering::SeqCst);
            (n >= ROUNDS_UNDER_FLOOD)
                .then_some(())
                .ok_or(format!("{n} authorized rounds"))
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    checker.await.unwrap();
    drop(silent);

    // 3. Idle HTTP/2 connections that answer pings (every 500 ms) and send no request.
    let idle: Vec<_> = (0..IDLE_H2)
        .map(|_| tokio::spawn(idle_h2(api.clone())))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let checker = tokio::spawn(keep_checking(
        api.clone(),
        pod.clone(),
        "idle HTTP/2",
        stop.clone(),
        Arc::new(AtomicUsize::new(0)),
    ));
    let limit = IDLE_TIMEOUT + Duration::from_secs(10);
    for conn in idle {
        let lived = tokio::time::timeout(limit + Duration::from_secs(5), conn)
            .await
            .expect("an idle HTTP/2 connection was never closed")
            .unwrap();
        assert!(
            lived >= IDLE_TIMEOUT.saturating_sub(Duration::from_millis(500)) && lived <= limit,
            "an idle HTTP/2 connection lived {lived:?} (idle timeout {IDLE_TIMEOUT:?})"
        );
    }
    stop.store(true, Ordering::SeqCst);
    checker.await.unwrap();
    node.stop().await;
}

/// One HTTP/2 connection (TLS, ALPN h2) that sends no request and answers the server's
/// pings; how long it lived until the server closed it.
async fn idle_h2(api: KubeletClient) -> Duration {
    let mut config = (*api.tls_config().expect("tls config")).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", api.port))
        .await
        .expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .expect("TLS");
    let started = Instant::now();
    let (_sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(Duration::from_millis(500))
            .keep_alive_while_idle(true)
            .handshake::<_, http_body_util::Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("HTTP/2 handshake");
    let _ = conn.await;
    started.elapsed()
}
