//! `/stats/summary` and `/runningpods/`.

use crate::AppState;
use axum::Router;
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
}

pub fn running_pods_routes() -> Router<Arc<AppState>> {
    Router::new()
}
