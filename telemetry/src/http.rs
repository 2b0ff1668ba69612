//! `/metrics` and `/health` over HTTP: one small axum listener.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use serde::Serialize;

use crate::{TelemetryError, CONTENT_TYPE};

/// `/health`'s answer: 200 when `ready`, else 503, with the caller's body.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub ready: bool,
    pub content_type: &'static str,
    pub body: String,
}

impl Health {
    /// A plain-text body (`ok`, `draining`).
    pub fn text(ready: bool, body: impl Into<String>) -> Self {
        Self {
            ready,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    /// A JSON body, pretty-printed for a person with curl.
    pub fn json(ready: bool, body: &impl Serialize) -> Self {
        let body = serde_json::to_string_pretty(body).unwrap_or_else(|e| e.to_string());
        Self {
            ready,
            content_type: "application/json",
            body: body + "\n",
        }
    }
}

/// What the listener asks on each request.
pub trait Endpoints: Send + Sync + 'static {
    /// Prometheus text for `/metrics`.
    fn metrics(&self) -> String;
    fn health(&self) -> Health;
}

/// Binds `listen` and serves `/metrics` and `/health` until `stop` completes; returns the bound
/// address (useful with port 0).
pub async fn serve<E: Endpoints>(
    listen: SocketAddr,
    endpoints: Arc<E>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, TelemetryError> {
    let failed = |source| TelemetryError::Listen {
        addr: listen,
        source,
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(failed)?;
    let bound = listener.local_addr().map_err(failed)?;
    let app = router(endpoints);
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "health/metrics listener stopped");
        }
    });
    Ok(bound)
}

/// `/metrics` and `/health` as routes, for a server that has routes of its own.
pub fn router<E: Endpoints>(endpoints: Arc<E>) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics::<E>))
        .route("/health", get(health::<E>))
        .with_state(endpoints)
}

async fn metrics<E: Endpoints>(State(endpoints): State<Arc<E>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], endpoints.metrics())
}

async fn health<E: Endpoints>(State(endpoints): State<Arc<E>>) -> impl IntoResponse {
    let Health {
        ready,
        content_type,
        body,
    } = endpoints.health();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, [(header::CONTENT_TYPE, content_type)], body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Fixed {
        ready: AtomicBool,
    }

    impl Endpoints for Fixed {
        fn metrics(&self) -> String {
            "x_total 1\n".into()
        }

        fn health(&self) -> Health {
            let ready = self.ready.load(Ordering::Relaxed);
            Health::text(ready, if ready { "ok\n" } else { "draining\n" })
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response.to_lowercase()
    }

    #[tokio::test]
    async fn serves_metrics_and_the_callers_health_verdict_until_stopped() {
        let endpoints = Arc::new(Fixed {
            ready: AtomicBool::new(true),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let addr = serve(
            "127.0.0.1:0".parse().expect("addr"),
            endpoints.clone(),
            async move {
                let _ = stopped.await;
            },
        )
        .await
        .expect("listener");
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("http/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{metrics}"
        );
        assert!(metrics.ends_with("x_total 1\n"), "{metrics}");
        assert!(get(addr, "/health").await.ends_with("\r\n\r\nok\n"));
        endpoints.ready.store(false, Ordering::Relaxed);
        let health = get(addr, "/health").await;
        assert!(health.starts_with("http/1.1 503"), "{health}");
        assert!(health.ends_with("draining\n"), "{health}");
        let _ = stop.send(());
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while tokio::net::TcpStream::connect(addr).await.is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the listener closes once stopped");
    }

    #[test]
    fn json_health_is_pretty_with_a_newline() {
        let h = Health::json(false, &serde_json::json!({"status": "draining"}));
        assert_eq!(h.body, "{\n  \"status\": \"draining\"\n}\n");
        assert_eq!(h.content_type, "application/json");
    }
}
