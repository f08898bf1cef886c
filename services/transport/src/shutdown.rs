//! The shutdown signal passed into every service's `run`, so that tests can drive it.
//! It also carries the way back: a part of the service that cannot go on (a server that
//! cannot bind) reports a fatal error through it, which ends the process at once.

use std::sync::Arc;
use tokio::sync::watch;

/// Fires once; every clone sees it.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
    /// The first fatal error reported by any clone; shared so `run_main` sees it.
    fatal: Arc<watch::Sender<Option<String>>>,
}

#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

pub fn shutdown_channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown::from_receiver(rx))
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    /// A signal that never fires (for tools and tests that stop by dropping).
    pub fn never() -> Self {
        let (tx, rx) = watch::channel(false);
        std::mem::forget(tx);
        Self::from_receiver(rx)
    }

    fn from_receiver(rx: watch::Receiver<bool>) -> Self {
        Self {
            rx,
            fatal: Arc::new(watch::channel(None).0),
        }
    }

    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow() || self.fatal.borrow().is_some()
    }

    /// Resolves once shutdown is triggered (or its trigger is dropped), or a fatal error
    /// was reported.
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        tokio::select! {
            _ = rx.wait_for(|v| *v) => {}
            _ = self.failed() => {}
        }
    }

    /// Reports that the service cannot go on (the first report wins). Every `wait`
    /// returns, and `run_main` exits non-zero with `why` without waiting for the drain.
    pub fn fail(&self, why: impl Into<String>) {
        let why = why.into();
        self.fatal.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(why);
            true
        });
    }

    /// The first fatal error reported, if any.
    pub fn fatal_error(&self) -> Option<String> {
        self.fatal.borrow().clone()
    }

    /// Resolves with the first fatal error, once one is reported.
    pub async fn failed(&self) -> String {
        let mut rx = self.fatal.subscribe();
        let why = rx.wait_for(Option::is_some).await.map(|why| why.clone());
        match why {
            Ok(why) => why.unwrap_or_default(),
            // Unreachable: this clone holds the sender.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGTERM handler");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received, shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_trigger() {
        let (trigger, shutdown) = shutdown_channel();
        let other = shutdown.clone();
        assert!(!other.is_triggered());
        let waiter = tokio::spawn(async move { other.wait().await });
        trigger.trigger();
        waiter.await.unwrap();
        assert!(shutdown.is_triggered());
    }

    #[tokio::test]
    async fn a_fatal_error_ends_every_wait_and_the_first_one_is_kept() {
        let (_trigger, shutdown) = shutdown_channel();
        let other = shutdown.clone();
        let waiter = tokio::spawn(async move { other.wait().await });
        shutdown.clone().fail("cannot bind");
        shutdown.fail("second");
        waiter.await.unwrap();
        assert!(shutdown.is_triggered());
        assert_eq!(shutdown.failed().await, "cannot bind");
    }
}
