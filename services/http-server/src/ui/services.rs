//! The seven services as the node page shows them: health (the same gRPC checks as
//! `/healthz`), the build each runs (`nodeagent_build_info` from its metrics, asked again
//! only when the process changed), uptime and memory (from `/proc` for the process that
//! serves each socket, found by its peer credentials: no scrape at each refresh), and how
//! many times each restarted while this http-server watched (a new start time;
//! http-server's own restarts are seen by none, so 0).

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
}

/// What was read of one service's process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Process {
    /// Unix seconds.
    pub start_time: Option<f64>,
    pub resident_memory_bytes: Option<f64>,
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

/// What is remembered of each service between refreshes: its last start time, the
/// restarts counted (the times its start time changed since the first seen), and the
/// version its current process reported.
#[derive(Debug, Default)]
pub struct Seen(Mutex<BTreeMap<&'static str, Remembered>>);

/// A service's last start time, its restarts counted, its current process's version.
type Remembered = (f64, u32, Option<String>);

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Remembered>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a start time; returns the restarts counted.
    fn started(&self, service: &'static str, start: Option<f64>) -> u32 {
        let mut all = self.lock();
        match (all.get_mut(service), start) {
            (Some((last, n, version)), Some(start)) if *last != start => {
                *last = start;
                *n += 1;
                *version = None;
                *n
            }
            (Some((_, n, _)), _) => *n,
            (None, Some(start)) => {
                all.insert(service, (start, 0, None));
                0
            }
            (None, None) => 0,
        }
    }

    /// The version the service's current process reported, once known.
    pub fn version(&self, service: &'static str) -> Option<String> {
        self.lock().get(service).and_then(|(_, _, v)| v.clone())
    }

    pub fn set_version(&self, service: &'static str, version: String) {
        if let Some(entry) = self.lock().get_mut(service) {
            entry.2 = Some(version);
        }
    }
}

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
            let restarts = seen.started(name, process.start_time);
            Row {
                name,
                healthy,
                error,
                version: seen.version(name),
                start_time: process.start_time,
                resident_memory_bytes: process.resident_memory_bytes,
                restarts,
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
                },
            ),
            (
                "pleg",
                Process {
                    start_time: Some(100.0),
                    resident_memory_bytes: None,
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
    }
}
