//! Message size limits and chunked snapshots. Every generated client and server uses the
//! same explicit limits ([`WithLimits`]); a snapshot that would not fit one message is sent
//! as several chunks ([`Chunked::into_chunks`]) and reassembled by the consumer
//! ([`Assembler`]) before anything acts on it, so a partial snapshot is never applied.

use nodeagent_proto::api::{
    PlegSnapshot, PlegWatchResponse, PodConfigUpdate, PodStatusUpdate, ProbeResultUpdate,
    ProberMembership, pleg_watch_response::Kind, pod_config_update::Op,
};
use prost::Message;

/// The largest message any of our clients or servers encodes or decodes. A message holds at
/// most one pod in a delta (at most [`MAX_POD_JSON_BYTES`] plus its status) or one snapshot
/// chunk; the rest is headroom for the unary calls that still return lists (`ListPods`).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The size a snapshot chunk aims at. Under tonic's 4 MiB default, so a chunk also fits a
/// peer that kept the default; a single item larger than this goes alone in its chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 2 << 20;

/// The largest pod (its canonical JSON) a source accepts: the API server's request limit
/// (1.5 MiB, `--max-request-bytes` default of etcd and kube-apiserver).
pub const MAX_POD_JSON_BYTES: usize = 3 << 19;

/// Explicit message limits on a generated client or server.
pub trait WithLimits {
    /// Sets [`MAX_MESSAGE_BYTES`] for both encoding and decoding.
    fn with_limits(self) -> Self;
}

macro_rules! limits_for_clients {
    ($($client:ty),* $(,)?) => {$(
        impl<T> WithLimits for $client
        where
            T: tonic::client::GrpcService<tonic::body::Body>,
            T::Error: Into<tonic::codegen::StdError>,
            T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
            <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
        {
            fn with_limits(self) -> Self {
                self.max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES)
            }
        }
    )*};
}

macro_rules! limits_for_servers {
    ($($server:ident :: $name:ident : $svc:path),* $(,)?) => {$(
        impl<T: $svc> WithLimits for nodeagent_proto::api::$server::$name<T> {
            fn with_limits(self) -> Self {
                self.max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES)
            }
        }
    )*};
}

use nodeagent_proto::api;
limits_for_clients!(
    api::config_source_client::ConfigSourceClient<T>,
    api::pleg_client::PlegClient<T>,
    api::pod_sync_client::PodSyncClient<T>,
    api::prober_client::ProberClient<T>,
    api::volume_client::VolumeClient<T>,
    api::node_status_client::NodeStatusClient<T>,
    api::metrics_client::MetricsClient<T>,
    tonic_health::pb::health_client::HealthClient<T>,
);
limits_for_servers!(
    config_source_server::ConfigSourceServer: api::config_source_server::ConfigSource,
    pleg_server::PlegServer: api::pleg_server::Pleg,
    pod_sync_server::PodSyncServer: api::pod_sync_server::PodSync,
    prober_server::ProberServer: api::prober_server::Prober,
    volume_server::VolumeServer: api::volume_server::Volume,
    node_status_server::NodeStatusServer: api::node_status_server::NodeStatus,
    metrics_server::MetricsServer: api::metrics_server::Metrics,
);

/// A stream message that may be (a chunk of) a snapshot.
pub trait Chunked: Sized {
    /// Whether this message is a snapshot or a chunk of one.
    fn is_snapshot(&self) -> bool;
    /// Whether more chunks of the same snapshot follow.
    fn continues(&self) -> bool;
    /// Splits a snapshot into chunks of about `target` encoded bytes each.
    fn into_chunks(self, target: usize) -> Vec<Self>;
    /// Appends the next chunk's items; takes the other fields from it.
    fn append(&mut self, next: Self);
}

/// Groups `items` so that each group's encoded size is at most `target`, except a group
/// of one item that alone is larger. Always at least one group.
fn group<I>(items: Vec<I>, target: usize, len: impl Fn(&I) -> usize) -> Vec<Vec<I>> {
    let mut groups = vec![Vec::new()];
    let mut size = 0;
    for item in items {
        // Field tag plus length prefix: at most 1 + 10 bytes per item.
        let len = len(&item) + 11;
        let current = groups.last_mut().expect("never empty");
        if !current.is_empty() && size + len > target {
            groups.push(Vec::new());
            size = 0;
        }
        size += len;
        groups.last_mut().expect("never empty").push(item);
    }
    groups
}

/// Splits `items` into chunks made by `make(items, continues)`.
fn split<I: Message, M>(items: Vec<I>, target: usize, make: impl Fn(Vec<I>, bool) -> M) -> Vec<M> {
    split_by(items, target, I::encoded_len, make)
}

fn split_by<I, M>(
    items: Vec<I>,
    target: usize,
    len: impl Fn(&I) -> usize,
    make: impl Fn(Vec<I>, bool) -> M,
) -> Vec<M> {
    let groups = group(items, target, len);
    let last = groups.len() - 1;
    groups
        .into_iter()
        .enumerate()
        .map(|(i, items)| make(items, i < last))
        .collect()
}

impl Chunked for PodConfigUpdate {
    fn is_snapshot(&self) -> bool {
        self.op == Op::Snapshot as i32
    }
    fn continues(&self) -> bool {
        self.snapshot_continues
    }
    fn into_chunks(mut self, target: usize) -> Vec<Self> {
        let pods = std::mem::take(&mut self.pods);
        split(pods, target, |pods, continues| Self {
            pods,
            snapshot_continues: continues,
            ..self.clone()
        })
    }
    fn append(&mut self, mut next: Self) {
        let mut pods = std::mem::take(&mut self.pods);
        pods.append(&mut next.pods);
        *self = Self { pods, ..next };
    }
}

impl Chunked for PodStatusUpdate {
    fn is_snapshot(&self) -> bool {
        self.snapshot
    }
    fn continues(&self) -> bool {
        self.snapshot_continues
    }
    fn into_chunks(mut self, target: usize) -> Vec<Self> {
        let pods = std::mem::take(&mut self.pods_json);
        split_by(pods, target, Vec::len, |pods_json, continues| Self {
            pods_json,
            snapshot_continues: continues,
            ..self.clone()
        })
    }
    fn append(&mut self, mut next: Self) {
        let mut pods = std::mem::take(&mut self.pods_json);
        pods.append(&mut next.pods_json);
        *self = Self {
            pods_json: pods,
            ..next
        };
    }
}

impl Chunked for ProbeResultUpdate {
    fn is_snapshot(&self) -> bool {
        self.snapshot
    }
    fn continues(&self) -> bool {
        self.snapshot_continues
    }
    fn into_chunks(mut self, target: usize) -> Vec<Self> {
        let results = std::mem::take(&mut self.results);
        split(results, target, |results, continues| Self {
            results,
            snapshot_continues: continues,
            ..self.clone()
        })
    }
    fn append(&mut self, mut next: Self) {
        let mut results = std::mem::take(&mut self.results);
        results.append(&mut next.results);
        *self = Self { results, ..next };
    }
}

/// A member list is small and always whole: every message stands alone, none is chunked.
impl Chunked for ProberMembership {
    fn is_snapshot(&self) -> bool {
        false
    }
    fn continues(&self) -> bool {
        false
    }
    fn into_chunks(self, _target: usize) -> Vec<Self> {
        vec![self]
    }
    fn append(&mut self, next: Self) {
        *self = next;
    }
}

impl Chunked for PlegWatchResponse {
    fn is_snapshot(&self) -> bool {
        matches!(self.kind, Some(Kind::Snapshot(_)))
    }
    fn continues(&self) -> bool {
        matches!(&self.kind, Some(Kind::Snapshot(s)) if s.snapshot_continues)
    }
    fn into_chunks(self, target: usize) -> Vec<Self> {
        let Some(Kind::Snapshot(snapshot)) = self.kind else {
            return vec![self];
        };
        let revision = snapshot.revision;
        split(snapshot.pods, target, |pods, continues| Self {
            kind: Some(Kind::Snapshot(PlegSnapshot {
                revision,
                pods,
                snapshot_continues: continues,
            })),
        })
    }
    fn append(&mut self, next: Self) {
        let (Some(Kind::Snapshot(mine)), Some(Kind::Snapshot(mut theirs))) =
            (&mut self.kind, next.kind)
        else {
            return;
        };
        mine.pods.append(&mut theirs.pods);
        mine.revision = theirs.revision;
        mine.snapshot_continues = theirs.snapshot_continues;
    }
}

/// Reassembles chunked snapshots on the consumer side.
#[derive(Debug)]
pub struct Assembler<M> {
    pending: Option<M>,
}

impl<M> Default for Assembler<M> {
    fn default() -> Self {
        Self { pending: None }
    }
}

impl<M: Chunked> Assembler<M> {
    /// Feeds one received message: `Ok(Some)` for a message to act on (a delta, or a
    /// complete snapshot), `Ok(None)` while a snapshot is incomplete, and an error for a
    /// delta in the middle of a snapshot (the stream must be reopened).
    pub fn push(&mut self, message: M) -> Result<Option<M>, String> {
        if !message.is_snapshot() {
            if self.pending.is_some() {
                self.pending = None;
                return Err("a delta arrived inside a chunked snapshot".into());
            }
            return Ok(Some(message));
        }
        let continues = message.continues();
        let whole = match self.pending.take() {
            Some(mut pending) => {
                pending.append(message);
                pending
            }
            None => message,
        };
        if continues {
            self.pending = Some(whole);
            Ok(None)
        } else {
            Ok(Some(whole))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeagent_proto::api::SourcePod;

    fn snapshot(pods: usize, bytes: usize) -> PodConfigUpdate {
        PodConfigUpdate {
            op: Op::Snapshot as i32,
            revision: 7,
            pods: (0..pods)
                .map(|i| SourcePod {
                    uid: format!("uid-{i}"),
                    pod_json: vec![b'x'; bytes],
                    ..Default::default()
                })
                .collect(),
            all_sources_ready: true,
            ..Default::default()
        }
    }

    #[test]
    fn chunks_stay_under_the_target_and_reassemble_in_order() {
        let whole = snapshot(20, 400 << 10);
        assert!(whole.encoded_len() > 4 << 20);
        let chunks = whole.clone().into_chunks(SNAPSHOT_CHUNK_BYTES);
        assert!(chunks.len() > 1);
        for (i, c) in chunks.iter().enumerate() {
            assert!(c.encoded_len() <= SNAPSHOT_CHUNK_BYTES, "chunk {i} too big");
            assert_eq!(c.continues(), i + 1 < chunks.len());
            assert!(c.is_snapshot() && c.all_sources_ready);
        }
        let mut assembler = Assembler::default();
        let mut done = Vec::new();
        for c in chunks {
            done.extend(assembler.push(c).unwrap());
        }
        assert_eq!(done, vec![whole]);
    }

    #[test]
    fn an_item_larger_than_the_target_goes_alone() {
        let chunks = snapshot(3, SNAPSHOT_CHUNK_BYTES + 1).into_chunks(SNAPSHOT_CHUNK_BYTES);
        assert_eq!(chunks.len(), 3);
        let empty = snapshot(0, 0).into_chunks(SNAPSHOT_CHUNK_BYTES);
        assert_eq!(empty.len(), 1, "an empty snapshot is still sent");
        assert!(!empty[0].continues());
    }

    #[test]
    fn a_partial_snapshot_is_never_released() {
        let mut chunks = snapshot(20, 400 << 10).into_chunks(SNAPSHOT_CHUNK_BYTES);
        chunks.pop();
        let mut assembler = Assembler::default();
        for c in chunks {
            assert_eq!(assembler.push(c).unwrap(), None);
        }
        let delta = PodConfigUpdate {
            op: Op::Add as i32,
            ..Default::default()
        };
        assert!(assembler.push(delta.clone()).is_err(), "delta mid-snapshot");
        assert_eq!(assembler.push(delta.clone()).unwrap(), Some(delta));
    }

    #[test]
    fn pleg_and_status_snapshots_chunk_too() {
        let pleg = PlegWatchResponse {
            kind: Some(Kind::Snapshot(PlegSnapshot {
                revision: 3,
                pods: (0..50)
                    .map(|i| nodeagent_proto::api::RuntimePodStatus {
                        uid: format!("{i}{}", "u".repeat(100 << 10)),
                        ..Default::default()
                    })
                    .collect(),
                snapshot_continues: false,
            })),
        };
        let chunks = pleg.clone().into_chunks(1 << 20);
        assert!(chunks.len() >= 5);
        let mut assembler = Assembler::default();
        let out: Vec<_> = chunks
            .into_iter()
            .filter_map(|c| assembler.push(c).unwrap())
            .collect();
        assert_eq!(out, vec![pleg]);
        let status = PodStatusUpdate {
            snapshot: true,
            pods_json: vec![vec![b'{'; 300 << 10]; 10],
            ..Default::default()
        };
        let chunks = status.clone().into_chunks(1 << 20);
        assert_eq!(chunks.len(), 4);
        let mut assembler = Assembler::default();
        let out: Vec<_> = chunks
            .into_iter()
            .filter_map(|c| assembler.push(c).unwrap())
            .collect();
        assert_eq!(out, vec![status]);
    }
}
