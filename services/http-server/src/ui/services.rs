//! The seven services as the node page shows them: health (the same gRPC checks as
//! `/healthz`), the build each runs (`nodeagent_build_info` from its metrics, asked again
//! only when the process changed), uptime and memory (from `/proc` for the process that
//! serves each socket, found by its peer credentials: no scrape at each refresh), and how
//! many times each restarted. Under systemd that is the unit's `NRestarts` (what
//! `systemctl show -p NRestarts` says: the automatic restarts, http-server's own and those
//! before it started included), asked once per process; elsewhere (compose, a test
//! harness) the restarts seen while this http-server watched (a new start time).

use crate::metrics::exposition::Family;
use nodeagent_config::Service;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub name: &'static str,
    pub healthy: bool,
    /// Why it is not healthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident_memory_bytes: Option<f64>,
    pub restarts: u32,
    /// Where `restarts` comes from: `systemd` (the unit's NRestarts) or `watched` (seen
    /// by this http-server).
    pub restarts_from: &'static str,
}

/// What was read of one service's process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Process {
    pub pid: Option<u32>,
    /// Unix seconds.
    pub start_time: Option<f64>,
    pub resident_memory_bytes: Option<f64>,
}

/// The systemd service a process's cgroup belongs to, from `/proc/<pid>/cgroup`: the last
/// `*.service` in its path in systemd's own hierarchy (`name=systemd` on v1, `0::` on
/// v2). A process in a unit is not necessarily the unit's main process: the caller checks
/// `MainPID`.
pub fn unit_of(cgroup_file: &str) -> Option<String> {
    let path = cgroup_file
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| {
            cgroup_file.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                (controllers == "name=systemd").then_some(path)
            })
        })?;
    path.split('/')
        .rev()
        .find(|c| c.ends_with(".service") && c.len() > ".service".len())
        .map(str::to_string)
}

/// `systemctl show --property=MainPID --property=NRestarts`'s answer: the unit's restarts
/// if `pid` is its main process.
pub fn nrestarts_of(show: &str, pid: u32) -> Option<u32> {
    let value = |key: &str| {
        show.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    (value("MainPID")? == pid).then(|| value("NRestarts"))?
}

/// `nodeagent_build_info{service=<service>,version=...}`'s version.
pub fn version_of(families: &[Family], service: &str) -> Option<String> {
    let sample = families
        .iter()
        .find(|f| f.name == "nodeagent_build_info")?
        .samples
        .iter()
        .find(|s| s.labels.iter().any(|(k, v)| k == "service" && v == service))?;
    sample
        .labels
        .iter()
        .find(|(k, _)| k == "version")
        .map(|(_, v)| v.clone())
}

/// What is remembered of each service between refreshes.
#[derive(Debug, Default)]
pub struct Seen(Mutex<BTreeMap<&'static str, Remembered>>);

#[derive(Debug)]
struct Remembered {
    /// The last start time seen.
    start: f64,
    /// The times the start time changed since the first seen.
    watched: u32,
    /// The version the current process reported.
    version: Option<String>,
    /// systemd's NRestarts for the current process: not asked yet (None), not a unit's
    /// main process (Some(None)), or the count.
    systemd: Option<Option<u32>>,
}

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Remembered>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a start time; returns the restarts (systemd's, else those watched) and
    /// where they come from.
    fn started(&self, service: &'static str, start: Option<f64>) -> (u32, &'static str) {
        let mut all = self.lock();
        let entry = match (all.get_mut(service), start) {
            (Some(seen), Some(start)) if seen.start != start => {
                seen.start = start;
                seen.watched += 1;
                // What the old process answered is not the new one's.
                seen.version = None;
                seen.systemd = None;
                seen
            }
            (Some(seen), _) => seen,
            (None, Some(start)) => all.entry(service).or_insert(Remembered {
                start,
                watched: 0,
                version: None,
                systemd: None,
            }),
            (None, None) => return (0, WATCHED),
        };
        match entry.systemd {
            Some(Some(n)) => (n, SYSTEMD),
            _ => (entry.watched, WATCHED),
        }
    }

    /// The version the service's current process reported, once known.
    pub fn version(&self, service: &'static str) -> Option<String> {
        self.lock().get(service).and_then(|s| s.version.clone())
    }

    pub fn set_version(&self, service: &'static str, version: String) {
        if let Some(entry) = self.lock().get_mut(service) {
            entry.version = Some(version);
        }
    }

    /// True when systemd was not asked yet about the service's current process.
    pub fn systemd_unasked(&self, service: &'static str) -> bool {
        self.lock()
            .get(service)
            .is_some_and(|s| s.systemd.is_none())
    }

    /// Notes systemd's answer for the current process (None: not a unit's main process).
    pub fn set_systemd(&self, service: &'static str, restarts: Option<u32>) {
        if let Some(entry) = self.lock().get_mut(service) {
            entry.systemd = Some(restarts);
        }
    }
}

const SYSTEMD: &str = "systemd";
const WATCHED: &str = "watched";

/// One row per service, in `Service::ALL`'s order, from what was read of each process
/// and the health checks (by service name).
pub fn rows(
    processes: &BTreeMap<&'static str, Process>,
    health: &BTreeMap<String, Result<(), String>>,
    seen: &Seen,
) -> Vec<Row> {
    Service::ALL
        .into_iter()
        .map(|s| {
            let name = s.name();
            let process = processes.get(name).cloned().unwrap_or_default();
            let (healthy, error) = if s == Service::HttpServer {
                (true, None)
            } else {
                match health.get(name) {
                    Some(Ok(())) => (true, None),
                    Some(Err(e)) => (false, Some(e.clone())),
                    None => (false, Some("not checked".to_string())),
                }
            };
            let (restarts, restarts_from) = seen.started(name, process.start_time);
            Row {
                name,
                healthy,
                error,
                version: seen.version(name),
                start_time: process.start_time,
                resident_memory_bytes: process.resident_memory_bytes,
                restarts,
                restarts_from,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exposition::parse;

    fn at(start: f64) -> BTreeMap<&'static str, Process> {
        BTreeMap::from([
            (
                "pod-sync",
                Process {
                    start_time: Some(start),
                    resident_memory_bytes: Some(1048576.0),
                    ..Process::default()
                },
            ),
            (
                "pleg",
                Process {
                    start_time: Some(100.0),
                    ..Process::default()
                },
            ),
        ])
    }

    #[test]
    fn rows_count_new_start_times_as_restarts_and_forget_the_old_version() {
        let seen = Seen::default();
        let mut health = BTreeMap::new();
        health.insert("pod-sync".to_string(), Ok(()));
        health.insert("pleg".to_string(), Err("not serving".to_string()));
        let rows1 = rows(&at(50.0), &health, &seen);
        let text = "# TYPE nodeagent_build_info gauge\n\
                    nodeagent_build_info{service=\"pod-sync\",version=\"1.2.3\"} 1\n";
        seen.set_version(
            "pod-sync",
            version_of(&parse(text).unwrap(), "pod-sync").unwrap(),
        );
        let pod_sync = rows1.iter().find(|r| r.name == "pod-sync").unwrap();
        assert_eq!((pod_sync.healthy, pod_sync.start_time), (true, Some(50.0)));
        assert_eq!(pod_sync.resident_memory_bytes, Some(1048576.0));
        assert_eq!(pod_sync.restarts, 0);
        let pleg = rows1.iter().find(|r| r.name == "pleg").unwrap();
        assert_eq!(
            (pleg.healthy, pleg.error.as_deref()),
            (false, Some("not serving"))
        );
        assert_eq!(rows1.len(), Service::ALL.len(), "every service has a row");
        let volume = rows1.iter().find(|r| r.name == "volume").unwrap();
        assert_eq!(volume.error.as_deref(), Some("not checked"));
        let again = rows(&at(50.0), &health, &seen);
        let pod_sync = again.iter().find(|r| r.name == "pod-sync").unwrap();
        assert_eq!(pod_sync.version.as_deref(), Some("1.2.3"));
        // pod-sync restarted twice (a read that misses it changes nothing); the version of
        // the old process is not the new one's.
        rows(&at(60.0), &health, &seen);
        rows(&BTreeMap::new(), &health, &seen);
        let rows3 = rows(&at(70.0), &health, &seen);
        let pod_sync = rows3.iter().find(|r| r.name == "pod-sync").unwrap();
        assert_eq!((pod_sync.restarts, pod_sync.version.as_deref()), (2, None));
        let pleg = rows3.iter().find(|r| r.name == "pleg").unwrap();
        assert_eq!(pleg.restarts, 0);
        assert_eq!(pleg.restarts_from, "watched");

        // Once systemd answers for the current process, its NRestarts is shown (restarts
        // before this http-server watched included), until the process changes again.
        assert!(seen.systemd_unasked("pod-sync"));
        seen.set_systemd("pod-sync", Some(5));
        assert!(!seen.systemd_unasked("pod-sync"));
        let pod_sync = rows(&at(70.0), &health, &seen)
            .into_iter()
            .find(|r| r.name == "pod-sync")
            .unwrap();
        assert_eq!((pod_sync.restarts, pod_sync.restarts_from), (5, "systemd"));
        let pod_sync = rows(&at(80.0), &health, &seen)
            .into_iter()
            .find(|r| r.name == "pod-sync")
            .unwrap();
        assert_eq!((pod_sync.restarts, pod_sync.restarts_from), (3, "watched"));
        assert!(
            seen.systemd_unasked("pod-sync"),
            "a new process is asked again"
        );
        // Not a unit's main process: what was watched stays.
        seen.set_systemd("pleg", None);
        let pleg = rows(&at(80.0), &health, &seen)
            .into_iter()
            .find(|r| r.name == "pleg")
            .unwrap();
        assert_eq!((pleg.restarts, pleg.restarts_from), (0, "watched"));
    }

    #[test]
    fn the_unit_is_the_service_in_systemds_hierarchy() {
        // cgroup v1, as on this machine's host under systemd (proc(5)'s format: the
        // named `name=systemd` hierarchy holds the unit).
        let v1 = "12:pids:/system.slice/nodeagent-pod-sync.service\n\
                  3:cpu,cpuacct:/system.slice/nodeagent-pod-sync.service\n\
                  1:name=systemd:/system.slice/nodeagent-pod-sync.service\n";
        assert_eq!(unit_of(v1).as_deref(), Some("nodeagent-pod-sync.service"));
        // cgroup v2 (the unified `0::` line); a template instance; a delegated sub-cgroup.
        assert_eq!(
            unit_of(
                "0::/system.slice/system-nodeagent\\x2dprobe.slice/nodeagent-probe@2.service\n"
            )
            .as_deref(),
            Some("nodeagent-probe@2.service")
        );
        assert_eq!(
            unit_of("0::/system.slice/kubelet.service/payload\n").as_deref(),
            Some("kubelet.service")
        );
        // A container's or a login session's process is in no service.
        assert_eq!(unit_of("0::/docker/0123abcd\n"), None);
        assert_eq!(
            unit_of("0::/user.slice/user-0.slice/session-3.scope\n"),
            None
        );
        assert_eq!(unit_of("1:name=systemd:/\n"), None);
    }

    #[test]
    fn nrestarts_count_only_for_the_units_main_process() {
        // `systemctl show --property=MainPID --property=NRestarts` prints the properties
        // in its own order.
        let show = "NRestarts=3\nMainPID=4242\n";
        assert_eq!(nrestarts_of(show, 4242), Some(3));
        // A harness run inside some unit: the service is not that unit's main process.
        assert_eq!(nrestarts_of(show, 17), None);
        assert_eq!(nrestarts_of("MainPID=4242\n", 4242), None);
        assert_eq!(nrestarts_of("", 4242), None);
    }
}
