//! Facts about the machine, from /proc, /etc and statvfs.

use std::path::Path;

#[derive(Debug, Clone, Default)]
pub struct MachineInfo {
    pub cpus: usize,
    pub memory_bytes: u64,
    pub root_fs_bytes: u64,
    pub kernel_version: String,
    pub os_image: String,
    pub machine_id: String,
    pub boot_id: String,
    pub system_uuid: String,
    pub architecture: String,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub fn read_machine_info(root_dir: &Path) -> MachineInfo {
    let cpus = nodeagent_config::machine::cpus();
    let memory_bytes = nodeagent_config::machine::memory_bytes();
    let fs_path = if root_dir.exists() {
        root_dir
    } else {
        Path::new("/")
    };
    // fsblkcnt_t and c_ulong are u64 here but narrower on 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let root_fs_bytes = nix::sys::statvfs::statvfs(fs_path)
        .map(|s| s.blocks() as u64 * s.fragment_size() as u64)
        .unwrap_or(0);
    let os_image = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "Unknown".into());
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
    .to_string();
    MachineInfo {
        cpus,
        memory_bytes,
        root_fs_bytes,
        kernel_version: read_trim("/proc/sys/kernel/osrelease"),
        os_image,
        machine_id: read_trim("/etc/machine-id"),
        boot_id: nodeagent_config::machine::boot_id(),
        system_uuid: read_trim("/sys/class/dmi/id/product_uuid"),
        architecture,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_real_machine_facts() {
        let m = read_machine_info(Path::new("/"));
        assert!(m.cpus >= 1);
        assert!(m.memory_bytes > 64 << 20, "{m:?}");
        assert!(!m.kernel_version.is_empty());
        assert!(m.root_fs_bytes > 0);
    }
}
