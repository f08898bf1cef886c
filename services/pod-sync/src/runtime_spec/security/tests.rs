//! Table-driven checks of what each security-context field becomes in CRI, and of the
//! refusals with upstream's reasons.

use super::*;
use crate::runtime_spec::{
    ContainerInputs, EnvRefs, NodeContext, container_config, sandbox_config,
};
use serde_json::json;

fn pod(spec: serde_json::Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]}
    });
    for (k, v) in spec.as_object().unwrap() {
        p["spec"][k] = v.clone();
    }
    serde_json::from_value(p).unwrap()
}

fn with_container_sc(sc: serde_json::Value) -> Pod {
    pod(json!({"containers": [{"name": "app", "image": "busybox:1.36", "securityContext": sc}]}))
}

fn node() -> NodeContext {
    NodeContext::for_unit_tests("nodeagent-security-unit")
}

fn container_sc(p: &Pod) -> nodeagent_proto::cri::LinuxContainerSecurityContext {
    let volumes = HashMap::new();
    let cfg = container_config(ContainerInputs {
        pod: p,
        container: &p.spec.as_ref().unwrap().containers[0],
        attempt: 0,
        backoff_base: 0,
        volumes: &volumes,
        pod_ip: "",
        node: &node(),
        env_refs: &EnvRefs::default(),
    })
    .expect("container config");
    cfg.linux.unwrap().security_context.unwrap()
}

fn profile(t: ProfileType, r: &str) -> SecurityProfile {
    SecurityProfile {
        profile_type: t as i32,
        localhost_ref: r.into(),
    }
}

#[test]
fn seccomp_profiles_reach_the_container_and_the_sandbox() {
    let root = node().root_dir;
    let local = root.join("seccomp/audit.json").display().to_string();
    let cases = [
        (json!({}), json!(null), profile(ProfileType::Unconfined, "")),
        (
            json!({"seccompProfile": {"type": "RuntimeDefault"}}),
            json!(null),
            profile(ProfileType::RuntimeDefault, ""),
        ),
        (
            json!({"seccompProfile": {"type": "RuntimeDefault"}}),
            json!({"type": "Unconfined"}),
            profile(ProfileType::Unconfined, ""),
        ),
        (
            json!({}),
            json!({"type": "Localhost", "localhostProfile": "audit.json"}),
            profile(ProfileType::Localhost, &local),
        ),
    ];
    for (pod_sc, c_profile, want) in cases {
        let mut c = json!({"name": "app", "image": "busybox:1.36"});
        if !c_profile.is_null() {
            c["securityContext"] = json!({"seccompProfile": c_profile});
        }
        let p = pod(json!({"securityContext": pod_sc, "containers": [c]}));
        assert_eq!(
            container_sc(&p).seccomp,
            Some(want.clone()),
            "{pod_sc} {c_profile}"
        );
        let sb = sandbox_config(&p, 0, &node());
        let sb_sc = sb.linux.unwrap().security_context.unwrap();
        let pod_level = seccomp(
            pod_sc
                .get("seccompProfile")
                .map(|v| serde_json::from_value(v.clone()).unwrap())
                .as_ref(),
            &root,
            false,
        )
        .unwrap();
        assert_eq!(sb_sc.seccomp, Some(pod_level), "{pod_sc}");
    }
}

/// upstream: pkg/kubelet/kuberuntime/helpers_linux_test.go TestGetSeccompProfile, the
/// `fallbackToRuntimeDefault` cases: with seccompDefault, a pod and container that set
/// nothing get RuntimeDefault, while an explicit Unconfined or Localhost stays as asked.
#[test]
fn seccomp_default_gives_runtime_default_only_where_nothing_is_set() {
    let root = std::path::PathBuf::from("/var/lib/kubelet");
    let t = |p: Option<SeccompProfile>| seccomp(p.as_ref(), &root, true).unwrap().profile_type;
    let profile = |t: &str| {
        Some(SeccompProfile {
            type_: t.into(),
            localhost_profile: (t == "Localhost").then(|| "p.json".into()),
        })
    };
    assert_eq!(t(None), ProfileType::RuntimeDefault as i32);
    assert_eq!(t(profile("Unconfined")), ProfileType::Unconfined as i32);
    assert_eq!(
        t(profile("RuntimeDefault")),
        ProfileType::RuntimeDefault as i32
    );
    assert_eq!(t(profile("Localhost")), ProfileType::Localhost as i32);
    assert_eq!(
        seccomp(None, &root, false).unwrap().profile_type,
        ProfileType::Unconfined as i32
    );
}

#[test]
fn a_localhost_seccomp_profile_may_not_leave_the_seccomp_directory() {
    for bad in ["../etc/passwd", "/etc/passwd", "a/../../b", ""] {
        let p = with_container_sc(
            json!({"seccompProfile": {"type": "Localhost", "localhostProfile": bad}}),
        );
        let refusal = admit(&p, &HostSecurity::default()).unwrap_err();
        assert_eq!(refusal.reason, "InvalidSeccompProfile", "{bad}");
    }
}

#[test]
fn apparmor_is_passed_or_refused_where_the_host_has_none() {
    let enabled = HostSecurity {
        apparmor_enabled: true,
        ..Default::default()
    };
    let disabled = HostSecurity::default();
    let field = with_container_sc(
        json!({"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-x"}}),
    );
    let mut annotated = pod(json!({}));
    annotated.metadata.annotations = Some(
        [(
            format!("{APPARMOR_ANNOTATION_PREFIX}app"),
            "runtime/default".to_string(),
        )]
        .into(),
    );
    let unconfined = pod(json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}));
    let cases = [
        (&field, Some(profile(ProfileType::Localhost, "k8s-x")), true),
        (
            &annotated,
            Some(profile(ProfileType::RuntimeDefault, "")),
            true,
        ),
        (
            &unconfined,
            Some(profile(ProfileType::Unconfined, "")),
            false,
        ),
    ];
    for (p, want, needs_apparmor) in cases {
        assert!(admit(p, &enabled).is_ok());
        assert_eq!(container_sc(p).apparmor, want);
        let refused = admit(p, &disabled);
        if needs_apparmor {
            let r = refused.unwrap_err();
            assert_eq!(r.reason, "AppArmor");
            assert_eq!(
                r.message,
                "Cannot enforce AppArmor: AppArmor is not enabled on the host"
            );
        } else {
            assert!(refused.is_ok());
        }
    }
    assert_eq!(container_sc(&pod(json!({}))).apparmor, None);
}

#[test]
fn sysctls_safe_allowed_or_forbidden() {
    let allowed = HostSecurity {
        allowed_unsafe_sysctls: vec!["net.core.somaxconn".into(), "kernel.msg*".into()],
        ..Default::default()
    };
    let cases: [(&str, bool, bool, Option<&str>); 7] = [
        ("net.ipv4.ip_unprivileged_port_start", false, false, None),
        ("kernel.shm_rmid_forced", false, false, None),
        ("net.core.somaxconn", false, false, None),
        ("kernel.msgmax", false, false, None),
        (
            "kernel.panic",
            false,
            false,
            Some("forbidden sysctl: \"kernel.panic\" not allowlisted"),
        ),
        (
            "net.ipv4.ip_local_port_range",
            true,
            false,
            Some(
                "forbidden sysctl: \"net.ipv4.ip_local_port_range\" not allowed with host net enabled",
            ),
        ),
        (
            "kernel.msgmax",
            false,
            true,
            Some("forbidden sysctl: \"kernel.msgmax\" not allowed with host ipc enabled"),
        ),
    ];
    for (name, host_net, host_ipc, refused) in cases {
        let p = pod(json!({
            "hostNetwork": host_net,
            "hostIPC": host_ipc,
            "securityContext": {"sysctls": [{"name": name, "value": "1"}]}
        }));
        match (admit(&p, &allowed), refused) {
            (Ok(()), None) => {
                let sb = sandbox_config(&p, 0, &node());
                assert_eq!(
                    sb.linux.unwrap().sysctls.get(name).map(String::as_str),
                    Some("1")
                );
            }
            (Err(r), Some(message)) => {
                assert_eq!(r.reason, "SysctlForbidden");
                assert_eq!(r.message, message);
            }
            (got, want) => panic!("{name}: got {got:?}, want refusal {want:?}"),
        }
    }
    let unsafe_only = pod(
        json!({"securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1"}]}}),
    );
    assert!(admit(&unsafe_only, &HostSecurity::default()).is_err());
}

#[test]
fn user_namespaces_and_unmasked_proc_are_refused() {
    let host = HostSecurity::default();
    let userns = pod(json!({"hostUsers": false}));
    assert_eq!(
        admit(&userns, &host).unwrap_err().reason,
        "UserNamespacesUnsupported"
    );
    let unmasked = with_container_sc(json!({"procMount": "Unmasked"}));
    assert_eq!(
        admit(&unmasked, &host).unwrap_err().reason,
        "ProcMountUnsupported"
    );
    let default = with_container_sc(json!({"procMount": "Default"}));
    assert!(admit(&default, &host).is_ok());
    let sc = container_sc(&default);
    assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
    assert!(admit(&pod(json!({"hostUsers": true})), &host).is_ok());
}

#[test]
fn fs_group_joins_the_supplemental_groups() {
    let p = pod(json!({"securityContext": {"fsGroup": 2000, "supplementalGroups": [3000]}}));
    assert_eq!(container_sc(&p).supplemental_groups, vec![3000, 2000]);
    let sb = sandbox_config(&p, 0, &node());
    assert_eq!(
        sb.linux
            .unwrap()
            .security_context
            .unwrap()
            .supplemental_groups,
        vec![3000, 2000]
    );
}

#[test]
fn run_as_non_root_is_verified_with_upstream_messages() {
    let who = "(pod: \"web_default(u1)\", container: app)";
    let pod_level = pod(json!({"securityContext": {"runAsNonRoot": true}}));
    let user_1000 = pod(json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 1000}}));
    let user_0 = with_container_sc(json!({"runAsNonRoot": true, "runAsUser": 0}));
    let not_asked = pod(json!({}));
    let cases: [(&Pod, Option<i64>, &str, Option<String>); 7] = [
        (
            &pod_level,
            Some(0),
            "",
            Some(format!(
                "container has runAsNonRoot and image will run as root {who}"
            )),
        ),
        (
            &pod_level,
            None,
            "",
            Some(format!(
                "container has runAsNonRoot and image will run as root {who}"
            )),
        ),
        (
            &pod_level,
            None,
            "nobody",
            Some(format!(
                "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root {who}"
            )),
        ),
        (&pod_level, Some(65534), "", None),
        (&user_1000, Some(0), "", None),
        (
            &user_0,
            Some(1000),
            "",
            Some(format!(
                "container's runAsUser breaks non-root policy {who}"
            )),
        ),
        (&not_asked, Some(0), "", None),
    ];
    for (p, uid, user, want) in cases {
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            verify_run_as_non_root(p, c, uid, user).err(),
            want,
            "{uid:?} {user}"
        );
    }
    assert!(needs_image_user(
        &pod_level,
        &pod_level.spec.as_ref().unwrap().containers[0]
    ));
    assert!(!needs_image_user(
        &user_1000,
        &user_1000.spec.as_ref().unwrap().containers[0]
    ));
}
