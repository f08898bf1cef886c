//! The device plugins' side of the device manager: the registration server (upstream's
//! `plugin/v1beta1/server.go`), and for each registered plugin its client, whose
//! `ListAndWatch` stream keeps the plugin's devices and their health (upstream's
//! `client.go` and `endpoint.go`). A plugin is hostile input: its endpoint must name a
//! socket in the plugins' directory, and its resource name must be an extended resource.

use super::DeviceManager;
use nodeagent_config::Address;
use nodeagent_proto::deviceplugin::device_plugin_client::DevicePluginClient;
use nodeagent_proto::deviceplugin::registration_server::Registration;
use nodeagent_proto::deviceplugin::{Empty, RegisterRequest};
use nodeagent_transport::Channel;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// upstream's `api.SupportedVersions`.
pub const VERSION: &str = "v1beta1";

/// How long a registering plugin has to answer `GetDevicePluginOptions`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct RegistrationService {
    pub manager: Arc<DeviceManager>,
}

/// A registration's checks, in upstream's words where upstream has them.
pub fn check(r: &RegisterRequest) -> Result<(), String> {
    if r.version != VERSION {
        // Go's %q of `[]string{"v1beta1"}`.
        return Err(format!(
            "requested API version {:?} is not supported by kubelet. Supported version is [{VERSION:?}]",
            r.version
        ));
    }
    if !nodeagent_config::names::is_extended_resource_name(&r.resource_name) {
        return Err(format!("the ResourceName {:?} is invalid", r.resource_name));
    }
    // upstream joins the endpoint to the directory as it is; a name with a `/` or `..`
    // would reach a socket anywhere on the host.
    let e = &r.endpoint;
    if e.is_empty() || e == "." || e == ".." || e.contains('/') || e.contains('\0') {
        return Err(format!(
            "the endpoint {e:?} is not the name of a socket in the device plugin directory"
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, "Got registration request from device plugin with resource");
        nodeagent_telemetry::metrics::kubelet::DEVICE_PLUGIN_REGISTRATIONS
            .get_or_create(&vec![("resource_name", r.resource_name.clone())])
            .inc();
        if let Err(e) = check(&r) {
            tracing::error!(resource = %r.resource_name, error = %e, "Bad registration request from device plugin");
            // A Go error from upstream's handler: gRPC's Unknown.
            return Err(Status::unknown(e));
        }
        let path = self.manager.dir.join(&r.endpoint);
        let mut client =
            DevicePluginClient::new(nodeagent_transport::connect(&Address::Unix(path.clone())));
        let options = tokio::time::timeout(
            CONNECT_TIMEOUT,
            client.get_device_plugin_options(Empty {}),
        )
        .await
        .map_err(|_| "timed out".to_string())
        .and_then(|r| r.map_err(|e| e.message().to_string()))
        .map_err(|e| {
            let e = format!("failed to get device plugin options: {e}");
            tracing::error!(resource = %r.resource_name, error = %e, "Error connecting to device plugin client");
            Status::unknown(e)
        })?
        .into_inner();
        let generation = self
            .manager
            .connected(&r.resource_name, client.clone(), options);
        tracing::info!(resource = %r.resource_name, ?options, "Device plugin connected");
        tokio::spawn(follow(
            self.manager.clone(),
            r.resource_name,
            generation,
            client,
        ));
        Ok(Response::new(Empty {}))
    }
}

/// The plugin's `ListAndWatch`, until it ends: then its devices are unhealthy.
async fn follow(
    manager: Arc<DeviceManager>,
    resource: String,
    generation: u64,
    mut client: DevicePluginClient<Channel>,
) {
    match client.list_and_watch(Empty {}).await {
        Ok(stream) => {
            let mut stream = stream.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(list)) => manager.listed(&resource, generation, list.devices),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(%resource, error = %e.message(), "ListAndWatch ended");
                        break;
                    }
                }
            }
        }
        Err(e) => tracing::warn!(%resource, error = %e.message(), "ListAndWatch failed"),
    }
    manager.disconnected(&resource, generation);
}
