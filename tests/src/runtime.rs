//! The container runtimes the tests share, and who may use which.
//!
//! `deploy/runtime/setup.sh` starts the main containerd and, with
//! `NODEAGENT_TEST_RUNTIMES=N` (as `deploy/test.sh` sets it), N more, each with its own
//! socket, root, state, CNI bridge and subnet, and the images imported. One node agent owns
//! its runtime, as upstream (its pod-sync removes runtime pods no source of its own wants),
//! so a test that starts a node leases a runtime no other test holds, and tests on
//! different runtimes run side by side.
//!
//! Some tests touch state of the whole host (memory and PID pressure, a node-wide OOM,
//! the kernel log, random SIGKILLs timed against the machine, the docker and systemd
//! tests, benchmarks): they run alone. Which ones is said in one place, the `host-global`
//! test group of `.config/nextest.toml`; nextest names a test's group in
//! `NEXTEST_TEST_GROUP`, and a test of that group (or any test run outside nextest, whose
//! group is unknown) holds the host exclusively while every other test holds it shared.
//! `deploy/test.sh` runs the host-global group as a phase of its own, so nothing waits on
//! these locks in CI; the locks keep a developer's `cargo nextest run` just as safe.

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

/// The main containerd's directory under /run (setup.sh's instance 0).
const MAIN_RUN_DIR: &str = "/run/nodeagent-containerd";
/// Where the test runtimes' lock files live.
const LOCK_DIR: &str = "/run/nodeagent-tests";
/// The nextest test group whose tests hold the host alone.
pub const HOST_GLOBAL_GROUP: &str = "host-global";

/// One containerd instance started by setup.sh.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// 0 for the main instance, i for `nodeagent-containerd-test<i>`.
    pub index: usize,
    /// Its CRI socket.
    pub socket: PathBuf,
}

impl Runtime {
    fn new(index: usize) -> Runtime {
        let run_dir = match index {
            0 => PathBuf::from(MAIN_RUN_DIR),
            i => PathBuf::from(format!("{MAIN_RUN_DIR}-test{i}")),
        };
        Runtime {
            index,
            socket: run_dir.join("containerd.sock"),
        }
    }

    /// `unix://<socket>`, as `containerRuntimeEndpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The log of the `runc-audited` handler's wrapper (every runc call it got).
    pub fn audit_log(&self) -> PathBuf {
        self.socket.with_file_name("runc-audited.log")
    }
}

/// Every runtime that answers on this machine: the main one, then the test instances.
pub fn runtimes() -> Vec<Runtime> {
    let mut all = vec![Runtime::new(0)];
    for index in 1.. {
        let runtime = Runtime::new(index);
        if !runtime.socket.exists() {
            break;
        }
        all.push(runtime);
    }
    all
}

/// Whether this test must hold the host alone: a test of the `host-global` group, or a
/// test outside nextest (whose group nobody told us).
pub fn holds_host_alone() -> bool {
    std::env::var("NEXTEST_TEST_GROUP").map_or(true, |group| group == HOST_GLOBAL_GROUP)
}

/// A runtime held by this test process until the lease is dropped.
#[derive(Debug)]
pub struct RuntimeLease {
    pub runtime: Runtime,
    _slot: Flock<File>,
    /// Shared by the leases of one `leases(n)` call.
    _host: std::sync::Arc<Flock<File>>,
}

fn lock_file(name: &str) -> File {
    std::fs::create_dir_all(LOCK_DIR).expect("create the test lock dir");
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("{LOCK_DIR}/{name}"))
        .expect("open a test lock")
}

fn lock(name: &str, arg: FlockArg) -> Result<Flock<File>, nix::errno::Errno> {
    Flock::lock(lock_file(name), arg).map_err(|(_, e)| e)
}

/// Takes the host lock: exclusively for a test that holds the host alone, shared
/// otherwise. The gate gives an exclusive waiter precedence: while it waits, no new shared
/// holder comes in, so it is not starved by a stream of ordinary tests.
fn lock_host(alone: bool) -> Flock<File> {
    let gate = lock("gate.lock", FlockArg::LockExclusive).expect("lock the gate");
    let host = if alone {
        lock("host.lock", FlockArg::LockExclusive)
    } else {
        lock("host.lock", FlockArg::LockShared)
    }
    .expect("lock the host");
    drop(gate);
    host
}

/// Leases a runtime no other test holds, waiting for one to be free.
pub async fn lease() -> RuntimeLease {
    leases(1).await.pop().expect("one lease")
}

/// Leases `n` distinct runtimes (a test of several nodes), waiting until that many are
/// free; panics at once when this machine has fewer than `n`.
pub async fn leases(n: usize) -> Vec<RuntimeLease> {
    let all = runtimes();
    assert!(
        all.len() >= n,
        "{n} container runtimes are needed, this machine has {} (run deploy/runtime/setup.sh \
         with NODEAGENT_TEST_RUNTIMES={}, as deploy/test.sh does)",
        all.len(),
        n - 1
    );
    let alone = holds_host_alone();
    let host = tokio::task::spawn_blocking(move || lock_host(alone))
        .await
        .expect("host lock task");
    let host = std::sync::Arc::new(host);
    let mut held = Vec::new();
    loop {
        for runtime in &all {
            if held.len() == n {
                return held;
            }
            if held
                .iter()
                .any(|l: &RuntimeLease| l.runtime.index == runtime.index)
            {
                continue;
            }
            if let Ok(slot) = lock(
                &format!("runtime-{}.lock", runtime.index),
                FlockArg::LockExclusiveNonblock,
            ) {
                held.push(RuntimeLease {
                    runtime: runtime.clone(),
                    _slot: slot,
                    _host: host.clone(),
                });
            }
        }
        if held.len() == n {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
