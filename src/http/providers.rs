//! `GET /v1/providers`: the model providers agents can name, `default` (the flags') first,
//! with their types, base URLs and prices. Never a key, a header's value or a base URL's
//! credentials: [`crate::llm::providers::ProviderInfo`] holds none of them.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::AppState;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/providers", get(list))
}

async fn list(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.sessions.deps().providers.list() }))
}
