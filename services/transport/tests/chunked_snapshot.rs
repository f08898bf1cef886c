//! A snapshot larger than tonic's default 4 MiB limit crosses a real server and client over
//! a unix socket and is reassembled; a snapshot cut off mid-way is never handed on.

use nodeagent_proto::api::config_source_client::ConfigSourceClient;
use nodeagent_proto::api::config_source_server::{ConfigSource, ConfigSourceServer};
use nodeagent_proto::api::pod_config_update::Op;
use nodeagent_proto::api::{PodConfigUpdate, SourcePod, WatchConfigRequest};
use nodeagent_transport::{
    Address, Shutdown, WatchEvent, WatchStream, WithLimits, shutdown_channel, snapshot_then_deltas,
    watch_with_retry,
};
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status};

/// 20 pods of 400 KiB: about 8 MiB, twice tonic's default decoding limit.
fn big_snapshot() -> PodConfigUpdate {
    PodConfigUpdate {
        op: Op::Snapshot as i32,
        revision: 42,
        pods: (0..20)
            .map(|i| SourcePod {
                source: "file".into(),
                uid: format!("uid-{i}"),
                pod_json: vec![b'p'; 400 << 10],
                trace: None,
            })
            .collect(),
        all_sources_ready: true,
        ..Default::default()
    }
}

struct Service {
    deltas: broadcast::Sender<PodConfigUpdate>,
    shutdown: Shutdown,
    /// Send only the first chunk, then fail the stream.
    cut_short: bool,
}

#[tonic::async_trait]
impl ConfigSource for Service {
    type WatchStream = WatchStream<PodConfigUpdate>;

    async fn watch(
        &self,
        request: Request<WatchConfigRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let chunked = request.get_ref().accept_chunked_snapshot;
        if self.cut_short {
            let (tx, rx) = mpsc::channel(4);
            let first = nodeagent_transport::Chunked::into_chunks(
                big_snapshot(),
                nodeagent_transport::SNAPSHOT_CHUNK_BYTES,
            )
            .remove(0);
            assert!(nodeagent_transport::Chunked::continues(&first));
            tx.send(Ok(first)).await.unwrap();
            tx.send(Err(Status::internal("cut short"))).await.unwrap();
            return Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
                rx,
            )));
        }
        let stream = snapshot_then_deltas(
            big_snapshot(),
            self.deltas.subscribe(),
            self.shutdown.clone(),
            chunked,
        );
        Ok(Response::new(stream))
    }
}

/// Serves a [`Service`] on a fresh unix socket; returns its address.
async fn serve(dir: &tempfile::TempDir, cut_short: bool, shutdown: Shutdown) -> Address {
    let path = dir.path().join("config-source.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let service = Service {
        deltas: broadcast::channel(16).0,
        shutdown: shutdown.clone(),
        cut_short,
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ConfigSourceServer::new(service).with_limits())
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async move { shutdown.wait().await },
            ),
    );
    Address::Unix(path)
}

fn client(address: &Address) -> ConfigSourceClient<nodeagent_transport::Channel> {
    ConfigSourceClient::new(nodeagent_transport::connect(address)).with_limits()
}

/// Follows the server through the watch helper, as a consumer that accepts chunks does.
fn watch_chunked(
    address: &Address,
    shutdown: Shutdown,
) -> mpsc::Receiver<WatchEvent<PodConfigUpdate>> {
    let c = client(address);
    watch_with_retry("config-source", shutdown, move || {
        let mut c = c.clone();
        async move {
            let request = WatchConfigRequest {
                accept_chunked_snapshot: true,
            };
            Ok(c.watch(request).await?.into_inner())
        }
    })
}

#[tokio::test]
async fn a_snapshot_over_4_mib_is_chunked_and_reassembled() {
    let dir = tempfile::tempdir().unwrap();
    let (_trigger, shutdown) = shutdown_channel();
    let address = serve(&dir, false, shutdown.clone()).await;

    // On the wire: several chunks, each under tonic's default limit.
    let mut raw = client(&address)
        .max_decoding_message_size(4 << 20)
        .watch(WatchConfigRequest {
            accept_chunked_snapshot: true,
        })
        .await
        .unwrap()
        .into_inner();
    let first = raw.message().await.unwrap().unwrap();
    assert!(first.snapshot_continues && first.pods.len() < 20);

    // Through the watch helper: one complete snapshot.
    let mut rx = watch_chunked(&address, shutdown.clone());
    let deadline = std::time::Duration::from_secs(20);
    let snapshot = tokio::time::timeout(deadline, async {
        loop {
            match rx.recv().await.unwrap() {
                WatchEvent::Message(m) => return m,
                WatchEvent::Disconnected(reason) => panic!("stream broke: {reason}"),
                WatchEvent::Connected => {}
            }
        }
    })
    .await
    .expect("the snapshot arrives");
    assert_eq!(snapshot, big_snapshot(), "reassembled whole and in order");
}

#[tokio::test]
async fn an_older_consumer_gets_the_snapshot_in_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let (_trigger, shutdown) = shutdown_channel();
    let address = serve(&dir, false, shutdown).await;
    let mut stream = client(&address)
        .watch(WatchConfigRequest::default())
        .await
        .unwrap()
        .into_inner();
    let whole = stream.message().await.unwrap().unwrap();
    assert_eq!(whole, big_snapshot());
    // What every consumer did before the limits were explicit: tonic's default 4 MiB
    // decoding limit and an unchunked snapshot, so the stream could never be followed.
    let mut old = ConfigSourceClient::new(nodeagent_transport::connect(&address));
    let mut stream = old
        .watch(WatchConfigRequest::default())
        .await
        .unwrap()
        .into_inner();
    let err = stream.message().await.unwrap_err();
    assert!(err.message().contains("message length too large"), "{err}");
}

#[tokio::test]
async fn a_snapshot_cut_short_is_never_handed_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_trigger, shutdown) = shutdown_channel();
    let address = serve(&dir, true, shutdown.clone()).await;
    let mut rx = watch_chunked(&address, shutdown.clone());
    let mut breaks = 0;
    let deadline = std::time::Duration::from_secs(20);
    tokio::time::timeout(deadline, async {
        while breaks < 3 {
            match rx.recv().await.unwrap() {
                WatchEvent::Message(m) => panic!("a partial snapshot of {} pods", m.pods.len()),
                WatchEvent::Disconnected(reason) => {
                    assert!(reason.contains("cut short"), "{reason}");
                    breaks += 1;
                }
                WatchEvent::Connected => {}
            }
        }
    })
    .await
    .expect("three broken streams");
}
