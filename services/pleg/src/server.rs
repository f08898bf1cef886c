//! pleg's gRPC API: Watch, GetPodStatus, Health.

use crate::relist::RelistCache;
use nodeagent_cri::Cri;
use nodeagent_proto::api::{
    GetPodStatusRequest, PlegHealthRequest, PlegHealthResponse, PlegWatchResponse,
    RuntimePodStatus, WatchPlegRequest, pleg_server::Pleg,
};
use nodeagent_transport::{Shutdown, WatchStream, snapshot_then_deltas};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};

/// pleg is unhealthy when its last successful relist is older than this (upstream: 3 min).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

pub struct PlegService {
    cri: Cri,
    cache: Arc<Mutex<RelistCache>>,
    events: broadcast::Sender<PlegWatchResponse>,
    shutdown: Shutdown,
    started: SystemTime,
}

impl PlegService {
    pub fn new(
        cri: Cri,
        cache: Arc<Mutex<RelistCache>>,
        events: broadcast::Sender<PlegWatchResponse>,
        shutdown: Shutdown,
    ) -> Self {
        Self {
            cri,
            cache,
            events,
            shutdown,
            started: SystemTime::now(),
        }
    }
}

#[tonic::async_trait]
impl Pleg for PlegService {
    type WatchStream = WatchStream<PlegWatchResponse>;

    async fn watch(
        &self,
        request: Request<WatchPlegRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (snapshot, rx) = {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.last_relist.is_none() {
                return Err(Status::unavailable(
                    "pleg has not completed its first relist yet",
                ));
            }
            (cache.snapshot(), self.events.subscribe())
        };
        Ok(Response::new(snapshot_then_deltas(
            snapshot,
            rx,
            self.shutdown.clone(),
            request.get_ref().accept_chunked_snapshot,
        )))
    }

    async fn get_pod_status(
        &self,
        request: Request<GetPodStatusRequest>,
    ) -> Result<Response<RuntimePodStatus>, Status> {
        let req = request.into_inner();
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = cache.pods.get(&req.pod_uid) {
                if s.timestamp_unix_nanos >= req.newer_than_unix_nanos {
                    return Ok(Response::new(s.clone()));
                }
            } else if req.newer_than_unix_nanos > 0
                && cache.listed_at_unix_nanos >= req.newer_than_unix_nanos
                && !cache.reinspect.contains(&req.pod_uid)
            {
                // A relist that listed after the caller's mark saw nothing of this pod. (A
                // pod it listed but could not read is not "nothing": it is read now, and a
                // failure goes to the caller as an error, as upstream's cache keeps the
                // inspection error, so pod-sync never takes it for gone and starts a
                // second sandbox.)
                return Ok(Response::new(RuntimePodStatus {
                    uid: req.pod_uid,
                    timestamp_unix_nanos: cache.listed_at_unix_nanos,
                    ..Default::default()
                }));
            }
        }
        // The cache is older than the caller's last action: read this pod now.
        let uid = req.pod_uid.as_str();
        let status = self.cri.pod_status(uid).await?;
        if !status.sandboxes.is_empty() || !status.containers.is_empty() {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let newer = cache
                .pods
                .get(uid)
                .is_none_or(|s| s.timestamp_unix_nanos < status.timestamp_unix_nanos);
            if newer {
                cache.pods.insert(uid.to_string(), status.clone());
            }
        }
        Ok(Response::new(status))
    }

    async fn health(
        &self,
        _request: Request<PlegHealthRequest>,
    ) -> Result<Response<PlegHealthResponse>, Status> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let reference = cache.last_relist.unwrap_or(self.started);
        let age = SystemTime::now()
            .duration_since(reference)
            .unwrap_or_default();
        let healthy = age <= RELIST_THRESHOLD;
        let message = if healthy {
            String::new()
        } else {
            format!("pleg was last seen active {age:?} ago; threshold is {RELIST_THRESHOLD:?}")
        };
        Ok(Response::new(PlegHealthResponse {
            healthy,
            last_relist_unix_nanos: cache
                .last_relist
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos() as i64)
                .unwrap_or_default(),
            last_relist_duration_seconds: cache.last_relist_duration.as_secs_f64(),
            message,
        }))
    }
}
