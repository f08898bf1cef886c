//! A restart that races its predecessor: a second instance of a service waits for the
//! socket's lock, takes over when the first exits, and otherwise exits non-zero naming
//! the socket (before, it failed to bind and then waited for SIGTERM without a word).
//! config-source stands in for every service: it needs no container runtime, and its
//! `run`, like most, waits for shutdown after serving.

use nix::sys::signal::Signal;
use nodeagent_config::{Address, Service};
use nodeagent_tests::{binary, eventually};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// Well past the 10 s bind window.
const DEADLINE: Duration = Duration::from_secs(30);

struct Instance {
    child: Child,
    log: PathBuf,
}

impl Instance {
    fn start(dir: &Path, name: &str) -> Self {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        std::fs::create_dir_all(dir.join("manifests")).expect("manifests dir");
        let child = Command::new(binary(Service::ConfigSource))
            .args(["--root-dir", &dir.join("root").display().to_string()])
            .args(["--socket-dir", &dir.join("sockets").display().to_string()])
            .args([
                "--pod-manifest-path",
                &dir.join("manifests").display().to_string(),
            ])
            .args(["--hostname-override", "bind-test"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn config-source");
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn exited(&mut self, within: Duration) -> ExitStatus {
        let child = &mut self.child;
        eventually("the instance to exit", within, || {
            let r = child
                .try_wait()
                .map_err(|e| e.to_string())
                .and_then(|s| s.ok_or_else(|| "still running".to_string()));
            async move { r }
        })
        .await
    }

    async fn stop(mut self) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        self.exited(DEADLINE).await
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn socket(dir: &Path) -> PathBuf {
    dir.join("sockets/config-source.sock")
}

async fn wait_serving(dir: &Path) {
    nodeagent_tests::wait_serving(&Address::Unix(socket(dir)), "config-source").await;
}

async fn wait_for_log(instance: &Instance, what: &str) {
    eventually(&format!("the log to say {what:?}"), DEADLINE, || async {
        let log = instance.log();
        if log.contains(what) { Ok(()) } else { Err(log) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_retries_then_exits_non_zero_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let first = Instance::start(dir.path(), "first");
    wait_serving(dir.path()).await;

    let started = std::time::Instant::now();
    let mut second = Instance::start(dir.path(), "second");
    wait_for_log(&second, "another process holds the socket; waiting").await;
    let status = second.exited(DEADLINE).await;
    let waited = started.elapsed();
    assert_eq!(status.code(), Some(1), "{}", second.log());
    assert!(
        waited >= Duration::from_secs(9),
        "retried for the window: {waited:?}"
    );
    let log = second.log();
    let named = format!(
        "nodeagent-config-source: another process is still serving on {}",
        socket(dir.path()).display()
    );
    assert!(log.contains(&named), "{log}");
    assert!(!log.contains("serving gRPC"), "{log}");

    // The first instance's socket was not touched.
    wait_serving(dir.path()).await;
    assert!(first.stop().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_takes_over_when_the_first_exits_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let first = Instance::start(dir.path(), "first");
    wait_serving(dir.path()).await;
    let second = Instance::start(dir.path(), "second");
    wait_for_log(&second, "another process holds the socket; waiting").await;

    assert!(first.stop().await.success());
    wait_for_log(&second, "serving gRPC").await;
    wait_serving(dir.path()).await;
    assert!(second.stop().await.success());
    // The last one out removed its socket.
    assert!(!socket(dir.path()).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sockets")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(socket(dir.path())).unwrap());
    assert!(socket(dir.path()).exists(), "a socket file nobody serves");
    let only = Instance::start(dir.path(), "only");
    wait_serving(dir.path()).await;
    assert!(
        only.log().contains("removing stale socket"),
        "{}",
        only.log()
    );
    assert!(only.stop().await.success());
}

/// The same for a plain HTTP listener: http-server whose healthz port is taken exits at
/// once, non-zero, naming the address (before, it ran on without the port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_server_exits_when_its_healthz_port_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let log = dir.path().join("http-server.log");
    let mut child = Command::new(binary(Service::HttpServer))
        .args([
            "--socket-dir",
            &dir.path().join("sockets").display().to_string(),
        ])
        .args(["--hostname-override", "bind-test"])
        .args(["--healthz-port", &port.to_string()])
        .args(["--read-only-port", "0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn http-server");
    let status = eventually("http-server to exit", DEADLINE, || {
        let r = child
            .try_wait()
            .map_err(|e| e.to_string())
            .and_then(|s| s.ok_or_else(|| "still running".to_string()));
        async move { r }
    })
    .await;
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{log}"
    );
    drop(taken);
}
