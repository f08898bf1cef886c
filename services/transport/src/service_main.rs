//! The body of every service's `main`: resolve the configuration, start telemetry, run
//! the service until SIGTERM, drain, and exit with a readable message on failure.

use crate::{Shutdown, shutdown_channel, termination_signal};
use clap::{CommandFactory, FromArgMatches};
use nodeagent_config::{Config, KubeletFlags};
use std::ffi::OsString;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

/// How long `run` gets to return after SIGTERM before the process exits anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the allocator hands the free pages inside its heap back to the system.
const HEAP_TRIM_PERIOD: Duration = Duration::from_secs(30);

/// Allocations at least this large get pages of their own (mmap), returned when freed.
const MMAP_THRESHOLD: i32 = 128 << 10;

/// glibc's allocator, tuned for services that allocate little and rarely at once (see the
/// README's section on memory):
/// - glibc gives each thread that allocates while another does an arena of its own (up
///   to eight per core) and seldom returns what they free to the system: one arena;
/// - glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so
///   the large transient buffers of a burst (snapshots of every pod, JSON bodies) end up
///   inside the heap, where live data left after them pins their pages: a fixed threshold.
///
/// `MALLOC_ARENA_MAX` and `MALLOC_MMAP_THRESHOLD_` in the environment, if set, still win.
fn tune_allocator() {
    let settings = [
        ("MALLOC_ARENA_MAX", nix::libc::M_ARENA_MAX, 1),
        (
            "MALLOC_MMAP_THRESHOLD_",
            nix::libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD,
        ),
    ];
    for (env, param, value) in settings {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt sets one of the allocator's parameters; it is called before
            // the async runtime starts any thread.
            #[allow(unsafe_code)]
            unsafe {
                nix::libc::mallopt(param, value);
            }
        }
    }
}

/// glibc returns freed memory to the system only from the top of its heap; what a burst
/// (100 pods started at once) freed below live data stays resident. `malloc_trim` releases
/// those free pages too (measured: 2 to 4 MiB per service after a 100-pod burst). It takes
/// the allocator's lock for well under a millisecond at these heap sizes, on the blocking
/// pool all the same.
fn spawn_heap_trim() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(HEAP_TRIM_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            // SAFETY: malloc_trim only releases free memory; it is safe to call at any
            // time from any thread.
            #[allow(unsafe_code)]
            let trim = || unsafe { nix::libc::malloc_trim(0) };
            let _ = tokio::task::spawn_blocking(trim).await;
        }
    });
}

/// What `--version` prints and the start-up line logs: the release and the commit built
/// (see build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NODEAGENT_COMMIT"),
    ")"
);

/// Parses a service's command line (`args`, the program name first) as the upstream
/// kubelet's is read: our flags by clap, and every upstream kubelet flag name accepted
/// (see [`nodeagent_config::upstream_flags`]), left in `flags_of(&mut cli).upstream`.
/// `--help` and `--version` print and exit 0; a flag name upstream does not have either
/// exits 2 with clap's message.
pub fn parse_command_line<C, I, T>(
    cmd: clap::Command,
    args: I,
    flags_of: impl FnOnce(&mut C) -> &mut KubeletFlags,
) -> C
where
    C: FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    // A flag given twice: the later one wins, as pflag (kubelet.service's flags come after
    // the unit's own, see deploy/systemd).
    let mut cmd = cmd.version(VERSION).args_override_self(true);
    // clap adds its own --help and --version when the command is built: build it first,
    // so that the split below sees them as ours.
    cmd.build();
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let (ours, upstream) = nodeagent_config::upstream_flags::split(&cmd, args);
    let matches = cmd.get_matches_from(ours);
    let mut cli = C::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    flags_of(&mut cli).upstream = upstream;
    cli
}

/// The command line of a service whose flags are the shared ones only: `name`
/// (`nodeagent-pleg`) and `about` are what `--help` and `--version` say; then [`run_main`].
pub fn shared_flags_main<I, T, F, Fut>(
    name: &'static str,
    about: &'static str,
    args: I,
    run: F,
) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
    F: FnOnce(Config, Shutdown) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: KubeletFlags,
    }
    let cmd = Cli::command().name(name).bin_name(name).about(about);
    let cli: Cli = parse_command_line(cmd, args, |c: &mut Cli| &mut c.flags);
    run_main(name.trim_start_matches("nodeagent-"), &cli.flags, run)
}

/// Where `kubelet` leaves its flags for the seven services (an EnvironmentFile of theirs).
pub const KUBELET_ENV: &str = "kubelet.env";

/// `kubelet`: the process of kubelet.service, what kubeadm's drop-in runs as
/// `/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS
/// $KUBELET_EXTRA_ARGS`. It checks the command line and the configuration as upstream's
/// kubelet does at start (a bad flag exits 2, a missing or bad config file exits 1, so
/// the unit restarts until kubeadm has written it), leaves the flags in
/// `<socket-dir>/kubelet.env` (`KUBELET_ARGS=...`) for the seven services' units, tells
/// systemd it is ready, and waits for SIGTERM.
pub fn kubelet_main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: KubeletFlags,
    }
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cmd = Cli::command()
        .name("kubelet")
        .bin_name("kubelet")
        .about("The node agent's seven services, started as kubelet.service under kubeadm");
    let cli: Cli = parse_command_line(cmd, args.clone(), |c: &mut Cli| &mut c.flags);
    let config = match Config::load(&cli.flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kubelet: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !config.ignored_flags.is_empty() {
        eprintln!(
            "kubelet: upstream kubelet flags accepted but not acted on by this node agent: {}",
            config.ignored_flags.join(", ")
        );
    }
    // The file is read by systemd (EnvironmentFile=) and split on whitespace in ExecStart:
    // an argument that holds whitespace, a quote or a backslash cannot pass through it.
    let mut passed = Vec::new();
    for a in args.iter().skip(1) {
        let a = a.to_string_lossy();
        if a.contains(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '\\')) {
            eprintln!(
                "kubelet: argument {a:?}: whitespace, quotes and backslashes cannot pass to the services' units"
            );
            return ExitCode::from(2);
        }
        passed.push(a.into_owned());
    }
    let path = cli.flags.socket_dir.join(KUBELET_ENV);
    let text = format!(
        "# Written by kubelet (kubelet.service) for the seven nodeagent services.\nKUBELET_ARGS='{}'\n",
        passed.join(" ")
    );
    if let Err(e) = nodeagent_config::state::write_atomically(&path, text.as_bytes()) {
        eprintln!("kubelet: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    eprintln!(
        "kubelet: node {} ({VERSION}): flags for the seven services in {}",
        config.node_name,
        path.display()
    );
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(termination_signal()),
        Err(e) => {
            eprintln!("kubelet: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

pub fn run_main<F, Fut>(service: &'static str, flags: &KubeletFlags, run: F) -> ExitCode
where
    F: FnOnce(Config, Shutdown) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let config = match Config::load(flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nodeagent-{service}: {e}");
            return ExitCode::from(2);
        }
    };
    // Upstream refuses to start with swap on unless told (failSwapOn: false).
    if config.kubelet.fail_swap_on
        && nodeagent_config::machine::swap_on(
            &std::fs::read_to_string("/proc/swaps").unwrap_or_default(),
        )
    {
        eprintln!(
            "nodeagent-{service}: running with swap on is not supported, please disable swap or set --fail-swap-on flag to false (failSwapOn: false)"
        );
        return ExitCode::from(2);
    }
    tune_allocator();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nodeagent-{service}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let telemetry = match nodeagent_telemetry::init(&nodeagent_telemetry::TelemetryConfig {
            service_name: format!("nodeagent-{service}"),
            format: config.logging_format.clone(),
            verbosity: config.verbosity,
            vmodule: config.vmodule.clone(),
            otlp_endpoint: config.otlp_endpoint.clone(),
        }) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("nodeagent-{service}: cannot start telemetry: {e:#}");
                return ExitCode::FAILURE;
            }
        };
        nodeagent_telemetry::metrics::init_process_metrics(service);
        nodeagent_telemetry::metrics::set_service_build_info(service, VERSION);
        spawn_heap_trim();
        if let Some(auth) = &config.vsock_auth {
            crate::install_vsock_auth(auth.clone());
        }
        if !config.ignored_fields.is_empty() {
            tracing::warn!(fields = ?config.ignored_fields, "KubeletConfiguration fields accepted but not acted on by this node agent");
        }
        if !config.ignored_flags.is_empty() {
            tracing::warn!(flags = ?config.ignored_flags, "upstream kubelet flags accepted but not acted on by this node agent");
        }
        tracing::info!(node = %config.node_name, version = VERSION, "starting");
        let (trigger, shutdown) = shutdown_channel();
        let signalled = shutdown.clone();
        tokio::spawn(async move {
            termination_signal().await;
            trigger.trigger();
        });
        let fatal = shutdown.clone();
        let mut service_run = std::pin::pin!(run(config, shutdown));
        let result = tokio::select! {
            r = &mut service_run => r,
            // A part that cannot go on (a server that cannot bind) ends the process now:
            // waiting for SIGTERM would leave a process that runs but never serves.
            why = fatal.failed() => Err(anyhow::anyhow!(why)),
            _ = async { signalled.wait().await; tokio::time::sleep(DRAIN_TIMEOUT).await } => {
                tracing::warn!("did not stop within {DRAIN_TIMEOUT:?} of SIGTERM; exiting anyway");
                Ok(())
            }
        };
        // A run that ended on its own after a fatal error (which also ends every wait)
        // still failed.
        let result = match (result, fatal.fatal_error()) {
            (Ok(()), Some(why)) => Err(anyhow::anyhow!(why)),
            (result, _) => result,
        };
        let code = match result {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "failed");
                eprintln!("nodeagent-{service}: {e:#}");
                ExitCode::FAILURE
            }
        };
        tokio::task::spawn_blocking(move || telemetry.shutdown(Duration::from_secs(2)))
            .await
            .ok();
        code
    })
}
