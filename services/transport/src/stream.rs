//! The server half of "snapshot, then deltas": every Watch handler sends its snapshot,
//! then forwards deltas from a broadcast channel until the client goes away or we shut
//! down. A client that falls too far behind gets an error and resubscribes, receiving a
//! fresh snapshot, rather than a silently incomplete stream.
//!
//! Every queue here is bounded: the broadcast channel each producer owns has a fixed
//! capacity (a slow consumer lags and is cut off, it never grows the producer), and the
//! per-watcher queue below holds at most [`WATCHER_QUEUE`] messages.

use crate::Shutdown;
use crate::chunk::{Chunked, SNAPSHOT_CHUNK_BYTES};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

pub type WatchStream<M> = ReceiverStream<Result<M, tonic::Status>>;

/// Messages queued for one watcher before the stream applies back-pressure.
const WATCHER_QUEUE: usize = 64;

/// `deltas` must have been subscribed while the snapshot was taken (under the same lock),
/// so that nothing falls between the two. With `chunked` (the consumer said it reassembles
/// chunks) a large snapshot goes out in chunks of about [`SNAPSHOT_CHUNK_BYTES`]; without
/// it (an older consumer) in one message, as before.
pub fn snapshot_then_deltas<M>(
    snapshot: M,
    mut deltas: broadcast::Receiver<M>,
    shutdown: Shutdown,
    chunked: bool,
) -> WatchStream<M>
where
    M: Chunked + Clone + Send + 'static,
{
    let (tx, rx) = mpsc::channel(WATCHER_QUEUE);
    let chunks = if chunked {
        snapshot.into_chunks(SNAPSHOT_CHUNK_BYTES)
    } else {
        vec![snapshot]
    };
    tokio::spawn(async move {
        for chunk in chunks {
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
        loop {
            let next = tokio::select! {
                _ = shutdown.wait() => return,
                _ = tx.closed() => return,
                n = deltas.recv() => n,
            };
            let item = match next {
                Ok(m) => Ok(m),
                Err(broadcast::error::RecvError::Lagged(n)) => Err(tonic::Status::data_loss(
                    format!("watcher fell {n} messages behind; resubscribe for a fresh snapshot"),
                )),
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let lagged = item.is_err();
            if tx.send(item).await.is_err() || lagged {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}
