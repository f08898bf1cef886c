//! nodeagent: the seven services in one multi-call binary. Started as `nodeagent-<service>`
//! (a link to this file, as the deploy scripts install it) or as `nodeagent <service>
//! [flags]`, it runs that one service, exactly as the service's own binary does.
//! `nodeagent status` reports on the running services (status.rs).
//!
//! Why: each process maps the code it runs, and the seven separate binaries share no
//! page of it (about 70 % of the seven's memory at rest was their own copies of tokio,
//! tonic, kube and k8s-openapi). Seven processes of one file share one copy. The processes
//! stay separate: each is still killed, restarted and upgraded alone.

mod status;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

const SERVICES: [&str; 7] = [
    "config-source",
    "pleg",
    "pod-sync",
    "probe",
    "volume",
    "node-status",
    "http-server",
];

fn run(service: &str, args: Vec<OsString>) -> Option<ExitCode> {
    Some(match service {
        "config-source" => config_source::cli::main(args),
        "pleg" => pleg::cli::main(args),
        "pod-sync" => pod_sync::cli::main(args),
        "probe" => probe::cli::main(args),
        "volume" => volume::cli::main(args),
        "node-status" => node_status::cli::main(args),
        "http-server" => http_server::cli::main(args),
        _ => return None,
    })
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let called = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // `kubelet ...` (a link, as kubeadm's kubelet.service runs it): the launcher of the
    // seven units.
    if called == "kubelet" {
        return nodeagent_transport::kubelet_main(args);
    }
    // `nodeagent-pleg ...` (a link): the name says which service.
    if let Some(service) = called.strip_prefix("nodeagent-")
        && let Some(code) = run(service, args.clone())
    {
        return code;
    }
    // `nodeagent status [flags]`: the node agent at a glance (status.rs).
    if args.get(1).is_some_and(|a| a == "status") {
        args.remove(1);
        return status::main(args);
    }
    // `nodeagent pleg ...`: the first argument does; the service sees
    // `nodeagent-pleg ...` as its command line.
    if args.len() > 1 {
        let service = args.remove(1).to_string_lossy().into_owned();
        args[0] = format!("nodeagent-{service}").into();
        if let Some(code) = run(&service, args) {
            return code;
        }
        eprintln!("nodeagent: no service {service:?}");
    }
    eprintln!(
        "usage: nodeagent <service> [flags], or through a link named nodeagent-<service>;\n\
         nodeagent status [flags]: the services' health and builds, the node's conditions, the pods\n\
         services: {}",
        SERVICES.join(", ")
    );
    ExitCode::from(2)
}
