//! The last hour of the node's, each pod's and each container's CPU, memory, network and
//! filesystem use, kept in memory so that the page shows history the moment it opens.
//! One point per [`PERIOD`] from the same Summary `/stats/summary` serves; a pod's series
//! go with the pod (when it leaves the Summary), so the memory is bounded by the pods
//! running: [`POINTS`] points of 88 bytes per series (21 KiB).

use crate::stats::types::{ContainerStats, NetworkStats, Summary};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// How often a point is taken by default (`--ui-history-period`).
pub const PERIOD: Duration = Duration::from_secs(15);
/// One hour of points at the default period.
pub const POINTS: usize = 240;

/// One sample. `None` where the Summary had no value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// Unix milliseconds.
    pub t: i64,
    /// `usageNanoCores`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u64>,
    /// `workingSetBytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem: Option<u64>,
    /// Bytes received and sent on every interface so far (the page draws the rate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx: Option<u64>,
    /// Bytes used: the node's root filesystem, a pod's ephemeral storage, a container's
    /// writable layer and logs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<u64>,
}

/// A bounded series, oldest first.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct Series(VecDeque<Point>);

impl Series {
    fn push(&mut self, p: Point) {
        if self.0.len() == POINTS {
            self.0.pop_front();
        }
        self.0.push_back(p);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A pod's series and its containers'.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PodHistory {
    pub pod: Series,
    pub containers: BTreeMap<String, Series>,
}

#[derive(Debug, Default)]
pub struct History {
    pub node: Series,
    /// By pod UID.
    pub pods: HashMap<String, PodHistory>,
}

fn network(n: Option<&NetworkStats>) -> (Option<u64>, Option<u64>) {
    let Some(n) = n else { return (None, None) };
    let all =
        std::iter::once(&n.default).chain(n.interfaces.iter().filter(|i| i.name != n.default.name));
    all.fold((None, None), |(rx, tx), i| {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        (add(rx, i.rx_bytes), add(tx, i.tx_bytes))
    })
}

fn container_point(t: i64, c: &ContainerStats) -> Point {
    let fs = match (
        c.rootfs.as_ref().and_then(|f| f.used_bytes),
        c.logs.as_ref().and_then(|f| f.used_bytes),
    ) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    Point {
        t,
        cpu: c.cpu.as_ref().and_then(|c| c.usage_nano_cores),
        mem: c.memory.as_ref().and_then(|m| m.working_set_bytes),
        rx: None,
        tx: None,
        fs,
    }
}

impl History {
    /// Adds the points of one Summary taken at `t` (unix ms); forgets the pods and
    /// containers it does not list.
    pub fn record(&mut self, t: i64, summary: &Summary) {
        let node = &summary.node;
        let (rx, tx) = network(node.network.as_ref());
        self.node.push(Point {
            t,
            cpu: node.cpu.as_ref().and_then(|c| c.usage_nano_cores),
            mem: node.memory.as_ref().and_then(|m| m.working_set_bytes),
            rx,
            tx,
            fs: node.fs.as_ref().and_then(|f| f.used_bytes),
        });
        let mut seen = HashMap::with_capacity(summary.pods.len());
        for pod in &summary.pods {
            let mut h = self.pods.remove(&pod.pod_ref.uid).unwrap_or_default();
            let (rx, tx) = network(pod.network.as_ref());
            h.pod.push(Point {
                t,
                cpu: pod.cpu.as_ref().and_then(|c| c.usage_nano_cores),
                mem: pod.memory.as_ref().and_then(|m| m.working_set_bytes),
                rx,
                tx,
                fs: pod.ephemeral_storage.as_ref().and_then(|f| f.used_bytes),
            });
            let mut containers = BTreeMap::new();
            for c in &pod.containers {
                let mut s = h.containers.remove(&c.name).unwrap_or_default();
                s.push(container_point(t, c));
                containers.insert(c.name.clone(), s);
            }
            h.containers = containers;
            seen.insert(pod.pod_ref.uid.clone(), h);
        }
        self.pods = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::types::*;

    fn summary(pods: &[(&str, &[&str])]) -> Summary {
        let t = now();
        Summary {
            node: NodeStats {
                node_name: "n".into(),
                system_containers: vec![],
                start_time: t.clone(),
                cpu: Some(CpuStats {
                    time: t.clone(),
                    usage_nano_cores: Some(5),
                    usage_core_nano_seconds: None,
                    cfs: None,
                }),
                memory: None,
                network: None,
                fs: None,
                runtime: None,
                rlimit: None,
                swap: None,
            },
            pods: pods
                .iter()
                .map(|(uid, containers)| PodStats {
                    pod_ref: PodReference {
                        name: uid.to_string(),
                        namespace: "default".into(),
                        uid: uid.to_string(),
                    },
                    start_time: t.clone(),
                    containers: containers
                        .iter()
                        .map(|c| ContainerStats {
                            name: c.to_string(),
                            start_time: t.clone(),
                            cpu: None,
                            memory: None,
                            rootfs: None,
                            logs: None,
                            swap: None,
                        })
                        .collect(),
                    cpu: None,
                    memory: None,
                    network: None,
                    volume: vec![],
                    ephemeral_storage: None,
                    process_stats: None,
                    swap: None,
                })
                .collect(),
        }
    }

    #[test]
    fn series_are_bounded_and_go_with_their_pods_and_containers() {
        let mut h = History::default();
        for i in 0..(POINTS as i64 + 10) {
            h.record(i, &summary(&[("a", &["c1", "c2"]), ("b", &["c"])]));
        }
        assert_eq!(h.node.len(), POINTS, "an hour of points, no more");
        assert_eq!(h.node.0.front().unwrap().t, 10, "the oldest go first");
        assert_eq!(h.node.0.back().unwrap().cpu, Some(5));
        assert_eq!(h.pods["a"].containers["c1"].len(), POINTS);
        // b leaves, a's c2 is gone (a restart under another name would start afresh).
        h.record(1_000, &summary(&[("a", &["c1"])]));
        assert!(!h.pods.contains_key("b"));
        assert_eq!(h.pods["a"].containers.keys().collect::<Vec<_>>(), ["c1"]);
        assert_eq!(h.pods["a"].pod.len(), POINTS);
    }
}
