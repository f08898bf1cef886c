//! The node's pressure conditions (MemoryPressure, DiskPressure, PIDPressure): the eviction
//! signals observed every 10 s (upstream's eviction monitoring interval) and at every status
//! read, evaluated against `evictionHard` and `evictionSoft`, and held for
//! `evictionPressureTransitionPeriod` after their threshold was last met. The hold survives
//! a restart of node-status: the state is kept in `<root-dir>/node-status/pressure.json`.
//! A transition is logged with what was observed and posted as a node event.

use nodeagent_config::cgroupfs::Cgroups;
use nodeagent_config::events::{EventRecorder, EventType};
use nodeagent_config::eviction::{
    self, Condition, Observations, Pressure, PressureState, Report, Thresholds, format_quantity,
};
use nodeagent_cri::Cri;
use nodeagent_transport::Shutdown;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How often the signals are read without a status read asking (upstream: 10 s).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);

pub struct Monitor {
    cri: Cri,
    root_dir: PathBuf,
    cgroups: Cgroups,
    state_file: PathBuf,
    events: EventRecorder,
    node_name: String,
    inner: Mutex<Inner>,
}

struct Inner {
    pressure: Pressure,
    /// The conditions True at the last observation, to tell transitions.
    reported: Option<BTreeSet<Condition>>,
}

fn read_state(path: &Path) -> PressureState {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable pressure state");
            PressureState::default()
        }),
        Err(_) => PressureState::default(),
    }
}

/// "nodefs.available 50Mi < 10% (of 1Gi)": what met a threshold, for logs and events.
fn describe(report: &Report) -> String {
    report
        .met
        .iter()
        .map(|(t, o)| {
            let unit = |n: u64| {
                if t.signal.resource() == "memory" || t.signal.resource() == "ephemeral-storage" {
                    format_quantity(n)
                } else {
                    n.to_string()
                }
            };
            format!(
                "{} {} < {} (of {}){}",
                t.signal.name(),
                unit(o.available),
                t.value,
                unit(o.capacity),
                if t.is_hard() { "" } else { " soft" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Monitor {
    pub fn new(
        config: &nodeagent_config::Config,
        cri: Cri,
        events: EventRecorder,
    ) -> anyhow::Result<Self> {
        let thresholds = Thresholds::from_config(&config.kubelet).map_err(anyhow::Error::msg)?;
        let state_file = config.root_dir.join("node-status").join("pressure.json");
        let state = read_state(&state_file);
        Ok(Self {
            cri,
            root_dir: config.root_dir.clone(),
            cgroups: Cgroups::detect(),
            state_file,
            events,
            node_name: config.node_name.clone(),
            inner: Mutex::new(Inner {
                pressure: Pressure::new(
                    thresholds,
                    config.kubelet.eviction_pressure_transition_period,
                    state,
                ),
                reported: None,
            }),
        })
    }

    /// The thresholds in force (for allocatable).
    pub fn thresholds(&self) -> Thresholds {
        self.lock().pressure.thresholds.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the signals and evaluates them; returns the conditions True now.
    pub async fn observe(&self) -> BTreeSet<Condition> {
        let image_fs = self.cri.image_fs_mount().await;
        let (cgroups, root_dir) = (self.cgroups.clone(), self.root_dir.clone());
        let observations: Observations = tokio::task::spawn_blocking(move || {
            eviction::observe(&cgroups, &root_dir, image_fs.as_deref())
        })
        .await
        .unwrap_or_default();
        self.evaluate(&observations, SystemTime::now())
    }

    fn evaluate(&self, observations: &Observations, now: SystemTime) -> BTreeSet<Condition> {
        let mut inner = self.lock();
        let before = inner.pressure.state.clone();
        let report = inner.pressure.observe(observations, now);
        if inner.pressure.state != before
            && let Err(e) =
                nodeagent_config::state::write_json(&self.state_file, &inner.pressure.state)
        {
            tracing::warn!(path = %self.state_file.display(), error = %e, "cannot keep the pressure state");
        }
        let previous = inner.reported.replace(report.conditions.clone());
        let met = describe(&report);
        for c in Condition::ALL {
            let now_true = report.conditions.contains(&c);
            let was_true = previous.as_ref().map(|p| p.contains(&c));
            if was_true == Some(now_true) || (was_true.is_none() && !now_true) {
                continue;
            }
            let text = c.text(now_true);
            if now_true {
                tracing::warn!(condition = c.name(), observed = %met, "node condition is now True");
            } else {
                tracing::info!(condition = c.name(), "node condition is now False");
            }
            // upstream's recordNodeStatusEvent.
            let message = format!("Node {} status is now: {}", self.node_name, text.event);
            self.events.node(EventType::Normal, text.event, &message);
        }
        report.conditions
    }

    /// Observes every `period` (upstream's [`MONITORING_INTERVAL`] by default) until
    /// `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown, period: Duration) {
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tick.tick() => { self.observe().await; }
            }
        }
    }
}

/// Capacity as upstream reports it (cpu in cores or millicores, memory and storage in Ki)
/// from whole units (cpu in millicores).
pub fn quantities(
    values: &BTreeMap<String, u64>,
) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    values
        .iter()
        .map(|(k, v)| {
            let text = match k.as_str() {
                "cpu" if v % 1000 == 0 => (v / 1000).to_string(),
                "cpu" => format!("{v}m"),
                "memory" | "ephemeral-storage" => format!("{}Ki", v / 1024),
                _ => v.to_string(),
            };
            (
                k.clone(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(text),
            )
        })
        .collect()
}
