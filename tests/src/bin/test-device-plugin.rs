//! A device plugin for the tests (issue 33), speaking upstream's device plugin API
//! (v1beta1) as real plugins do: it advertises `--devices` fake devices of `--resource`,
//! each backed by a real device node (a character device 1:3, a clone of `/dev/null`, in
//! `--state-dir`), registers with the kubelet's `kubelet.sock` in `--plugin-dir`, and
//! registers again whenever its own socket is removed (the kubelet removes every socket
//! there at its start: upstream's documented signal). A device listed in
//! `<state-dir>/unhealthy` (one ID per line) is reported Unhealthy. Each Allocate and
//! PreStartContainer is logged to stdout and appended to `<state-dir>/allocations.log`.
//! With `--preferred` it offers GetPreferredAllocation and prefers the highest IDs, so a
//! test can tell its preference was followed.

use clap::Parser;
use nodeagent_proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use nodeagent_proto::deviceplugin::registration_client::RegistrationClient;
use nodeagent_proto::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, Mount, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

#[derive(Parser, Clone)]
struct Args {
    /// The kubelet's device plugin directory (`<root-dir>/device-plugins`).
    #[arg(long)]
    plugin_dir: PathBuf,
    #[arg(long, default_value = "example.com/fake")]
    resource: String,
    #[arg(long, default_value_t = 2)]
    devices: usize,
    /// Where the device nodes, the `unhealthy` list and `allocations.log` are.
    #[arg(long)]
    state_dir: PathBuf,
    /// The socket's name in the plugin directory.
    #[arg(long, default_value = "fake.sock")]
    endpoint: String,
    #[arg(long)]
    preferred: bool,
    #[arg(long)]
    pre_start: bool,
}

struct Plugin {
    args: Args,
    devices: watch::Receiver<Vec<Device>>,
}

impl Plugin {
    fn log(&self, line: &str) {
        println!("{line}");
        let path = self.args.state_dir.join("allocations.log");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: self.args.pre_start,
            get_preferred_allocation_available: self.args.preferred,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut rx = self.devices.clone();
        let stream = async_stream(move |tx| async move {
            loop {
                let devices = rx.borrow_and_update().clone();
                if tx.send(Ok(ListAndWatchResponse { devices })).await.is_err() {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let mut ids: Vec<String> = r.must_include_device_i_ds.clone();
                let mut rest: Vec<String> = r
                    .available_device_i_ds
                    .into_iter()
                    .filter(|id| !ids.contains(id))
                    .collect();
                rest.sort();
                rest.reverse();
                ids.extend(rest);
                ids.truncate(r.allocation_size.max(0) as usize);
                self.log(&format!("GetPreferredAllocation {}", ids.join(",")));
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for r in request.into_inner().container_requests {
            let ids = r.devices_ids;
            self.log(&format!("Allocate {}", ids.join(",")));
            let devices = ids
                .iter()
                .map(|id| DeviceSpec {
                    container_path: format!("/dev/{}", id),
                    host_path: self.args.state_dir.join(id).display().to_string(),
                    permissions: "rw".into(),
                })
                .collect();
            container_responses.push(ContainerAllocateResponse {
                envs: [("FAKE_DEVICES".to_string(), ids.join(","))].into(),
                mounts: vec![Mount {
                    container_path: "/run/fake-devices".into(),
                    host_path: self.args.state_dir.join("info").display().to_string(),
                    read_only: true,
                }],
                devices,
                annotations: [("example.com/fake-devices".to_string(), ids.join(","))].into(),
                cdi_devices: Vec::new(),
            });
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.log(&format!(
            "PreStartContainer {}",
            request.into_inner().devices_ids.join(",")
        ));
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A stream fed by a task.
fn async_stream<F, Fut>(f: F) -> DeviceStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<ListAndWatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("fake-{i}")).collect()
}

fn listed(n: usize, unhealthy: &BTreeSet<String>) -> Vec<Device> {
    ids(n)
        .into_iter()
        .map(|id| Device {
            health: if unhealthy.contains(&id) {
                "Unhealthy"
            } else {
                "Healthy"
            }
            .into(),
            id,
            topology: None,
        })
        .collect()
}

fn read_unhealthy(state_dir: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(state_dir.join("unhealthy"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// The device nodes (character 1:3, as `/dev/null`) and the directory the plugin's mount
/// gives every container.
fn make_devices(args: &Args) -> anyhow::Result<()> {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    std::fs::create_dir_all(args.state_dir.join("info"))?;
    std::fs::write(
        args.state_dir.join("info").join("vendor"),
        "nodeagent test device plugin\n",
    )?;
    for id in ids(args.devices) {
        let path = args.state_dir.join(&id);
        if !path.exists() {
            mknod(
                &path,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(1, 3),
            )?;
        }
    }
    Ok(())
}

async fn register(args: &Args) {
    let socket = args.plugin_dir.join("kubelet.sock");
    loop {
        let channel =
            nodeagent_transport::connect(&nodeagent_config::Address::Unix(socket.clone()));
        let mut client = RegistrationClient::new(channel);
        let request = RegisterRequest {
            version: "v1beta1".into(),
            endpoint: args.endpoint.clone(),
            resource_name: args.resource.clone(),
            options: Some(DevicePluginOptions {
                pre_start_required: args.pre_start,
                get_preferred_allocation_available: args.preferred,
            }),
        };
        match client.register(request).await {
            Ok(_) => {
                println!("registered {} with the kubelet", args.resource);
                return;
            }
            Err(e) => {
                eprintln!("registration failed (retrying): {}", e.message());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    make_devices(&args)?;
    let (tx, rx) = watch::channel(listed(args.devices, &read_unhealthy(&args.state_dir)));
    // The health list follows the `unhealthy` file.
    {
        let args = args.clone();
        tokio::spawn(async move {
            let mut last = read_unhealthy(&args.state_dir);
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = read_unhealthy(&args.state_dir);
                if now != last {
                    println!("unhealthy now: {now:?}");
                    let _ = tx.send(listed(args.devices, &now));
                    last = now;
                }
            }
        });
    }
    let plugin = Arc::new(Plugin {
        args: args.clone(),
        devices: rx,
    });
    let socket = args.plugin_dir.join(&args.endpoint);
    loop {
        std::fs::create_dir_all(&args.plugin_dir)?;
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::from_arc(plugin.clone()))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stop_rx.await;
                    },
                ),
        );
        register(&args).await;
        // The kubelet removes the sockets of the directory when it starts: then serve on
        // a new one and register again.
        while socket.exists() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("socket {} removed: registering again", socket.display());
        let _ = stop_tx.send(());
        let _ = server.await;
    }
}
