//! The Warning events this process recorded lately, kept in memory whether or not an API
//! server takes them: `nodeagent status` asks every service for them (the `RecentWarnings`
//! call of the `Metrics` service each one serves), so an operator on a standalone node
//! sees why a pod does not run without reading seven logs. At most [`KEEP`], newest last;
//! a repeat (same object, container, reason and message) is folded into the one recorded,
//! whose count grows and which moves to the end, as the API server's Event `count` does.
//! Gone with the process: a restarted service starts with none.

use std::collections::VecDeque;
use std::sync::{LazyLock, Mutex};

/// How many are kept per process.
pub const KEEP: usize = 50;

/// One Warning event as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    pub last_unix_nanos: i64,
    /// "namespace/name" of a pod, or the node's name.
    pub object: String,
    pub field_path: String,
    pub reason: String,
    pub message: String,
    pub count: u32,
}

impl Recent {
    fn same(&self, other: &Recent) -> bool {
        (&self.object, &self.field_path, &self.reason, &self.message)
            == (
                &other.object,
                &other.field_path,
                &other.reason,
                &other.message,
            )
    }
}

/// A bounded list of recent warnings.
#[derive(Debug, Default)]
pub struct RecentWarnings(VecDeque<Recent>);

impl RecentWarnings {
    /// Records `w` (its count is taken as 1).
    pub fn record(&mut self, mut w: Recent) {
        if let Some(i) = self.0.iter().position(|r| r.same(&w)) {
            let old = self.0.remove(i).unwrap_or_else(|| w.clone());
            w.count = old.count.saturating_add(1);
        } else {
            w.count = 1;
        }
        self.0.push_back(w);
        while self.0.len() > KEEP {
            self.0.pop_front();
        }
    }

    pub fn list(&self) -> Vec<Recent> {
        self.0.iter().cloned().collect()
    }
}

static RECENT: LazyLock<Mutex<RecentWarnings>> = LazyLock::new(Default::default);

/// Records a Warning event of this process.
pub fn record(w: Recent) {
    RECENT.lock().unwrap_or_else(|e| e.into_inner()).record(w);
}

/// This process's recent warnings, oldest first.
pub fn list() -> Vec<Recent> {
    RECENT.lock().unwrap_or_else(|e| e.into_inner()).list()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(object: &str, reason: &str, t: i64) -> Recent {
        Recent {
            last_unix_nanos: t,
            object: object.into(),
            field_path: String::new(),
            reason: reason.into(),
            message: "m".into(),
            count: 0,
        }
    }

    #[test]
    fn repeats_fold_and_move_to_the_end_and_the_list_is_bounded() {
        let mut r = RecentWarnings::default();
        r.record(w("default/a", "BackOff", 1));
        r.record(w("default/b", "Failed", 2));
        r.record(w("default/a", "BackOff", 3));
        let l = r.list();
        assert_eq!(
            l.iter()
                .map(|x| (x.object.as_str(), x.count, x.last_unix_nanos))
                .collect::<Vec<_>>(),
            [("default/b", 1, 2), ("default/a", 2, 3)]
        );
        for i in 0..(KEEP as i64 + 10) {
            r.record(w(&format!("default/p{i}"), "Failed", 10 + i));
        }
        let l = r.list();
        assert_eq!(l.len(), KEEP);
        assert_eq!(l.last().unwrap().object, format!("default/p{}", KEEP + 9));
        assert_eq!(l.first().unwrap().object, "default/p10");
    }
}
