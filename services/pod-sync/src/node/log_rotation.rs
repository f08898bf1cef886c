//! Container log rotation, as upstream's container log manager
//! (`pkg/kubelet/logs/container_log_manager.go`): every 10 s, the log of each running
//! container that has reached `containerLogMaxSize` is renamed to
//! `<log>.<YYYYMMDD-hhmmss>` and the runtime is told to reopen it (CRI
//! `ReopenContainerLog`); at most `containerLogMaxFiles` files are kept per container (the
//! live one included), the oldest removed first; rotated files of containers the runtime no
//! longer has are removed. Before each rotation, every rotated file but the one about to be
//! made is gzipped as upstream's `compressLog` (to `<file>.tmp`, renamed to `<file>.gz`,
//! then the original removed), so the newest rotated file stays plain for readers that
//! were following it; `.tmp` leftovers and originals whose `.gz` exists are removed first.
//! Difference from upstream: only logs under `podLogsDir` are touched (upstream rotates
//! every container of the runtime).

use nodeagent_cri::Cri;
use nodeagent_cri::api::{ContainerState, ReopenContainerLogRequest};
use nodeagent_proto::k8s::labels;
use nodeagent_transport::Shutdown;
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The suffix format of a rotated file (Go's `20060102-150405`).
const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";
/// Left by an interrupted compression (upstream's), never in use.
const TMP_SUFFIX: &str = ".tmp";
/// A compressed rotated file (upstream's).
const COMPRESS_SUFFIX: &str = ".gz";

/// `containerLogMaxSize` and `containerLogMaxFiles`.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub max_size: u64,
    pub max_files: usize,
    /// `containerLogMonitorInterval`.
    pub monitor_interval: Duration,
}

impl Policy {
    pub fn from_config(config: &nodeagent_config::Config) -> Result<Self, String> {
        let max_size =
            nodeagent_config::quantity::parse_bytes(&config.kubelet.container_log_max_size)?;
        let max_files = usize::try_from(config.kubelet.container_log_max_files)
            .map_err(|_| "containerLogMaxFiles must be positive".to_string())?;
        // upstream's validation: containerLogMonitorInterval >= 3s.
        if config.kubelet.container_log_monitor_interval < Duration::from_secs(3) {
            return Err("containerLogMonitorInterval must be at least 3s".into());
        }
        Ok(Self {
            max_size,
            max_files,
            monitor_interval: config.kubelet.container_log_monitor_interval,
        })
    }
}

/// The rotation loop; runs until `shutdown`.
pub async fn run(cri: Cri, logs_dir: PathBuf, policy: Policy, shutdown: Shutdown) {
    let period = policy.monitor_interval;
    tracing::info!(
        max_size = policy.max_size,
        max_files = policy.max_files,
        "container log rotation"
    );
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tick.tick() => {
                if let Err(e) = rotate_all(&cri, &logs_dir, policy).await {
                    tracing::warn!(error = %e, "container log rotation failed");
                }
            }
        }
    }
}

async fn rotate_all(cri: &Cri, logs_dir: &Path, policy: Policy) -> Result<(), String> {
    let containers = cri
        .list_containers(None)
        .await
        .map_err(|e| format!("ListContainers: {}", e.message()))?;
    let mut live: HashSet<PathBuf> = containers
        .iter()
        .filter_map(|c| labelled_log_path(logs_dir, c))
        .collect();
    for c in &containers {
        if c.state != ContainerState::ContainerRunning as i32 {
            continue;
        }
        let status = match cri.container_status(&c.id).await {
            Ok(s) => s.status,
            Err(e) => {
                tracing::debug!(container.id = %c.id, error = %e.message(), "ContainerStatus failed");
                continue;
            }
        };
        let Some(path) = status.map(|s| PathBuf::from(s.log_path)) else {
            continue;
        };
        if !is_below(&path, logs_dir) {
            continue;
        }
        live.insert(path.clone());
        if let Err(e) = rotate_if_needed(cri, &c.id, &path, policy).await {
            tracing::warn!(container.id = %c.id, path = %path.display(), error = %e, "cannot rotate the container log");
        }
    }
    let dir = logs_dir.to_path_buf();
    blocking(move || remove_orphaned_rotations(&dir, &live)).await
}

/// `<podLogsDir>/<namespace>_<name>_<uid>/<container>/<attempt>.log`, as pod-sync names a
/// container's log, from the labels the container carries.
fn labelled_log_path(logs_dir: &Path, c: &nodeagent_cri::api::Container) -> Option<PathBuf> {
    let label = |k: &str| c.labels.get(k).filter(|v| !v.is_empty());
    let ns = label(labels::POD_NAMESPACE)?;
    let name = label(labels::POD_NAME)?;
    let uid = label(labels::POD_UID)?;
    let meta = c.metadata.as_ref()?;
    Some(
        logs_dir
            .join(format!("{ns}_{name}_{uid}"))
            .join(&meta.name)
            .join(format!("{}.log", meta.attempt)),
    )
}

fn is_below(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
        && path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir))
}

async fn rotate_if_needed(cri: &Cri, id: &str, log: &Path, policy: Policy) -> Result<(), String> {
    let path = log.to_path_buf();
    let size = blocking(move || match std::fs::metadata(&path) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("stat: {e}")),
    })
    .await?;
    let Some(size) = size else {
        // Renamed but not reopened (pod-sync died in between): reopen, as upstream.
        return reopen(cri, id).await;
    };
    if size == 0 || size < policy.max_size {
        return Ok(());
    }
    let path = log.to_path_buf();
    let rotated = log.with_file_name(format!("{}.{}", file_name(log), timestamp_suffix()));
    let target = rotated.clone();
    blocking(move || prepare_rotation(&path, &target, policy.max_files)).await?;
    if let Err(e) = reopen(cri, id).await {
        // Put the log back so that the next round can try again (upstream does the same).
        let (from, to) = (rotated.clone(), log.to_path_buf());
        if let Err(back) =
            blocking(move || std::fs::rename(&from, &to).map_err(|e| e.to_string())).await
        {
            tracing::error!(rotated = %rotated.display(), error = %back, "cannot rename the rotated log back");
        }
        return Err(e);
    }
    tracing::info!(container.id = %id, path = %log.display(), size, "rotated the container log");
    Ok(())
}

async fn reopen(cri: &Cri, id: &str) -> Result<(), String> {
    let mut runtime = cri.runtime.clone();
    runtime
        .reopen_container_log(cri.request(ReopenContainerLogRequest {
            container_id: id.to_string(),
        }))
        .await
        .map(|_| ())
        .map_err(|e| format!("ReopenContainerLog: {}", e.message()))
}

/// Removes unused and excess rotated files so that, with the live log and the one about to
/// be rotated, at most `max_files` remain; gzips the rotated files that are left; then
/// renames the live log to `rotated`. A failed compression stops the rotation (it is tried
/// again next round), as upstream.
fn prepare_rotation(log: &Path, rotated: &Path, max_files: usize) -> Result<(), String> {
    if rotated.exists() {
        return Err(format!("{} exists already", rotated.display()));
    }
    let dir = log.parent().ok_or("the log has no directory")?;
    let base = file_name(log);
    let names = read_names(dir).map_err(|e| format!("listing {}: {e}", dir.display()))?;
    let plan = plan(&names, &base, max_files);
    for name in plan.remove {
        remove(&dir.join(name))?;
    }
    for name in plan.compress {
        compress(&dir.join(name))?;
    }
    std::fs::rename(log, rotated).map_err(|e| format!("renaming to {}: {e}", rotated.display()))
}

/// What to do with a log directory's entries before `base` is rotated once more.
#[derive(Debug, PartialEq)]
struct Plan<'a> {
    /// Temporary files, originals already compressed, and the oldest rotated files beyond
    /// `max_files - 2` (the live log and the one about to be rotated make up the rest).
    remove: Vec<&'a str>,
    /// The rotated files kept that are not gzipped yet.
    compress: Vec<&'a str>,
}

/// Upstream's `cleanupUnusedLogs`, `removeExcessLogs` and the compression list, in order.
fn plan<'a>(names: &'a [String], base: &str, max_files: usize) -> Plan<'a> {
    let prefix = format!("{base}.");
    let mut rotated: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with(&prefix))
        .collect();
    rotated.sort_unstable();
    let compressed = |n: &str| {
        names
            .iter()
            .any(|other| other.strip_suffix(COMPRESS_SUFFIX) == Some(n))
    };
    let (mut remove, mut kept): (Vec<&str>, Vec<&str>) = rotated
        .into_iter()
        .partition(|n| n.ends_with(TMP_SUFFIX) || (!n.ends_with(COMPRESS_SUFFIX) && compressed(n)));
    let keep = max_files.saturating_sub(2);
    let excess = kept.len().saturating_sub(keep);
    remove.extend(kept.drain(..excess));
    let compress = kept
        .into_iter()
        .filter(|n| !n.ends_with(COMPRESS_SUFFIX))
        .collect();
    Plan { remove, compress }
}

/// Gzips `log` to `<log>.tmp`, renames that to `<log>.gz` and removes `log` (upstream's
/// `compressLog`); the temporary file is removed if anything fails before the rename.
fn compress(log: &Path) -> Result<(), String> {
    use std::io::Write;
    let tmp = with_suffix(log, TMP_SUFFIX);
    let gz = with_suffix(log, COMPRESS_SUFFIX);
    let write = || -> io::Result<()> {
        let mut input = std::fs::File::open(log)?;
        let mode = input.metadata()?.permissions();
        let out = std::fs::File::create(&tmp)?;
        out.set_permissions(mode)?;
        let mut encoder =
            flate2::write::GzEncoder::new(io::BufWriter::new(out), flate2::Compression::default());
        io::copy(&mut input, &mut encoder)?;
        let mut out = encoder.finish()?;
        out.flush()?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "compressing {} to {}: {e}",
            log.display(),
            tmp.display()
        ));
    }
    if let Err(e) = std::fs::rename(&tmp, &gz) {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "renaming {} to {}: {e}",
            tmp.display(),
            gz.display()
        ));
    }
    tracing::debug!(path = %gz.display(), "compressed a rotated container log");
    remove(log)
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Removes rotated files (`<attempt>.log.<suffix>`) whose container is gone, in every
/// container directory of every pod log directory.
fn remove_orphaned_rotations(logs_dir: &Path, live: &HashSet<PathBuf>) -> Result<(), String> {
    for pod_dir in subdirs(logs_dir) {
        for container_dir in subdirs(&pod_dir) {
            let Ok(names) = read_names(&container_dir) else {
                continue;
            };
            for name in orphaned(&names, |base| live.contains(&container_dir.join(base))) {
                remove(&container_dir.join(name))?;
            }
        }
    }
    Ok(())
}

/// The rotated files among `names` whose live log is not in use.
fn orphaned(names: &[String], in_use: impl Fn(&str) -> bool) -> Vec<&str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|n| rotated_base(n).is_some_and(|base| !in_use(base)))
        .collect()
}

/// `3.log` for `3.log.20240501-100000` (or `.gz`, `.tmp`); None for anything else.
fn rotated_base(name: &str) -> Option<&str> {
    let (attempt, rest) = name.split_once(".log.")?;
    if attempt.is_empty() || !attempt.bytes().all(|b| b.is_ascii_digit()) || rest.is_empty() {
        return None;
    }
    Some(&name[..attempt.len() + ".log".len()])
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

fn read_names(dir: &Path) -> io::Result<Vec<String>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect())
}

fn remove(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::debug!(path = %path.display(), "removed a rotated container log");
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Now in UTC, as Go's `20060102-150405`.
fn timestamp_suffix() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime(TIMESTAMP_FORMAT)
        .to_string()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("blocking task: {e}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn keeps_max_files_minus_two_rotated_files() {
        let n = names(&[
            "0.log",
            "0.log.20240501-100020",
            "0.log.20240501-100000.gz",
            "0.log.20240501-100010",
            "0.log.20240501-100030.tmp",
            "1.log.20240501-100000",
        ]);
        // Five files in all: live, about to be rotated, three older ones.
        assert_eq!(
            plan(&n, "0.log", 5),
            Plan {
                remove: vec!["0.log.20240501-100030.tmp"],
                compress: vec!["0.log.20240501-100010", "0.log.20240501-100020"],
            }
        );
        assert_eq!(
            plan(&n, "0.log", 3),
            Plan {
                remove: vec![
                    "0.log.20240501-100030.tmp",
                    "0.log.20240501-100000.gz",
                    "0.log.20240501-100010"
                ],
                compress: vec!["0.log.20240501-100020"],
            }
        );
        let two = plan(&n, "0.log", 2);
        assert_eq!((two.remove.len(), two.compress.len()), (4, 0));
    }

    #[test]
    fn originals_whose_gzip_exists_are_unused() {
        // Compression interrupted after the rename: the `.gz` is complete, the original and
        // the temporary file go; `.gz` files count towards `max_files`.
        let n = names(&[
            "0.log",
            "0.log.20240501-100000.gz",
            "0.log.20240501-100010",
            "0.log.20240501-100010.gz",
            "0.log.20240501-100020",
            "0.log.20240501-100020.tmp",
        ]);
        assert_eq!(
            plan(&n, "0.log", 4),
            Plan {
                remove: vec![
                    "0.log.20240501-100010",
                    "0.log.20240501-100020.tmp",
                    "0.log.20240501-100000.gz",
                ],
                compress: vec!["0.log.20240501-100020"],
            }
        );
    }

    #[test]
    fn rotated_files_of_gone_containers_are_orphans() {
        let n = names(&[
            "0.log",
            "0.log.20240501-100000",
            "1.log",
            "1.log.20240501-100000",
            "1.log.20240501-100010.gz",
            "notes.log.1",
            "x.log.2",
        ]);
        assert_eq!(
            orphaned(&n, |base| base == "1.log"),
            vec!["0.log.20240501-100000"]
        );
        assert_eq!(rotated_base("12.log.20240501-100000"), Some("12.log"));
        assert_eq!(rotated_base("12.log"), None);
        assert_eq!(rotated_base("12.log."), None);
    }

    #[test]
    fn suffixes_sort_in_time_order() {
        let s = timestamp_suffix();
        assert_eq!(s.len(), "20060102-150405".len());
        assert_eq!(&s[8..9], "-");
    }

    fn gunzip(path: &Path) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn rotation_renames_compresses_and_prunes_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        for n in [
            "0.log",
            "0.log.20240501-100000",
            "0.log.20240501-100010",
            "0.log.20240501-100010.tmp",
        ] {
            std::fs::write(dir.join(n), n).unwrap();
        }
        let rotated = dir.join("0.log.20240501-100020");
        prepare_rotation(&dir.join("0.log"), &rotated, 3).unwrap();
        let mut left = read_names(dir).unwrap();
        left.sort();
        assert_eq!(
            left,
            vec!["0.log.20240501-100010.gz", "0.log.20240501-100020"]
        );
        assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "0.log");
        assert_eq!(
            gunzip(&dir.join("0.log.20240501-100010.gz")),
            b"0.log.20240501-100010"
        );
        // The same suffix twice in one second is refused, not overwritten.
        std::fs::write(dir.join("0.log"), "again").unwrap();
        assert!(prepare_rotation(&dir.join("0.log"), &rotated, 3).is_err());
        // The next rotation compresses the previous one and drops the oldest `.gz`.
        let next = dir.join("0.log.20240501-100030");
        prepare_rotation(&dir.join("0.log"), &next, 3).unwrap();
        let mut left = read_names(dir).unwrap();
        left.sort();
        assert_eq!(
            left,
            vec!["0.log.20240501-100020.gz", "0.log.20240501-100030"]
        );
        assert_eq!(gunzip(&dir.join("0.log.20240501-100020.gz")), b"0.log");
    }

    #[test]
    fn compression_keeps_large_contents_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log.20240501-100000");
        // 3 MiB of varied lines, more than any internal buffer.
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("2024-05-01T10:00:00Z stdout F line {i}\n").into_bytes())
            .collect();
        std::fs::write(&log, &data).unwrap();
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o640)).unwrap();
        compress(&log).unwrap();
        assert!(!log.exists());
        assert!(!with_suffix(&log, TMP_SUFFIX).exists());
        let gz = with_suffix(&log, COMPRESS_SUFFIX);
        assert_eq!(gunzip(&gz), data);
        let mode = std::fs::metadata(&gz).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert!(std::fs::metadata(&gz).unwrap().len() < data.len() as u64 / 4);
    }

    #[test]
    fn failed_compression_leaves_the_original_and_no_tmp() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log.20240501-100000");
        assert!(compress(&log).is_err());
        assert!(read_names(dir.path()).unwrap().is_empty());
    }
}
