//! Claude Managed Agents under `/anthropic` (beta `managed-agents-2026-04-01`), so that
//! `new Anthropic({baseURL: "http://HOST/anthropic"})` and
//! `anthropic.Anthropic(base_url="http://HOST/anthropic")` drive tah with `client.beta.*`:
//!
//! - `agents`: tah's agents and their versions ([`agents`]);
//! - `environments`: one local workspace environment, derived, never stored ([`environments`]);
//! - `sessions`: tah's sessions, under their own UUIDs ([`sessions`]);
//! - `sessions.events`: sending (`user.message`, `user.interrupt`, `user.tool_confirmation`,
//!   `user.custom_tool_result`), the list and the stream, a pure view of the session's log
//!   ([`crate::protocols::anthropic::events`]; [`events`]).
//!
//! Errors are tah's problems, reshaped into Anthropic's error object by
//! [`super::errors`]. Lists page with the SDK's cursor: `?limit&page`, answered with
//! `{data, next_page}` (and `prev_page` for sessions).

mod agents;
mod environments;
mod events;
mod sessions;

use axum::Router;
use serde_json::{Map, Value};

use crate::http::problem::Problem;
use crate::http::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .merge(agents::routes())
        .merge(environments::routes())
        .merge(sessions::routes())
        .merge(events::routes())
}

/// The largest page a list gives.
pub(super) const MAX_LIMIT: i64 = 1000;

/// A query string as the SDK writes it: arrays as `key[]=a&key[]=b` (read under `key`),
/// bracketed filters such as `created_at[gte]` kept as they are.
#[derive(Debug, Default)]
pub(super) struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// The query, refused (naming the parameter) when it has one not in `allowed`.
    pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Query, Problem> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(raw.unwrap_or("").as_bytes())
            .map(|(k, v)| {
                let key = k.strip_suffix("[]").unwrap_or(&k).to_string();
                (key, v.into_owned())
            })
            .collect();
        if let Some((key, _)) = pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            return Err(Problem::bad_request(format!(
                "{key}: unknown or unsupported query parameter (this route takes {})",
                if allowed.is_empty() {
                    "none".to_string()
                } else {
                    allowed.join(", ")
                }
            )));
        }
        Ok(Query { pairs })
    }

    pub fn one(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn all(&self, key: &str) -> Vec<&str> {
        self.pairs
            .iter()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, v)| v.split(','))
            .filter(|v| !v.is_empty())
            .collect()
    }

    pub fn flag(&self, key: &str) -> Result<bool, Problem> {
        match self.one(key) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(other) => Err(Problem::bad_request(format!(
                "{key}: must be true or false, not {other:?}"
            ))),
        }
    }

    /// `limit`: 1 to [`MAX_LIMIT`] (their SDKs' tool runner reads pages of 1000), 100 when
    /// absent.
    pub fn limit(&self) -> Result<i64, Problem> {
        match self.one("limit") {
            None => Ok(100),
            Some(text) => text
                .parse::<i64>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    Problem::bad_request(format!("limit: must be an integer from 1 to {MAX_LIMIT}"))
                }),
        }
    }

    pub fn number(&self, key: &str) -> Result<Option<u32>, Problem> {
        match self.one(key) {
            None => Ok(None),
            Some(text) => text.parse::<u32>().map(Some).map_err(|_| {
                Problem::bad_request(format!("{key}: must be a non-negative integer"))
            }),
        }
    }
}

/// A JSON body's field that must be a string (or absent / null).
pub(super) fn opt_string(
    body: &Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<Option<String>, Problem> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Problem::bad_request(format!("{field}: must be a string"))),
    }
}

/// A `{key: string}` map (or absent / null).
pub(super) fn string_map(value: Option<&Value>, field: &str) -> Result<Option<Value>, Problem> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => {
            if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
                return Err(Problem::bad_request(format!(
                    "{field}.{k}: must be a string"
                )));
            }
            Ok(Some(Value::Object(map.clone())))
        }
        Some(_) => Err(Problem::bad_request(format!("{field}: must be an object"))),
    }
}

/// Refuses a field tah does not take unless it is absent, null or empty.
pub(super) fn refuse_unless_empty(
    body: &Map<String, Value>,
    key: &str,
    why: &str,
) -> Result<(), Problem> {
    let empty = match body.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::Array(items)) => items.is_empty(),
        Some(Value::Object(map)) => map.is_empty(),
        Some(_) => false,
    };
    match empty {
        true => Ok(()),
        false => Err(Problem::bad_request(format!("{key}: {why}"))),
    }
}

/// Refuses the body's fields not in `known`.
pub(super) fn known_fields(body: &Map<String, Value>, known: &[&str]) -> Result<(), Problem> {
    match body.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(Problem::bad_request(format!("{key}: unknown field"))),
        None => Ok(()),
    }
}
