//! Logs over the kubelet API (debugging handlers, as upstream): `/containerLogs/{namespace}/
//! {pod}/{container}` reads a container's CRI log file (`tailLines`, `limitBytes`,
//! `sinceSeconds`/`sinceTime`, `timestamps`, `previous`, `follow` across rotations), and
//! `/logs/` serves the node's `/var/log` read-only.

mod container;
mod cri_format;
mod node;
mod options;
mod reader;

pub use node::NODE_LOG_DIR;

use crate::AppState;
use axum::Router;
use axum::routing::get;
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route(
        "/containerLogs/{namespace}/{pod}/{container}",
        get(container::container_logs),
    )
}

/// The node's log files (`enableSystemLogHandler`).
pub fn system_log_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/logs/", get(node::root))
        .route("/logs/{*path}", get(node::path))
}
