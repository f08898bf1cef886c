//! pod-sync's state files under `<root-dir>/pod-sync/`: what it must not forget across a
//! restart that neither the pod sources nor the runtime can tell it again. Each is written
//! whole (a temporary file renamed) on a blocking thread and read back at start; a missing
//! file is an empty value, a broken one is logged and taken as empty.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

/// One JSON state file holding a `T`.
#[derive(Debug)]
pub struct JsonFile<T> {
    path: PathBuf,
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for JsonFile<T> {
    fn clone(&self) -> Self {
        Self {
            path: self.path.clone(),
            value: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned + Default + Send + 'static> JsonFile<T> {
    /// `<root-dir>/pod-sync/<name>`.
    pub fn new(root_dir: &Path, name: &str) -> Self {
        Self {
            path: root_dir.join("pod-sync").join(name),
            value: PhantomData,
        }
    }

    /// The value saved last; empty (with a warning) when the file is missing or broken.
    pub async fn load(&self) -> T {
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || read(&path)).await;
        match read.map_err(std::io::Error::other).and_then(|r| r) {
            Ok(value) => value,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "saved state not restored");
                T::default()
            }
        }
    }

    /// Writes the value whole (temporary file + rename) on a blocking thread.
    pub async fn save(&self, value: &T) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            nodeagent_config::state::write_atomically(&path, &bytes)
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

fn read<T: DeserializeOwned + Default>(path: &Path) -> std::io::Result<T> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(e),
    }
}
