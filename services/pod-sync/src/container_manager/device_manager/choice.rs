//! Which devices a container gets of one resource (upstream's `devicesToAllocate`, the
//! decision without the plugin calls).

use super::*;

/// upstream's `devicesToAllocate`, without the plugin calls: which devices a container
/// gets of one resource.
pub(super) struct Choice<'a> {
    pub(super) resource: &'a str,
    pub(super) needed: usize,
    pub(super) existing: Option<&'a BTreeSet<String>>,
    pub(super) healthy: Option<&'a BTreeSet<String>>,
    pub(super) in_use: &'a BTreeSet<String>,
    pub(super) reusable: &'a BTreeSet<String>,
}

#[derive(Debug, PartialEq)]
pub(super) enum Chosen {
    /// The container has its devices already (a container that restarts).
    Already(BTreeSet<String>),
    /// All from the devices an init container left.
    Done(BTreeSet<String>),
    /// Those taken so far, and the free ones the rest come from (after the plugin's
    /// preference, when it has one).
    Ask {
        allocated: BTreeSet<String>,
        available: BTreeSet<String>,
    },
}

impl Choice<'_> {
    pub(super) fn start(&self) -> Result<Chosen, String> {
        let resource = self.resource;
        if let Some(existing) = self.existing
            && existing.len() != self.needed
        {
            return Err(format!(
                "container changed request for resource {resource:?} from {} to {}",
                existing.len(),
                self.needed
            ));
        }
        let Some(healthy) = self.healthy else {
            return Err(format!("cannot allocate unregistered device {resource}"));
        };
        if healthy.is_empty() {
            return Err(format!(
                "no healthy devices present; cannot allocate unhealthy devices {resource}"
            ));
        }
        if let Some(existing) = self.existing {
            if !existing.is_subset(healthy) {
                return Err(format!(
                    "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
                ));
            }
            return Ok(Chosen::Already(existing.clone()));
        }
        let mut allocated = BTreeSet::new();
        for id in self.reusable {
            if allocated.len() == self.needed {
                break;
            }
            allocated.insert(id.clone());
        }
        if allocated.len() == self.needed {
            return Ok(Chosen::Done(allocated));
        }
        let available: BTreeSet<String> = healthy.difference(self.in_use).cloned().collect();
        let still = self.needed - allocated.len();
        if available.len() < still {
            return Err(format!(
                "requested number of devices unavailable for {resource}. Requested: {still}, Available: {}",
                available.len()
            ));
        }
        Ok(Chosen::Ask {
            allocated,
            available,
        })
    }

    /// The rest from the plugin's preference (those of it that are free), then from the
    /// free devices in order.
    pub(super) fn finish(
        &self,
        mut allocated: BTreeSet<String>,
        available: &BTreeSet<String>,
        preferred: &[String],
    ) -> Result<BTreeSet<String>, String> {
        let candidates = preferred
            .iter()
            .filter(|id| available.contains(*id))
            .chain(available.iter());
        for id in candidates {
            if allocated.len() == self.needed {
                break;
            }
            allocated.insert(id.clone());
        }
        if allocated.len() < self.needed {
            return Err(format!(
                "unexpectedly allocated less resources than required. Requested: {}, Got: {}",
                self.needed,
                allocated.len()
            ));
        }
        Ok(allocated)
    }
}
