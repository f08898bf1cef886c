//! Real gRPC over vsock loopback (CID 1), where the kernel offers it: a round trip when
//! both ends prove the secret (the challenge-response of `nodeagent_transport`), no call
//! answered without it or with a wrong one, a CID scoped to some services refused the
//! others (PERMISSION_DENIED), and connections from CIDs not allowed closed on accept. And
//! a service configured with a vsock endpoint but no secret refuses to start.

use nodeagent_config::{Address, Service, VsockAuth};
use nodeagent_tests::{binary, eventually};
use nodeagent_transport::{Server, connect_with_secret, shutdown_channel};
use std::time::Duration;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// A free vsock port on loopback. Where the kernel has no vsock loopback the test fails:
/// it cannot pass without running (deploy/test.sh leaves these tests out on such a
/// machine, and says so in its summary). `salt` keeps the tests of one run apart.
fn loopback_port(salt: u32) -> u32 {
    let port = 20_000 + (std::process::id() * 8 + salt) % 20_000;
    match tokio_vsock::VsockListener::bind(tokio_vsock::VsockAddr::new(1, port)) {
        Ok(_) => port,
        Err(e) => panic!(
            "vsock loopback (CID 1) is not available on this kernel: {e}; deploy/test.sh leaves \
             this test out on such a machine"
        ),
    }
}

fn auth(allowed_cids: Vec<u32>) -> VsockAuth {
    VsockAuth {
        allowed_cids,
        scopes: Default::default(),
        secret: b"right-secret".as_slice().into(),
    }
}

/// One health call with `secret`: its gRPC code (Ok for a SERVING answer).
async fn call(address: &Address, secret: Option<&[u8]>) -> tonic::Code {
    let mut client = HealthClient::new(connect_with_secret(address, secret));
    let request = HealthCheckRequest {
        service: String::new(),
    };
    match tokio::time::timeout(Duration::from_secs(5), client.check(request)).await {
        Ok(Ok(_)) => tonic::Code::Ok,
        Ok(Err(status)) => status.code(),
        Err(_) => tonic::Code::DeadlineExceeded,
    }
}

/// Serves on `vsock://1:port` with `auth` until `f` is done.
async fn with_server<F, Fut>(port: u32, auth: VsockAuth, f: F)
where
    F: FnOnce(Address) -> Fut,
    Fut: Future<Output = ()>,
{
    let address = Address::Vsock { cid: 1, port };
    let (trigger, shutdown) = shutdown_channel();
    let server =
        Server::new(address.clone(), tonic::service::Routes::default(), &[]).with_vsock_auth(auth);
    let serving = tokio::spawn(server.serve(shutdown));
    f(address).await;
    trigger.trigger();
    serving.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_secret_from_an_allowed_cid_is_served_and_others_are_refused() {
    let port = loopback_port(0);
    // Loopback peers have CID 1.
    with_server(port, auth(vec![1]), |address| async move {
        eventually("the right secret served", Duration::from_secs(10), || {
            let address = address.clone();
            async move {
                match call(&address, Some(b"right-secret")).await {
                    tonic::Code::Ok => Ok(()),
                    code => Err(format!("{code:?}")),
                }
            }
        })
        .await;
        // The handshake fails: no call is answered at all.
        for wrong in [Some(b"wrong-secret".as_slice()), Some(b"right-secre"), None] {
            let code = call(&address, wrong).await;
            assert_ne!(code, tonic::Code::Ok, "{wrong:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_cid_calls_only_its_services() {
    let port = loopback_port(2);
    let mut scoped = auth(vec![1]);
    scoped.scopes.insert(1, vec!["kubelet.v1.Prober".into()]);
    with_server(port, scoped, |address| async move {
        eventually("health served", Duration::from_secs(10), || {
            let address = address.clone();
            async move {
                match call(&address, Some(b"right-secret")).await {
                    tonic::Code::Ok => Ok(()),
                    code => Err(format!("{code:?}")),
                }
            }
        })
        .await;
        let mut metrics = nodeagent_proto::api::metrics_client::MetricsClient::new(
            connect_with_secret(&address, Some(b"right-secret")),
        );
        let err = metrics
            .scrape(nodeagent_proto::api::ScrapeRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cid_that_is_not_allowed_gets_its_connection_closed() {
    let port = loopback_port(1);
    with_server(port, auth(vec![3]), |address| async move {
        // A gRPC call cannot tell "not listening yet" from "refused": wait until a plain
        // vsock connect is accepted (the server closes it right after, for our CID).
        let Address::Vsock { cid, port } = address else {
            unreachable!("a vsock address")
        };
        eventually(
            "the vsock server listening",
            Duration::from_secs(10),
            || async {
                tokio_vsock::VsockStream::connect(tokio_vsock::VsockAddr::new(cid, port))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .await;
        for _ in 0..3 {
            let code = call(&address, Some(b"right-secret")).await;
            assert!(
                matches!(code, tonic::Code::Unavailable | tonic::Code::Unknown),
                "{code:?}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vsock_without_authentication_is_refused() {
    // The library refuses to serve vsock without settings...
    let address = Address::Vsock {
        cid: 1,
        port: 40_123,
    };
    let (_trigger, shutdown) = shutdown_channel();
    let err = Server::new(address, tonic::service::Routes::default(), &[])
        .serve(shutdown)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("without vsock authentication"),
        "{err}"
    );

    // ...and a service configured with a vsock endpoint but no secret does not start.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(binary(Service::ConfigSource))
        .args(["--socket-dir", &dir.path().display().to_string()])
        .args(["--hostname-override", "vsock-test"])
        .args(["--service-endpoint", "config-source=vsock://1:40124"])
        .output()
        .expect("run config-source");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--vsock-secret-file"), "{stderr}");
}
