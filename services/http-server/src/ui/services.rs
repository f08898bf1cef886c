//! The seven services as the node page shows them: health (the same gRPC checks as
//! `/healthz`), the build each runs (`nodeagent_build_info`), uptime and memory
//! (`process_start_time_seconds`, `process_resident_memory_bytes`, labelled by service in
//! the merged `/metrics`), and how many times each restarted while this http-server watched
//! (a new start time; http-server's own count is its restarts seen by none, so 0).

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

/// The value of `name`'s sample labelled `service=<service>` (and, for the build, its
/// `version` label).
fn sample<'a>(
    families: &'a [Family],
    name: &str,
    service: &str,
) -> Option<&'a crate::metrics::exposition::Sample> {
    families
        .iter()
        .find(|f| f.name == name)?
        .samples
        .iter()
        .find(|s| s.labels.iter().any(|(k, v)| k == "service" && v == service))
}

/// Counts each service's restarts: the times its start time changed since the first seen.
#[derive(Debug, Default)]
pub struct Restarts(Mutex<BTreeMap<&'static str, (f64, u32)>>);

impl Restarts {
    fn seen(&self, service: &'static str, start: Option<f64>) -> u32 {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match (all.get_mut(service), start) {
            (Some((last, n)), Some(start)) if *last != start => {
                *last = start;
                *n += 1;
                *n
            }
            (Some((_, n)), _) => *n,
            (None, Some(start)) => {
                all.insert(service, (start, 0));
                0
            }
            (None, None) => 0,
        }
    }
}

/// One row per service, in `Service::ALL`'s order, from the merged metrics and the
/// health checks (by service name).
pub fn rows(
    families: &[Family],
    health: &BTreeMap<String, Result<(), String>>,
    restarts: &Restarts,
) -> Vec<Row> {
    Service::ALL
        .into_iter()
        .map(|s| {
            let name = s.name();
            let start_time = sample(families, "process_start_time_seconds", name).map(|s| s.value);
            let (healthy, error) = if s == Service::HttpServer {
                (true, None)
            } else {
                match health.get(name) {
                    Some(Ok(())) => (true, None),
                    Some(Err(e)) => (false, Some(e.clone())),
                    None => (false, Some("not checked".to_string())),
                }
            };
            Row {
                name,
                healthy,
                error,
                version: sample(families, "nodeagent_build_info", name).and_then(|s| {
                    s.labels
                        .iter()
                        .find(|(k, _)| k == "version")
                        .map(|(_, v)| v.clone())
                }),
                start_time,
                resident_memory_bytes: sample(families, "process_resident_memory_bytes", name)
                    .map(|s| s.value),
                restarts: restarts.seen(name, start_time),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exposition::parse;

    fn text(start: f64) -> String {
        format!(
            "# TYPE process_start_time_seconds gauge\n\
             process_start_time_seconds{{service=\"pod-sync\"}} {start}\n\
             process_start_time_seconds{{service=\"pleg\"}} 100\n\
             # TYPE process_resident_memory_bytes gauge\n\
             process_resident_memory_bytes{{service=\"pod-sync\"}} 1048576\n\
             # TYPE nodeagent_build_info gauge\n\
             nodeagent_build_info{{service=\"pod-sync\",version=\"1.2.3\"}} 1\n"
        )
    }

    #[test]
    fn rows_read_the_merged_metrics_and_count_new_start_times_as_restarts() {
        let restarts = Restarts::default();
        let mut health = BTreeMap::new();
        health.insert("pod-sync".to_string(), Ok(()));
        health.insert("pleg".to_string(), Err("not serving".to_string()));
        let rows1 = rows(&parse(&text(50.0)).unwrap(), &health, &restarts);
        let pod_sync = rows1.iter().find(|r| r.name == "pod-sync").unwrap();
        assert_eq!(
            (
                pod_sync.healthy,
                pod_sync.version.as_deref(),
                pod_sync.start_time
            ),
            (true, Some("1.2.3"), Some(50.0))
        );
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
        // pod-sync restarted twice (a scrape that misses it changes nothing).
        rows(&parse(&text(60.0)).unwrap(), &health, &restarts);
        rows(&parse("").unwrap(), &health, &restarts);
        let rows3 = rows(&parse(&text(70.0)).unwrap(), &health, &restarts);
        let pod_sync = rows3.iter().find(|r| r.name == "pod-sync").unwrap();
        assert_eq!(pod_sync.restarts, 2);
        let pleg = rows3.iter().find(|r| r.name == "pleg").unwrap();
        assert_eq!(pleg.restarts, 0);
    }
}
