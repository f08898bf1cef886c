//! The server half of "snapshot, then deltas": every Watch handler sends its snapshot,
//! then forwards deltas from a broadcast channel until the client goes away or we shut
//! down. A client that falls too far behind gets an error and resubscribes, receiving a
//! fresh snapshot, rather than a silently incomplete stream.

use crate::Shutdown;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

pub type WatchStream<M> = ReceiverStream<Result<M, tonic::Status>>;

/// `deltas` must have been subscribed while the snapshot was taken (under the same lock),
/// so that nothing falls between the two.
pub fn snapshot_then_deltas<M>(
    snapshot: M,
    mut deltas: broadcast::Receiver<M>,
    shutdown: Shutdown,
) -> WatchStream<M>
where
    M: Clone + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        if tx.send(Ok(snapshot)).await.is_err() {
            return;
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
