//! Binding a service's unix socket without racing its predecessor. Whoever serves on
//! `<sock>` holds an exclusive `flock` on `<sock>.lock` for as long as it lives (the
//! kernel drops it when the process dies), so only the holder may unlink a stale socket
//! and bind; a starting instance waits a few seconds for an exiting one.

use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a starting service waits for a predecessor to let go of its socket.
pub const BIND_WINDOW: Duration = Duration::from_secs(10);

const RETRY_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug)]
pub(crate) enum BindError {
    /// Another live process holds the lock or answers on the socket.
    InUse,
    Io(std::io::Error),
}

/// A bound socket and the lock that makes it ours. Dropping it (after removing the
/// socket) lets the next instance in.
pub(crate) struct UnixBinding {
    pub listener: tokio::net::UnixListener,
    /// Held until the socket is removed.
    pub lock: Flock<File>,
}

/// Binds `path`, retrying for `window` while another process holds it.
pub(crate) async fn bind_unix(path: &Path, window: Duration) -> Result<UnixBinding, BindError> {
    let deadline = tokio::time::Instant::now() + window;
    let mut waiting = false;
    loop {
        let owned = path.to_path_buf();
        let attempt = tokio::task::spawn_blocking(move || try_bind(&owned))
            .await
            .map_err(|e| BindError::Io(std::io::Error::other(e)))?;
        match attempt {
            Ok((listener, lock)) => {
                listener.set_nonblocking(true).map_err(BindError::Io)?;
                let listener =
                    tokio::net::UnixListener::from_std(listener).map_err(BindError::Io)?;
                return Ok(UnixBinding { listener, lock });
            }
            Err(BindError::InUse) if tokio::time::Instant::now() < deadline => {
                if !waiting {
                    tracing::warn!(path = %path.display(), "another process holds the socket; waiting up to {window:?} for it to exit");
                    waiting = true;
                }
                tokio::time::sleep(RETRY_EVERY).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `<sock>.lock`, next to the socket.
pub(crate) fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// One attempt: take the lock, remove a stale socket, bind, set mode 0660.
fn try_bind(path: &Path) -> Result<(std::os::unix::net::UnixListener, Flock<File>), BindError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(BindError::Io)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(lock_path(path))
        .map_err(BindError::Io)?;
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Err(BindError::InUse),
        Err((_, e)) => return Err(BindError::Io(e.into())),
    };
    // Every instance that binds here holds the lock first, so a socket file left here is
    // stale, unless an instance from before the lock existed still answers on it.
    if path.symlink_metadata().is_ok() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(BindError::InUse);
        }
        tracing::info!(path = %path.display(), "removing stale socket");
        std::fs::remove_file(path).map_err(BindError::Io)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(BindError::Io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(BindError::Io)?;
    Ok((listener, lock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_held_one_refused_after_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.sock");
        {
            let _stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        } // closed: the file stays behind, nobody answers, nobody holds the lock.
        let live = bind_unix(&path, Duration::ZERO)
            .await
            .expect("stale socket replaced");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let started = std::time::Instant::now();
        let second = bind_unix(&path, Duration::from_millis(600)).await;
        assert!(
            matches!(second, Err(BindError::InUse)),
            "{:?}",
            second.err()
        );
        assert!(started.elapsed() >= Duration::from_millis(600), "retried");
        assert!(path.exists(), "the live socket was not unlinked");
        drop(live);
    }

    #[tokio::test]
    async fn a_waiting_instance_takes_over_when_the_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.sock");
        let first = bind_unix(&path, Duration::ZERO).await.expect("first bind");
        let waiting = tokio::spawn({
            let path = path.clone();
            async move { bind_unix(&path, Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "must wait while the lock is held");
        drop(first); // the socket file stays behind, as after a crash
        let second = waiting.await.unwrap().expect("took over");
        let _peer = tokio::net::UnixStream::connect(&path)
            .await
            .expect("the new socket answers");
        drop(second);
    }

    #[tokio::test]
    async fn a_socket_that_answers_without_the_lock_is_not_unlinked() {
        // An instance from before the lock (an upgrade) still serves: leave it alone.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.sock");
        let _old = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let r = bind_unix(&path, Duration::ZERO).await;
        assert!(matches!(r, Err(BindError::InUse)));
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    }
}
