use super::*;
use std::collections::HashMap;

fn paths(list: &[&str]) -> Vec<Option<String>> {
    list.iter().map(|p| Some(p.to_string())).collect()
}

#[test]
fn the_common_ancestor_of_cgroups_is_never_the_root() {
    let own =
        |list: &[&str]| common_ancestor(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(
        own(&["/kubelet.slice/a.service", "/kubelet.slice/b.service"]).as_deref(),
        Some("/kubelet.slice")
    );
    assert_eq!(own(&["/a/b", "/a/b"]).as_deref(), Some("/a/b"));
    assert_eq!(own(&["/a/b/c", "/a/b"]).as_deref(), Some("/a/b"));
    // "/ab" is not inside "/a".
    assert_eq!(own(&["/a", "/ab"]), None);
    assert_eq!(own(&["/"]), None);
    assert_eq!(own(&[]), None);
}

#[test]
fn a_process_descends_from_ours_through_its_parents() {
    let parents: HashMap<u32, u32> = [(30, 20), (20, 10), (10, 1), (1, 0), (40, 1), (50, 50)]
        .into_iter()
        .collect();
    let parent = |p: u32| parents.get(&p).copied();
    let ours: HashSet<u32> = [10].into_iter().collect();
    assert!(descends_from(10, &ours, parent));
    assert!(descends_from(30, &ours, parent));
    assert!(!descends_from(40, &ours, parent));
    // Its own parent, or a parent unknown: not ours, and no endless walk.
    assert!(!descends_from(50, &ours, parent));
    assert!(!descends_from(60, &ours, parent));
    // Pid 1 may be one of ours (a service as a container's init).
    let init: HashSet<u32> = [1].into_iter().collect();
    assert!(descends_from(40, &init, parent));
}

#[test]
fn a_shared_cgroup_is_used_only_when_it_holds_nothing_but_ours() {
    let ours: HashSet<u32> = [10, 11].into_iter().collect();
    let is_ours = |p: u32| ours.contains(&p) || p == 12;
    let slice = paths(&["/kubelet.slice/a.service", "/kubelet.slice/b.service"]);
    assert_eq!(
        shared_cgroup(
            &slice,
            |rel| {
                assert_eq!(rel, "/kubelet.slice");
                Some(vec![10, 11, 12])
            },
            is_ours
        ),
        Source::Cgroup("/kubelet.slice".into())
    );
    // Another process in the slice (the runtime put there too): the processes' sum.
    assert_eq!(
        shared_cgroup(&slice, |_| Some(vec![10, 11, 99]), is_ours),
        Source::Processes
    );
    // Unreadable, or past the bound.
    assert_eq!(shared_cgroup(&slice, |_| None, is_ours), Source::Processes);
    // Only the root in common: the whole node, not ours.
    let apart = paths(&["/system.slice/a.service", "/user.slice/b.scope"]);
    assert_eq!(
        shared_cgroup(&apart, |_| panic!("the root is not read"), is_ours),
        Source::Processes
    );
    // A process whose cgroup could not be read.
    let unknown = vec![Some("/kubelet.slice/a.service".to_string()), None];
    assert_eq!(
        shared_cgroup(&unknown, |_| Some(vec![10]), is_ours),
        Source::Processes
    );
}

#[test]
fn the_runtime_uses_its_cgroup_unless_that_is_the_root() {
    assert_eq!(
        own_cgroup(Some("/system.slice/containerd.service")),
        Source::Cgroup("/system.slice/containerd.service".into())
    );
    assert_eq!(own_cgroup(Some("/")), Source::Processes);
    assert_eq!(own_cgroup(None), Source::Processes);
}

#[test]
fn processes_memory_sums_resident_sets_and_faults() {
    let stat = |minor, major| ProcStat {
        ppid: 1,
        minor_faults: minor,
        major_faults: major,
        cpu_ticks: 0,
        start_ticks: 0,
    };
    let m = processes_memory(
        &[stat(10, 1), stat(5, 0)],
        &[
            "VmRSS:\t  1024 kB\nVmSwap:\t 4 kB\n".to_string(),
            "VmRSS:\t  2048 kB\n".to_string(),
        ],
    );
    assert_eq!(
        m,
        Memory {
            usage: 3 << 20,
            working_set: 3 << 20,
            rss: Some(3 << 20),
            cache: None,
            page_faults: Some(15),
            major_page_faults: Some(1),
            oom_kills: None,
            limit: None,
            swap: Some(Swap {
                usage: 4096,
                limit: None,
            }),
        }
    );
}

#[test]
fn clock_ticks_become_nanoseconds() {
    let clock = Clock {
        boot_ns: 1_000_000_000_000,
        ticks_per_second: 100,
    };
    assert_eq!(clock.ticks_to_ns(250), 2_500_000_000);
    assert_eq!(clock.start_ns(100), 1_001_000_000_000);
}

fn write(root: &std::path::Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A v1 tree where the cpu and memory cgroups of the same processes differ.
#[test]
fn usage_is_read_from_each_controllers_cgroup() {
    let root = tempfile::tempdir().unwrap();
    write(root.path(), "cpuacct/kubelet.slice/cpuacct.usage", "7000\n");
    for (file, text) in [
        ("memory.usage_in_bytes", "8192\n"),
        ("memory.limit_in_bytes", "9223372036854771712\n"),
        ("memory.stat", "total_rss 4096\ntotal_inactive_file 1024\n"),
        ("memory.memsw.usage_in_bytes", "8192\n"),
        ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
    ] {
        write(root.path(), &format!("memory/mem/{file}"), text);
    }
    let cgroups = Cgroups::at(root.path().to_path_buf());
    let resolved = Resolved {
        processes: vec![Process {
            pid: std::process::id(),
            start_ticks: process::read_stat(std::process::id()).unwrap().start_ticks,
        }],
        cpu: Source::Cgroup("/kubelet.slice".into()),
        memory: Source::Cgroup("/mem".into()),
        start_ns: 5,
        partial_since: None,
    };
    let clock = Clock {
        boot_ns: 0,
        ticks_per_second: 100,
    };
    let u = read_usage(KUBELET, &resolved, &cgroups, clock);
    assert_eq!((u.name, u.start_ns, u.cpu_ns), (KUBELET, 5, Some(7000)));
    let m = u.memory.unwrap();
    assert_eq!((m.usage, m.working_set, m.limit), (8192, 7168, None));
    assert_eq!(
        m.swap,
        Some(Swap {
            usage: 0,
            limit: None
        })
    );
    assert!(still_holds(&resolved, &cgroups));

    // Our own counters where the cgroup is the processes' sum.
    let summed = Resolved {
        cpu: Source::Processes,
        memory: Source::Processes,
        ..resolved.clone()
    };
    let u = read_usage(RUNTIME, &summed, &cgroups, clock);
    assert!(u.cpu_ns.is_some());
    assert!(u.memory.unwrap().working_set > 0);

    // A restarted process (another start time), a removed cgroup, or a partial
    // resolution due for another try: resolved again.
    let mut restarted = resolved.clone();
    restarted.processes[0].start_ticks += 1;
    assert!(!still_holds(&restarted, &cgroups));
    let gone = Resolved {
        memory: Source::Cgroup("/removed".into()),
        ..resolved.clone()
    };
    assert!(!still_holds(&gone, &cgroups));
    let partial = Resolved {
        partial_since: Some(Instant::now() - PARTIAL_RETRY),
        ..resolved.clone()
    };
    assert!(!still_holds(&partial, &cgroups));
    let recent = Resolved {
        partial_since: Some(Instant::now()),
        ..resolved
    };
    assert!(still_holds(&recent, &cgroups));
}

/// The processes behind sockets: here this test process serves both.
#[test]
fn services_are_found_behind_their_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("pleg.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&served).unwrap();
    let settings = SystemSettings {
        runtime_socket: Some(served.clone()),
        service_sockets: vec![served.clone(), dir.path().join("probe.sock")],
        ..SystemSettings::default()
    };
    let cgroups = Cgroups::at(dir.path().join("no-cgroups"));
    let clock = Clock {
        boot_ns: 1_000,
        ticks_per_second: 100,
    };
    let own = std::process::id();
    let own_start = clock.start_ns(process::read_stat(own).unwrap().start_ticks);

    let kubelet = resolve_kubelet(&settings, &cgroups, clock).unwrap();
    // Our pid once, though two sockets lead to it; the silent socket makes it partial.
    assert_eq!(kubelet.processes.len(), 1);
    assert_eq!(kubelet.processes[0].pid, own);
    assert!(kubelet.partial_since.is_some());
    assert_eq!(kubelet.start_ns, own_start);

    let runtime = resolve_runtime(&settings, &cgroups, clock).unwrap();
    assert_eq!(runtime.processes[0].pid, own);
    assert_eq!(runtime.start_ns, own_start);
    let no_runtime = SystemSettings {
        runtime_socket: Some(dir.path().join("containerd.sock")),
        ..settings
    };
    assert!(resolve_runtime(&no_runtime, &cgroups, clock).is_none());
}

/// Configured cgroups are read as they are, without looking for processes.
#[test]
fn configured_cgroups_are_read_directly() {
    let root = tempfile::tempdir().unwrap();
    write(root.path(), "cgroup.controllers", "cpu memory\n");
    for (rel, usec) in [("kubelet.slice", 300), ("runtime.slice", 500)] {
        write(
            root.path(),
            &format!("{rel}/cpu.stat"),
            &format!("usage_usec {usec}\n"),
        );
        write(root.path(), &format!("{rel}/memory.current"), "4096\n");
        write(root.path(), &format!("{rel}/memory.stat"), "anon 4096\n");
        write(root.path(), &format!("{rel}/memory.swap.current"), "0\n");
        write(root.path(), &format!("{rel}/memory.swap.max"), "max\n");
    }
    let cgroups = Cgroups::at(root.path().to_path_buf());
    let settings = SystemSettings {
        kubelet_cgroups: Some("/kubelet.slice".into()),
        runtime_cgroups: Some("/runtime.slice".into()),
        ..SystemSettings::default()
    };
    let clock = Clock {
        boot_ns: 0,
        ticks_per_second: 100,
    };
    let usage = measure(&settings, &cgroups, clock);
    let found: Vec<(&str, Option<u64>)> = usage.iter().map(|u| (u.name, u.cpu_ns)).collect();
    assert_eq!(found, [(KUBELET, Some(300_000)), (RUNTIME, Some(500_000))]);
    assert!(
        usage
            .iter()
            .all(|u| u.memory.as_ref().is_some_and(|m| m.working_set == 4096))
    );
    // A configured cgroup that does not exist is left out, as upstream.
    let missing = SystemSettings {
        runtime_cgroups: Some("/nowhere".into()),
        ..settings
    };
    let names: Vec<&str> = measure(&missing, &cgroups, clock)
        .iter()
        .map(|u| u.name)
        .collect();
    assert_eq!(names, [KUBELET]);
}
