//! Each probe's recent results as the probe service published them: its results change
//! only when the outcome or message does, so these are the transitions, newest last,
//! [`KEPT`] per probe, with the time this server learnt of each.

use nodeagent_proto::api::ProbeResult;
use nodeagent_proto::api::probe_result::{Kind, Outcome};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Results kept per probe.
pub const KEPT: usize = 10;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Seen {
    pub unix_ms: i64,
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub container_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeHistory {
    pub container: String,
    pub kind: &'static str,
    pub results: VecDeque<Seen>,
}

/// By pod UID, then (container, kind).
#[derive(Debug, Default)]
pub struct ProbeLog(HashMap<String, BTreeMap<(String, &'static str), VecDeque<Seen>>>);

fn kind(k: i32) -> &'static str {
    match Kind::try_from(k) {
        Ok(Kind::Readiness) => "readiness",
        Ok(Kind::Liveness) => "liveness",
        Ok(Kind::Startup) => "startup",
        _ => "unknown",
    }
}

fn outcome(o: i32) -> &'static str {
    match Outcome::try_from(o) {
        Ok(Outcome::Success) => "Success",
        Ok(Outcome::Failure) => "Failure",
        _ => "Unknown",
    }
}

impl ProbeLog {
    /// Adds a result unless it repeats the probe's last one (a snapshot after a
    /// reconnect repeats them all).
    pub fn record(&mut self, unix_ms: i64, r: &ProbeResult) {
        let seen = Seen {
            unix_ms,
            outcome: outcome(r.outcome),
            message: r.message.clone(),
            container_id: r.container_id.clone(),
        };
        let results = self
            .0
            .entry(r.pod_uid.clone())
            .or_default()
            .entry((r.container_name.clone(), kind(r.kind)))
            .or_default();
        if results.back().is_some_and(|last| {
            (last.outcome, &last.message, &last.container_id)
                == (seen.outcome, &seen.message, &seen.container_id)
        }) {
            return;
        }
        if results.len() == KEPT {
            results.pop_front();
        }
        results.push_back(seen);
    }

    pub fn of(&self, uid: &str) -> Vec<ProbeHistory> {
        self.0
            .get(uid)
            .into_iter()
            .flatten()
            .map(|((container, kind), results)| ProbeHistory {
                container: container.clone(),
                kind,
                results: results.clone(),
            })
            .collect()
    }

    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.0.retain(|uid, _| keep(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(outcome: Outcome, message: &str) -> ProbeResult {
        ProbeResult {
            pod_uid: "u".into(),
            container_name: "c".into(),
            container_id: "id1".into(),
            kind: Kind::Readiness as i32,
            outcome: outcome as i32,
            message: message.into(),
            trace: None,
        }
    }

    #[test]
    fn transitions_are_kept_repeats_are_not_and_the_oldest_go() {
        let mut log = ProbeLog::default();
        log.record(1, &result(Outcome::Success, ""));
        log.record(2, &result(Outcome::Success, ""));
        log.record(
            3,
            &result(Outcome::Failure, "HTTP probe failed with statuscode: 500"),
        );
        let h = log.of("u");
        assert_eq!(h.len(), 1);
        assert_eq!((h[0].container.as_str(), h[0].kind), ("c", "readiness"));
        let times: Vec<i64> = h[0].results.iter().map(|s| s.unix_ms).collect();
        assert_eq!(times, [1, 3], "the repeated success is not a new result");
        assert_eq!(
            h[0].results[1].message,
            "HTTP probe failed with statuscode: 500"
        );
        for i in 0..20 {
            let o = if i % 2 == 0 {
                Outcome::Success
            } else {
                Outcome::Failure
            };
            log.record(10 + i, &result(o, ""));
        }
        let h = log.of("u");
        assert_eq!(h[0].results.len(), KEPT);
        assert_eq!(h[0].results.back().unwrap().unix_ms, 29);
        log.retain(|uid| uid != "u");
        assert!(log.of("u").is_empty());
    }
}
