//! Who is calling, and what it may reach: [`Caller`] is the [`Principal`] that authentication
//! resolved for the request (an operator when the server requires no token), and
//! [`check_session`] refuses a request on a session its principal may not use, from the
//! route's template alone, so no session route can forget it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use super::problem::Problem;
use crate::model::{Denied, Principal, SessionId, SessionNeed};
use crate::session::Sessions;

/// The request's principal.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, Problem> {
        Ok(Caller(
            parts
                .extensions
                .get::<Principal>()
                .cloned()
                .unwrap_or(Principal::Operator),
        ))
    }
}

/// The problem for a principal that may not do what it asked: `what` is the resource in
/// words ("session", "agent"), for the `404` that hides it.
pub fn denied(denied: Denied, what: &str) -> Problem {
    match denied {
        Denied::Hidden => Problem::not_found(format!("{what} not found")),
        Denied::Forbidden => forbidden(format!(
            "this principal may not do this to the {what}: its role or token scope does not \
             allow it"
        )),
    }
}

/// A `403`: the principal is known, and may not do this.
pub fn forbidden(detail: impl Into<String>) -> Problem {
    Problem::new(StatusCode::FORBIDDEN, "forbidden", detail)
}

/// What a route asks of its caller, from its method and path template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteNeed {
    /// Nothing: the handler decides (tenant reads, agents, keys, vaults, lists, creation).
    Handler,
    /// A session named by the path's `{id}`.
    Session(SessionNeed),
}

/// The path segment after `/v1/sessions/{id}/` of the routes that a session token of scope
/// `interact` (and a viewer never) may call with a method other than GET.
const INTERACT_ROUTES: &[&str] = &[
    "runs",
    "resume",
    "cancel",
    "approvals",
    "tool-results",
    "ai-sdk",
    "ag-ui",
];

/// The session routes of tah's API and of the faces that name a session in their path: the
/// template's prefix up to the session's `{id}`, and the first segments after it that a
/// session token of scope `interact` may call with a method other than GET. A route of one of
/// these shapes is checked by [`check_session`] before its handler runs, for every face alike.
const SESSION_ROUTES: &[(&str, &[&str])] = &[
    ("/v1/sessions/", INTERACT_ROUTES),
    // Anthropic's managed agents: sending events (messages, interrupts, confirmations, custom
    // tool results) interacts; updating, archiving and deleting need the owner.
    ("/anthropic/v1/sessions/", &["events"]),
    // OpenAI's Agents API: sending events (messages, tool results, cancel) interacts;
    // updating and deleting need the owner.
    ("/openai/v1/agents/sessions/", &["events"]),
];

/// OpenAI's Responses routes: a response's id names its session, so their handlers call
/// [`check_session_access`]; a session token reaches its own session's responses there.
const OPENAI_RESPONSES: &str = "/openai/v1/responses";

/// What the route `template` (as axum matched it, e.g. `/v1/sessions/{id}/runs`) asks for
/// `method`.
pub fn route_need(method: &Method, template: &str) -> RouteNeed {
    let Some((rest, interact)) = SESSION_ROUTES.iter().find_map(|(prefix, interact)| {
        let rest = template.strip_prefix(prefix)?.strip_prefix("{id}")?;
        (rest.is_empty() || rest.starts_with('/')).then_some((rest, *interact))
    }) else {
        return RouteNeed::Handler;
    };
    if *method == Method::GET || *method == Method::HEAD {
        return RouteNeed::Session(SessionNeed::Read);
    }
    let first = rest.trim_start_matches('/').split('/').next().unwrap_or("");
    match interact.contains(&first) {
        true => RouteNeed::Session(SessionNeed::Interact),
        false => RouteNeed::Session(SessionNeed::Own),
    }
}

/// Whether `principal` may do what `need` says to the session `id`: the check of
/// [`check_session`], for the handlers of faces whose routes do not name the session in their
/// path (a response id, a JSON-RPC body). `404` when it may not see it (or it does not exist),
/// `403` when it sees it but may not do this.
pub async fn check_session_access(
    sessions: &Sessions,
    principal: &Principal,
    id: Uuid,
    need: SessionNeed,
) -> Result<(), Problem> {
    if let Principal::Session { session, .. } = principal {
        if session.0 != id {
            return Err(forbidden(
                "this session token is valid only on its own session",
            ));
        }
    }
    if principal.is_operator() {
        return Ok(());
    }
    let record = sessions.get(id).await.map_err(Problem::from)?;
    principal
        .may_use_session(SessionId(id), &record.tenant, record.owner.as_deref(), need)
        .map_err(|d| denied(d, "session"))
}

/// The tenant and owner of sessions, as checked for access: they never change, so they are
/// kept once read (a deleted session's entry is harmless: its routes answer `404`).
#[derive(Clone, Default)]
pub struct SessionOwners(Arc<Mutex<HashMap<Uuid, TenantOwner>>>);

/// A session's tenant and owner.
type TenantOwner = (Arc<str>, Option<Arc<str>>);

/// How many sessions' owners are kept before the map starts again.
const MAX_KEPT_OWNERS: usize = 100_000;

impl SessionOwners {
    async fn of(&self, sessions: &Sessions, id: Uuid) -> Result<TenantOwner, Problem> {
        if let Some(found) = self.0.lock().ok().and_then(|m| m.get(&id).cloned()) {
            return Ok(found);
        }
        let record = sessions.get(id).await.map_err(Problem::from)?;
        let found: TenantOwner = (record.tenant.into(), record.owner.map(Into::into));
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= MAX_KEPT_OWNERS {
                map.clear();
            }
            map.insert(id, found.clone());
        }
        Ok(found)
    }
}

/// The state of [`check_session`].
#[derive(Clone)]
pub struct SessionAccess {
    pub sessions: Sessions,
    pub owners: SessionOwners,
}

/// Refuses a request on a session its principal may not reach (`404` when it may not see
/// the session, `403` when it sees it but may not do this), before the handler reads the
/// body. Routes that name no session pass to their handlers, which decide.
pub async fn check_session(
    State(access): State<SessionAccess>,
    request: Request,
    next: Next,
) -> Response {
    let principal = request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or(Principal::Operator);
    let need = match request.extensions().get::<MatchedPath>() {
        Some(path) => route_need(request.method(), path.as_str()),
        None => RouteNeed::Handler,
    };
    let RouteNeed::Session(need) = need else {
        // Only session routes are open to a session token, OpenAI's responses, whose handlers
        // check the session a response id (or a request body) names, and A2A's, whose
        // handlers check the session of each context and task they name.
        let path = request.uri().path();
        let own_check = path.starts_with(OPENAI_RESPONSES) || path.starts_with("/a2a/");
        if matches!(principal, Principal::Session { .. }) && !own_check {
            return forbidden("a session token is valid only on its session's own routes")
                .into_response();
        }
        return next.run(request).await;
    };
    if principal.is_operator() {
        return next.run(request).await;
    }
    // A malformed id names no session: the handler answers it.
    let Some(id) = session_id_of(request.uri().path()) else {
        return next.run(request).await;
    };
    if let Principal::Session { session, .. } = &principal {
        if session.0 != id {
            return forbidden("this session token is valid only on its own session's routes")
                .into_response();
        }
    }
    let (tenant, owner) = match access.owners.of(&access.sessions, id).await {
        Ok(found) => found,
        Err(problem) => return problem.into_response(),
    };
    match principal.may_use_session(SessionId(id), &tenant, owner.as_deref(), need) {
        Ok(()) => next.run(request).await,
        Err(d) => denied(d, "session").into_response(),
    }
}

/// The session id of a session route's path (`/v1/sessions/{id}/…`, or a face's).
fn session_id_of(path: &str) -> Option<Uuid> {
    let rest = SESSION_ROUTES
        .iter()
        .find_map(|(prefix, _)| path.strip_prefix(prefix))?;
    Uuid::parse_str(rest.split('/').next()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_routes_ask_what_the_contract_says() {
        let need = |m: Method, t: &str| route_need(&m, t);
        use RouteNeed::*;
        assert_eq!(need(Method::GET, "/v1/sessions"), Handler);
        assert_eq!(need(Method::POST, "/v1/sessions"), Handler);
        assert_eq!(need(Method::GET, "/v1/agents/{id}"), Handler);
        assert_eq!(
            need(Method::GET, "/v1/sessions/{id}"),
            Session(SessionNeed::Read)
        );
        assert_eq!(
            need(Method::GET, "/v1/sessions/{id}/events"),
            Session(SessionNeed::Read)
        );
        for interact in [
            "/v1/sessions/{id}/runs",
            "/v1/sessions/{id}/cancel",
            "/v1/sessions/{id}/resume",
            "/v1/sessions/{id}/approvals/{call_id}",
            "/v1/sessions/{id}/tool-results/{call_id}",
            "/v1/sessions/{id}/ai-sdk/chat",
            "/v1/sessions/{id}/ag-ui",
        ] {
            assert_eq!(
                need(Method::POST, interact),
                Session(SessionNeed::Interact),
                "{interact}"
            );
        }
        for own in [
            "/v1/sessions/{id}/fork",
            "/v1/sessions/{id}/compact",
            "/v1/sessions/{id}/tokens",
        ] {
            assert_eq!(need(Method::POST, own), Session(SessionNeed::Own), "{own}");
        }
        assert_eq!(
            need(Method::DELETE, "/v1/sessions/{id}"),
            Session(SessionNeed::Own)
        );
        assert_eq!(
            need(Method::POST, "/v1/sessions/{id}"),
            Session(SessionNeed::Own),
            "the session update (its cap in money) is the owner's"
        );
        assert_eq!(
            need(Method::POST, "/anthropic/v1/sessions/{id}/events"),
            Session(SessionNeed::Interact)
        );
        assert_eq!(
            need(Method::GET, "/anthropic/v1/sessions/{id}/events/stream"),
            Session(SessionNeed::Read)
        );
        assert_eq!(
            need(Method::POST, "/anthropic/v1/sessions/{id}/archive"),
            Session(SessionNeed::Own)
        );
        assert_eq!(need(Method::GET, "/anthropic/v1/sessions"), Handler);
        assert_eq!(need(Method::GET, "/v1/sessions/{idx}"), Handler);
        let id = uuid::Uuid::now_v7();
        assert_eq!(session_id_of(&format!("/v1/sessions/{id}/runs")), Some(id));
        assert_eq!(
            session_id_of(&format!("/anthropic/v1/sessions/{id}/events")),
            Some(id)
        );
        assert_eq!(session_id_of("/v1/sessions/nope/runs"), None);
    }
}
