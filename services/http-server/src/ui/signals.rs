//! The node's eviction signals against their thresholds, as the node page shows them:
//! what is available now (the same observations node-status and pod-sync's eviction
//! manager make), the hard and soft thresholds in force (`evictionHard`, `evictionSoft`,
//! upstream's defaults included) and whether one is met now.

use nodeagent_config::eviction::{Observations, Signal, Thresholds, met};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub signal: &'static str,
    pub available: u64,
    pub capacity: u64,
    /// The threshold in the signal's unit, and as configured (`100Mi`, `10%`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard: Option<(u64, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft: Option<(u64, String)>,
    /// A threshold (hard or soft) is met now.
    pub met: bool,
}

/// One row per observed signal, in the signals' order.
pub fn rows(thresholds: &Thresholds, observed: &Observations) -> Vec<Row> {
    observed
        .iter()
        .map(|(signal, o)| {
            let of = |hard: bool| {
                thresholds
                    .0
                    .iter()
                    .find(|t| t.signal == *signal && t.is_hard() == hard)
                    .map(|t| (t.value.of(o.capacity), t.value.to_string()))
            };
            let mine = thresholds.0.iter().filter(|t| t.signal == *signal);
            Row {
                signal: Signal::name(*signal),
                available: o.available,
                capacity: o.capacity,
                hard: of(true),
                soft: of(false),
                met: !met(mine, observed, false).is_empty(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeagent_config::eviction::Observed;

    #[test]
    fn upstream_default_thresholds_against_what_is_available() {
        // Upstream's defaults (evictionHard: memory.available<100Mi, nodefs.available<10%,
        // imagefs.available<15%, nodefs.inodesFree<5%).
        let thresholds = Thresholds::from_config(&Default::default()).unwrap();
        let observed = Observations::from([
            (
                Signal::MemoryAvailable,
                Observed {
                    available: 50 << 20,
                    capacity: 8 << 30,
                },
            ),
            (
                Signal::NodeFsAvailable,
                Observed {
                    available: 50 << 30,
                    capacity: 100 << 30,
                },
            ),
        ]);
        let rows = rows(&thresholds, &observed);
        let memory = rows
            .iter()
            .find(|r| r.signal == "memory.available")
            .unwrap();
        assert_eq!(memory.hard, Some((100 << 20, "100Mi".to_string())));
        assert!(memory.met, "50Mi available is under 100Mi");
        assert_eq!(memory.soft, None);
        let nodefs = rows
            .iter()
            .find(|r| r.signal == "nodefs.available")
            .unwrap();
        assert_eq!(nodefs.hard, Some((10 << 30, "10%".to_string())));
        assert!(!nodefs.met);
        assert_eq!(rows.len(), 2, "only what is observed");
    }
}
