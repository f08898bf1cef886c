//! The image garbage collector, as upstream's `image_gc_manager.go`: every
//! `--image-gc-period` (upstream: 5m), when the image filesystem is at least
//! `imageGCHighThresholdPercent` full, unused images are removed, least recently used first
//! (then first seen first), until it is `imageGCLowThresholdPercent` full; images unused for
//! `imageMaximumGCAge` go whatever the usage. Never removed: an image any container uses
//! (running or not), one the runtime pins, the sandbox (pause) image, or one first seen less
//! than `imageMinimumGCAge` ago.
//!
//! Unlike upstream, when each image was first seen and last used is kept on disk
//! (`<root-dir>/pod-sync/images.json`), so a restart of pod-sync does not make every image
//! young again (upstream forgets, and a kubelet restarted every few minutes never collects).

use crate::PodSync;
use nodeagent_config::events::EventType;
use nodeagent_proto::cri;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub high_percent: i32,
    pub low_percent: i32,
    pub min_age: Duration,
    pub max_age: Duration,
    pub period: Duration,
}

impl Policy {
    pub fn from_config(c: &nodeagent_config::Config) -> Self {
        Self {
            high_percent: c.kubelet.image_gc_high_threshold_percent,
            low_percent: c.kubelet.image_gc_low_threshold_percent,
            min_age: c.kubelet.image_minimum_gc_age,
            max_age: c.kubelet.image_maximum_gc_age,
            period: c.image_gc_period,
        }
    }
}

/// When an image was first seen and last used, in seconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub first_detected: u64,
    pub last_used: u64,
}

/// One image as the GC sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub id: String,
    pub size: u64,
    /// In use by a container, pinned, or the sandbox image: never removed.
    pub keep: bool,
}

/// Updates `records` from the images present now: new ones are first detected now, kept
/// ones (in use) used now; records of images gone are dropped.
pub fn detect(records: &mut BTreeMap<String, Record>, images: &[Image], now: u64) {
    let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
    records.retain(|id, _| present.contains(id.as_str()));
    for i in images {
        let r = records.entry(i.id.clone()).or_insert(Record {
            first_detected: now,
            last_used: 0,
        });
        if i.keep {
            r.last_used = now;
        }
    }
}

/// The images to remove, in order, to free `to_free` bytes (None: only those past
/// `max_age`), and the bytes they free. As upstream's `freeSpace`: least recently used
/// first, then first detected first, skipping what is kept or too young.
pub fn plan(
    images: &[Image],
    records: &BTreeMap<String, Record>,
    policy: &Policy,
    now: u64,
    to_free: Option<u64>,
) -> (Vec<String>, u64) {
    let mut candidates: Vec<(&Image, Record)> = images
        .iter()
        .filter(|i| !i.keep)
        .filter_map(|i| Some((i, *records.get(&i.id)?)))
        .filter(|(_, r)| now.saturating_sub(r.first_detected) >= policy.min_age.as_secs())
        .collect();
    candidates.sort_by_key(|(i, r)| (r.last_used, r.first_detected, i.id.clone()));
    let mut out = Vec::new();
    let mut freed = 0u64;
    for (image, record) in candidates {
        let unused_since = record.last_used.max(record.first_detected);
        let too_old = !policy.max_age.is_zero()
            && now.saturating_sub(unused_since) > policy.max_age.as_secs();
        let for_space = to_free.is_some_and(|want| freed < want);
        if too_old || for_space {
            out.push(image.id.clone());
            freed += image.size;
        }
    }
    (out, freed)
}

/// How many bytes to free (upstream): when the filesystem is at least `high` percent
/// full, down to `low` percent. None below the high mark or with GC off (100).
pub fn bytes_to_free(capacity: u64, available: u64, policy: &Policy) -> Option<u64> {
    if capacity == 0 || policy.high_percent >= 100 {
        return None;
    }
    let available = available.min(capacity);
    let usage_percent = 100 - (available as u128 * 100 / capacity as u128) as i64;
    if usage_percent < i64::from(policy.high_percent) {
        return None;
    }
    let target = capacity as u128 * (100 - policy.low_percent.clamp(0, 100)) as u128 / 100;
    Some((target as u64).saturating_sub(available))
}

/// The collector's state: the records and consecutive failures.
pub struct ImageGc {
    pub policy: Policy,
    records: BTreeMap<String, Record>,
    state_file: PathBuf,
    failed_before: bool,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl ImageGc {
    pub fn new(policy: Policy, root_dir: &std::path::Path) -> Self {
        let state_file = root_dir.join("pod-sync").join("images.json");
        let records = std::fs::read(&state_file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Self {
            policy,
            records,
            state_file,
            failed_before: false,
        }
    }

    fn save(&self) {
        if let Err(e) = nodeagent_config::state::write_json(&self.state_file, &self.records) {
            tracing::warn!(path = %self.state_file.display(), error = %e, "cannot keep the image records");
        }
    }
}

/// The name containerd lists an image pulled as `image` under (in its repo tags, or its repo
/// digests for a digested reference): `ParseDockerRef`, so `pause` is
/// `docker.io/library/pause:latest` and `localhost:5000/pause:3.9` stays as it is.
pub fn sandbox_image_name(image: &str) -> Result<String, String> {
    Ok(crate::images::image_ref::parse_normalized_named(image)?.docker_ref())
}

impl PodSync {
    /// Every image with whether it must be kept, from CRI.
    async fn images(&self) -> Result<Vec<Image>, String> {
        let mut image = self.cri.image.clone();
        let list = image
            .list_images(self.cri.request(cri::ListImagesRequest::default()))
            .await
            .map_err(|e| format!("ListImages: {}", e.message()))?
            .into_inner()
            .images;
        let containers = self
            .cri
            .list_containers(None)
            .await
            .map_err(|e| format!("ListContainers: {}", e.message()))?;
        let mut in_use: HashSet<String> = HashSet::new();
        for c in containers {
            in_use.insert(c.image_ref.clone());
            if let Some(spec) = &c.image {
                in_use.insert(spec.image.clone());
            }
        }
        let sandbox_image = self.sandbox_image().await;
        Ok(list
            .into_iter()
            .map(|i| {
                let keep = i.pinned
                    || in_use.contains(&i.id)
                    || i.repo_tags.iter().chain(&i.repo_digests).any(|n| {
                        in_use.contains(n) || sandbox_image.as_deref() == Some(n.as_str())
                    });
                Image {
                    id: i.id,
                    size: i.size,
                    keep,
                }
            })
            .collect())
    }

    /// The runtime's sandbox (pause) image, from containerd's verbose CRI status (its
    /// config's `sandboxImage`), named as containerd lists it (see [`sandbox_image_name`]).
    async fn sandbox_image(&self) -> Option<String> {
        let mut runtime = self.cri.runtime.clone();
        let status = runtime
            .status(self.cri.request(cri::StatusRequest { verbose: true }))
            .await
            .ok()?
            .into_inner();
        let config: serde_json::Value = serde_json::from_str(status.info.get("config")?).ok()?;
        let image = config["sandboxImage"].as_str()?;
        match sandbox_image_name(image) {
            Ok(name) => Some(name),
            Err(e) => {
                tracing::warn!(image, error = %e, "image GC: the runtime's sandbox image does not parse");
                None
            }
        }
    }

    /// The image filesystem's capacity and available bytes (CRI ImageFsInfo's mountpoint).
    async fn image_fs(&self) -> Option<(u64, u64)> {
        let mount = self.cri.image_fs_mount().await?;
        tokio::task::spawn_blocking(move || nodeagent_config::machine::statvfs(&mount))
            .await
            .ok()
            .flatten()
            .map(|v| (v.capacity, v.available))
    }

    async fn remove_images(&self, ids: &[String]) -> u64 {
        let mut removed = 0;
        for id in ids {
            let mut image = self.cri.image.clone();
            match image
                .remove_image(self.cri.request(cri::RemoveImageRequest {
                    image: Some(cri::ImageSpec {
                        image: id.clone(),
                        ..Default::default()
                    }),
                }))
                .await
            {
                Ok(_) => {
                    tracing::info!(image.id = %id, "image GC: removed an unused image");
                    removed += 1;
                }
                Err(e) => {
                    tracing::warn!(image.id = %id, error = %e.message(), "image GC: RemoveImage failed")
                }
            }
        }
        removed
    }

    /// One pass: `everything_unused` frees every unused image old enough (the eviction
    /// manager's node-level reclaim); otherwise as the thresholds say.
    pub async fn image_gc_pass(&self, gc: &mut ImageGc, everything_unused: bool) {
        let images = match self.images().await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "image GC: cannot list images");
                return;
            }
        };
        let now = now_secs();
        detect(&mut gc.records, &images, now);
        let to_free = if everything_unused {
            Some(u64::MAX)
        } else {
            match self.image_fs().await {
                Some((capacity, available)) => bytes_to_free(capacity, available, &gc.policy),
                None => None,
            }
        };
        let (ids, freed) = plan(&images, &gc.records, &gc.policy, now, to_free);
        self.remove_images(&ids).await;
        for id in &ids {
            gc.records.remove(id);
        }
        gc.save();
        match to_free {
            Some(want) if !everything_unused && freed < want => {
                let message = format!(
                    "Failed to garbage collect required amount of images. Attempted to free {want} bytes, but only found {freed} bytes eligible to free."
                );
                tracing::warn!(%message, "image GC");
                self.events
                    .node(EventType::Warning, "FreeDiskSpaceFailed", &message);
                if gc.failed_before {
                    self.events.node(
                        EventType::Warning,
                        "ImageGCFailed",
                        &format!(
                            "Image garbage collection failed multiple times in a row: {message}"
                        ),
                    );
                }
                gc.failed_before = true;
            }
            _ => gc.failed_before = false,
        }
    }
}

/// Runs a pass every `policy.period` until shutdown.
pub async fn run(sync: Arc<PodSync>) {
    let period = sync.image_gc.lock().await.policy.period;
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = tick.tick() => {
                let ready = {
                    let st = sync.lock();
                    st.config_synced && st.sources_ready && st.pleg_synced
                };
                if ready {
                    let mut gc = sync.image_gc.lock().await;
                    sync.image_gc_pass(&mut gc, false).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
            period: Duration::from_secs(300),
        }
    }

    fn img(id: &str, size: u64, keep: bool) -> Image {
        Image {
            id: id.into(),
            size,
            keep,
        }
    }

    #[test]
    fn frees_down_to_the_low_mark_only_above_the_high_one() {
        let p = policy();
        assert_eq!(bytes_to_free(1000, 200, &p), None, "80% full");
        assert_eq!(
            bytes_to_free(1000, 150, &p),
            Some(50),
            "85% full: down to 80%"
        );
        assert_eq!(bytes_to_free(1000, 50, &p), Some(150));
        let off = Policy {
            high_percent: 100,
            ..p
        };
        assert_eq!(bytes_to_free(1000, 0, &off), None, "100 turns it off");
        assert_eq!(bytes_to_free(0, 0, &p), None);
    }

    #[test]
    fn least_recently_used_goes_first_and_kept_or_young_images_stay() {
        let p = policy();
        let images = vec![
            img("used-long-ago", 10, false),
            img("in-use", 100, true),
            img("used-lately", 20, false),
            img("young", 40, false),
            img("never-used", 30, false),
        ];
        let mut records = BTreeMap::new();
        detect(&mut records, &images, 1000);
        records.get_mut("used-long-ago").unwrap().last_used = 1100;
        records.get_mut("used-lately").unwrap().last_used = 1150;
        records.get_mut("young").unwrap().first_detected = 1190;
        records.insert("gone".into(), Record::default());
        detect(&mut records, &images, 1200);
        assert!(
            !records.contains_key("gone"),
            "records of removed images go"
        );
        assert_eq!(records["in-use"].last_used, 1200);
        // Never used sorts first (last used 0), then by last use; "young" is 10 s old.
        let (ids, freed) = plan(&images, &records, &p, 1200, Some(35));
        assert_eq!(ids, ["never-used", "used-long-ago"]);
        assert_eq!(freed, 40);
        let (ids, _) = plan(&images, &records, &p, 1200, Some(u64::MAX));
        assert_eq!(ids, ["never-used", "used-long-ago", "used-lately"]);
        assert_eq!(
            plan(&images, &records, &p, 1200, None).0,
            Vec::<String>::new()
        );
    }

    #[test]
    fn images_unused_past_the_maximum_age_go_whatever_the_usage() {
        let p = Policy {
            max_age: Duration::from_secs(600),
            ..policy()
        };
        let images = vec![
            img("stale", 1, false),
            img("fresh", 1, false),
            img("kept", 1, true),
        ];
        let mut records = BTreeMap::new();
        detect(&mut records, &images, 0);
        records.get_mut("fresh").unwrap().last_used = 500;
        let (ids, _) = plan(&images, &records, &p, 700, None);
        assert_eq!(ids, ["stale"]);
    }

    /// Issue 31: the sandbox image kept from GC is named as containerd lists it, whatever
    /// its registry (a port without a dot was taken for a Docker Hub namespace before).
    #[test]
    fn sandbox_image_named_as_containerd_lists_it() {
        for (configured, listed) in [
            ("localhost:5000/pause:3.9", "localhost:5000/pause:3.9"),
            ("pause", "docker.io/library/pause:latest"),
            ("pause:3.9", "docker.io/library/pause:3.9"),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
            ("registry.k8s.io/pause", "registry.k8s.io/pause:latest"),
            ("registry:5000/pause:3.9", "registry:5000/pause:3.9"),
            ("index.docker.io/k8s/pause:3.9", "docker.io/k8s/pause:3.9"),
            (
                "registry.k8s.io/pause:3.9@sha256:7031c1b283388d2c2e09b57badb803c05ebed362dc88d84b480cc47f72a21097",
                "registry.k8s.io/pause@sha256:7031c1b283388d2c2e09b57badb803c05ebed362dc88d84b480cc47f72a21097",
            ),
        ] {
            assert_eq!(
                sandbox_image_name(configured).as_deref(),
                Ok(listed),
                "{configured}"
            );
        }
        assert!(sandbox_image_name("Pause:3.9").is_err());
    }
}
