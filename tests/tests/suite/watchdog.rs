//! The systemd watchdog follows a service's main loop, not just its process: pleg, whose
//! runtime hangs (a socket that accepts and never answers, as a wedged containerd does),
//! stops pinging the watchdog and reports NOT_SERVING once its relist loop is stuck, while
//! the process itself is alive and serving gRPC. The test plays systemd's part: it owns the
//! `NOTIFY_SOCKET` and counts the `WATCHDOG=1` datagrams. No container runtime is needed.

use nodeagent_config::Service;
use nodeagent_tests::{binary, consistently, eventually};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::{UnixDatagram, UnixListener};

/// Every notification received so far, with when it arrived. Read continuously, as systemd
/// does.
type Received = std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>;

fn receive(socket: UnixDatagram) -> (Received, tokio::task::JoinHandle<()>) {
    let received = Received::default();
    let sink = received.clone();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = socket.recv(&mut buf).await {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            sink.lock().unwrap().push((Instant::now(), text));
        }
    });
    (received, task)
}

/// Watchdog pings received after `since`.
fn pings_after(received: &Received, since: Instant) -> usize {
    received
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, m)| *at > since && m.contains("WATCHDOG=1"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_relist_loop_stops_the_watchdog_pings_and_reports_not_serving() {
    let dir = tempfile::tempdir().unwrap();
    // The hung runtime: connections are accepted and kept, nothing is ever answered.
    let runtime = UnixListener::bind(dir.path().join("containerd.sock")).unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = runtime.accept().await {
            conns.push(c);
        }
    });
    let (received, reader) = receive(UnixDatagram::bind(dir.path().join("notify.sock")).unwrap());
    for sub in ["root", "sockets"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             containerRuntimeEndpoint: unix://{}/containerd.sock\nruntimeRequestTimeout: 10m\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let d = dir.path().display();
    let mut pleg = Command::new(binary(Service::Pleg))
        .args(["--config", &format!("{d}/config.yaml")])
        .args(["--root-dir", &format!("{d}/root")])
        .args(["--socket-dir", &format!("{d}/sockets")])
        .args([
            "--hostname-override",
            "watchdog",
            "--pleg-relist-period",
            "500ms",
        ])
        .env("NOTIFY_SOCKET", dir.path().join("notify.sock"))
        .env("WATCHDOG_USEC", "1000000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Alive at first: READY, then a ping about every half second.
    let start = Instant::now();
    eventually("READY and pings", Duration::from_secs(10), || async {
        let ready = received
            .lock()
            .unwrap()
            .iter()
            .any(|(_, m)| m.contains("READY=1"));
        match (ready, pings_after(&received, start)) {
            (true, n) if n >= 2 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // pleg's first relist never returns. Within its stall bound (25 s, then 5 s of grace)
    // health says NOT_SERVING and the pings stop, though the process still answers gRPC.
    let address = nodeagent_config::Address::Unix(dir.path().join("sockets/pleg.sock"));
    eventually("pleg NOT_SERVING", Duration::from_secs(60), || async {
        match nodeagent_transport::check_health(
            nodeagent_transport::connect(&address),
            "",
            Duration::from_secs(2),
        )
        .await
        {
            Err(e) if e.contains("NotServing") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // A ping already on its way when the stall was noticed may still land; then silence.
    let noticed = Instant::now() + Duration::from_secs(1);
    // A negative check over a stated window: 5 s, five of the 1 s watchdog periods.
    consistently(
        "no pings while the loop is stuck",
        Duration::from_secs(5),
        Duration::from_millis(200),
        || async {
            match pings_after(&received, noticed) {
                0 => Ok(()),
                n => Err(format!("{n} pings")),
            }
        },
    )
    .await;
    assert!(
        pleg.try_wait().unwrap().is_none(),
        "the process itself is alive"
    );

    let _ = pleg.kill();
    let _ = pleg.wait();
    held.abort();
    reader.abort();
}
