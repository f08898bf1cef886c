//! One helper for every long-lived watch stream: open it, forward its messages, and when
//! it breaks (the peer restarted, or we did), back off and open it again. Consumers treat
//! the first message after [`WatchEvent::Connected`] as a fresh snapshot: chunked
//! snapshots are reassembled here, so a consumer only ever sees a complete one.

use crate::Shutdown;
use crate::chunk::{Assembler, Chunked};
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Debug)]
pub enum WatchEvent<T> {
    /// A new stream is open; its first message is a snapshot.
    Connected,
    Message(T),
    /// The stream ended or failed; a new one will be opened.
    Disconnected(String),
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Keeps a watch open until `shutdown`. `open` starts one stream.
pub fn watch_with_retry<T, F, Fut>(
    what: &'static str,
    shutdown: Shutdown,
    mut open: F,
) -> mpsc::Receiver<WatchEvent<T>>
where
    T: Chunked + Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<tonic::Streaming<T>, tonic::Status>> + Send,
{
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let mut backoff = MIN_BACKOFF;
        loop {
            let reason = tokio::select! {
                _ = shutdown.wait() => return,
                r = run_once(&mut open, &tx) => r,
            };
            let Some((connected, reason)) = reason else {
                return;
            }; // consumer gone
            if connected {
                backoff = MIN_BACKOFF;
            }
            if shutdown.is_triggered() {
                return;
            }
            tracing::debug!(watch = what, %reason, ?backoff, "watch broken; reconnecting");
            if tx.send(WatchEvent::Disconnected(reason)).await.is_err() {
                return;
            }
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            if backoff == MAX_BACKOFF {
                tracing::warn!(
                    watch = what,
                    "peer still unreachable; retrying every {MAX_BACKOFF:?}"
                );
            }
        }
    });
    rx
}

/// Runs one stream to its end: whether it had connected, and why it ended; `None` when
/// the consumer has gone away.
async fn run_once<T, F, Fut>(
    open: &mut F,
    tx: &mpsc::Sender<WatchEvent<T>>,
) -> Option<(bool, String)>
where
    T: Chunked,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Streaming<T>, tonic::Status>>,
{
    let mut stream = match open().await {
        Ok(s) => s,
        Err(status) => return Some((false, format!("open failed: {}", status.message()))),
    };
    tx.send(WatchEvent::Connected).await.ok()?;
    // A stream that breaks mid-snapshot drops the partial one with this assembler.
    let mut assembler = Assembler::default();
    loop {
        match stream.message().await {
            Ok(Some(m)) => match assembler.push(m) {
                Ok(Some(m)) => tx.send(WatchEvent::Message(m)).await.ok()?,
                Ok(None) => {}
                Err(reason) => return Some((true, format!("stream failed: {reason}"))),
            },
            Ok(None) => return Some((true, "stream ended".into())),
            Err(status) => return Some((true, format!("stream failed: {}", status.message()))),
        }
    }
}

/// A probe instance's results (`Prober.Watch`) through [`watch_with_retry`], for every
/// follower of them (pod-sync applies them, http-server's node page shows them). Chunked
/// snapshots are asked for: a chunk applies like any results (nothing is cleared).
pub fn watch_probe_results(
    channel: crate::Channel,
    shutdown: Shutdown,
) -> mpsc::Receiver<WatchEvent<nodeagent_proto::api::ProbeResultUpdate>> {
    use crate::WithLimits;
    use nodeagent_proto::api::WatchProbeResultsRequest;
    use nodeagent_proto::api::prober_client::ProberClient;
    let client = ProberClient::new(channel).with_limits();
    watch_with_retry("probe", shutdown, move || {
        let mut c = client.clone();
        let request = WatchProbeResultsRequest {
            accept_chunked_snapshot: true,
        };
        async move { Ok(c.watch(request).await?.into_inner()) }
    })
}
