//! `/health` and `/metrics` over HTTP (axum, as the dispatcher's listener).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use worker_fleet::Fleet;

/// Binds `addr` and serves until `stop` completes; returns the bound address.
pub(crate) async fn serve(
    addr: SocketAddr,
    fleet: Arc<Fleet>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr().context("listener address")?;
    let app = axum::Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(fleet);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::warn!(error = %e, "health/metrics listener stopped");
        }
    });
    Ok(bound)
}

/// 200 when every group has a ready worker, else 503; the body lists every worker.
async fn health(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    let report = fleet.health();
    let status = if report.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{e}"));
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body + "\n",
    )
}

async fn metrics(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        fleet.render_prometheus(),
    )
}
