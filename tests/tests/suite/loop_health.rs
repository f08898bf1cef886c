//! A stuck main loop is never reported healthy: the real http-server's `/healthz` reads a
//! peer whose server follows a loop (served here in-process through the same transport
//! `Server` every service uses, so the loop can be stopped on cue). While the loop beats,
//! `[+]config-source ok`; once it stops, `[-]config-source failed` with NOT_SERVING.

use nodeagent_config::{Address, Service};
use nodeagent_tests::{binary, eventually, http_get};
use nodeagent_transport::{LoopHealth, Server, shutdown_channel};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

async fn healthz_says(port: u16, want: &str) {
    eventually(&format!("/healthz to say {want:?}"), DEADLINE, || async {
        let (_, body) = http_get(port, "/healthz?verbose").await?;
        if body.contains(want) {
            Ok(())
        } else {
            Err(body)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_loop_stops_beating_fails_healthz() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("config-source.sock");
    let loops = LoopHealth::default();
    let heartbeat = loops.register("file source", Duration::from_secs(2));
    let beating = Arc::new(AtomicBool::new(true));
    let beater = tokio::spawn({
        let beating = beating.clone();
        async move {
            loop {
                if beating.load(Ordering::SeqCst) {
                    heartbeat.beat();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let (trigger, shutdown) = shutdown_channel();
    let server = Server::new(
        Address::Unix(socket.clone()),
        tonic::service::Routes::default(),
        &["kubelet.v1.ConfigSource"],
    )
    .with_loop_health(loops);
    let serving = tokio::spawn(server.serve(shutdown));

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut http = Command::new(binary(Service::HttpServer))
        .args([
            "--socket-dir",
            &dir.path().join("others").display().to_string(),
        ])
        .args([
            "--service-endpoint",
            &format!("config-source=unix://{}", socket.display()),
        ])
        .args(["--hostname-override", "loop-health"])
        .args(["--healthz-port", &port.to_string()])
        .args(["--read-only-port", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn http-server");

    healthz_says(port, "[+]config-source ok").await;
    beating.store(false, Ordering::SeqCst);
    healthz_says(port, "[-]config-source failed: status NotServing").await;
    beating.store(true, Ordering::SeqCst);
    healthz_says(port, "[+]config-source ok").await;

    let _ = http.kill();
    let _ = http.wait();
    beater.abort();
    trigger.trigger();
    serving.await.unwrap().unwrap();
}
