//! config-source's gRPC API.

use crate::store::PodStore;
use nodeagent_proto::api::{
    PodConfigUpdate, WatchConfigRequest, config_source_server::ConfigSource,
};
use nodeagent_transport::{Shutdown, WatchStream, snapshot_then_deltas};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

pub struct ConfigSourceService {
    pub store: Arc<Mutex<PodStore>>,
    pub shutdown: Shutdown,
}

#[tonic::async_trait]
impl ConfigSource for ConfigSourceService {
    type WatchStream = WatchStream<PodConfigUpdate>;

    async fn watch(
        &self,
        request: Request<WatchConfigRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (snapshot, rx) = self
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribe();
        tracing::info!(
            pods = snapshot.pods.len(),
            revision = snapshot.revision,
            "watcher subscribed"
        );
        Ok(Response::new(snapshot_then_deltas(
            snapshot,
            rx,
            self.shutdown.clone(),
            request.get_ref().accept_chunked_snapshot,
        )))
    }
}
