//! `POST /prefix` on the HTTP port: a router's prefix query. The body names one request's page
//! keys in order (`{"keys": [...]}`); the answer is every node holding the first of them with
//! the length of its leading run, and of the part in memory (`{"keys": n, "nodes": [...]}`,
//! what `peercache-node locate --prefix --json` prints) — one directory fan-out.
//!
//! Who may ask: with `http_token_file` set, only requests that carry the bearer token; without
//! one, anyone on a cluster with no secret, and nobody on a cluster with a secret (the answer
//! would tell a stranger which keys the cluster holds, so it is refused with 403 until a token
//! is set).

use std::sync::{Arc, Weak};

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::node::core::{Core, NodeCell};
use crate::serve::bearer::BearerGuard;

/// The most keys one query may name (a request of 4096 pages is far beyond any prompt's).
pub(crate) const MAX_KEYS: usize = 4096;

/// The largest body read: 4096 keys of up to 200 bytes each, quoted and separated.
const MAX_BODY: usize = 1 << 20;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Query {
    keys: Vec<String>,
}

/// The `/prefix` route of the node behind `cell`, guarded by `guard` when a token is set.
pub(crate) fn route(cell: NodeCell, guard: Option<BearerGuard>) -> axum::routing::MethodRouter {
    axum::routing::post(move |headers: HeaderMap, body: Bytes| {
        let (cell, guard) = (cell.clone(), guard.clone());
        async move { answer(&cell, guard.as_ref(), &headers, body).await }
    })
    .layer(DefaultBodyLimit::max(MAX_BODY))
}

fn refuse(status: StatusCode, why: String) -> Response {
    (status, why).into_response()
}

async fn answer(
    cell: &NodeCell,
    guard: Option<&BearerGuard>,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let Some(core) = cell.get().and_then(Weak::upgrade) else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "stopping".into());
    };
    match guard {
        Some(g) if !g.admits(headers) => {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "a bearer token is required (http_token_file)",
            )
                .into_response();
        }
        None if core.id.auth_enabled => {
            return refuse(
                StatusCode::FORBIDDEN,
                "this cluster has a secret: /prefix is served only with http_token_file set".into(),
            );
        }
        _ => {}
    }
    let query: Query = match serde_json::from_slice(&body) {
        Ok(q) => q,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"keys\": [\"...\", ...]}}: {e}"),
            );
        }
    };
    if query.keys.len() > MAX_KEYS {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{} keys: at most {MAX_KEYS} per query", query.keys.len()),
        );
    }
    let n = query.keys.len();
    // The directory fan-out blocks (each RPC under its deadline): off the serving threads.
    let found = tokio::task::spawn_blocking(move || locate(&core, &query.keys)).await;
    match found {
        Ok(Ok(runs)) => axum::Json(serde_json::json!({
            "keys": n, "nodes": crate::prefix_json(&runs),
        }))
        .into_response(),
        Ok(Err(crate::StoreError::Shutdown)) => {
            refuse(StatusCode::SERVICE_UNAVAILABLE, "stopping".into())
        }
        Ok(Err(e)) => refuse(StatusCode::BAD_GATEWAY, format!("directory lookup: {e}")),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn locate(core: &Arc<Core>, keys: &[String]) -> Result<Vec<crate::PrefixRun>, crate::StoreError> {
    core.read_wing().prefix_locations(&core.page_keys(keys))
}
