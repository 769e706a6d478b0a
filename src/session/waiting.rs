//! Reading the waiting calls of a session's runs from the store, and what a call that was
//! not run gets as its result. The projection itself is [`crate::model::waiting`].

use serde_json::{json, Value};
use uuid::Uuid;

pub use crate::model::waiting::{
    Answered, ClientResult, Kind, PendingApproval, PendingClientCall, Resolution, Waiting,
};
use crate::model::ResolvedBy;
use crate::tools::ToolOutput;

/// The result a call gets when a human denied it.
pub fn denied_output(reason: Option<&str>) -> ToolOutput {
    let mut body = json!({ "error": "the user denied this call" });
    if let Some(reason) = reason {
        body["reason"] = Value::String(reason.to_string());
    }
    ToolOutput {
        output: body.to_string(),
        is_error: true,
        artifacts: Vec::new(),
    }
}

/// The result a call gets when nobody answered its approval in time.
pub fn unanswered_output(kind: Kind) -> ToolOutput {
    ToolOutput::error(match kind {
        Kind::Approval => {
            "nobody answered the approval request in time, so the call did not run (it was not \
             refused)"
        }
        Kind::Client => "the client did not send this call's result in time",
    })
}

/// The result a refused or timed-out approval gives the model.
pub fn refusal_output(resolution: &Resolution) -> ToolOutput {
    match resolution.by {
        ResolvedBy::Timeout => unanswered_output(Kind::Approval),
        ResolvedBy::Cancel => ToolOutput::error("the run was cancelled before this call ran"),
        ResolvedBy::Policy => ToolOutput::error(
            resolution
                .reason
                .as_deref()
                .unwrap_or("the server's policy does not allow this call"),
        ),
        ResolvedBy::User => denied_output(resolution.reason.as_deref()),
    }
}

/// The waiting calls of the run whose first event is `start_seq`, read from the store.
pub(super) async fn of_run(
    store: &dyn crate::store::Store,
    session_id: Uuid,
    start_seq: i64,
) -> crate::store::StoreResult<Waiting> {
    of_events(store, session_id, start_seq, i64::MAX).await
}

/// The calls of every run that began before the event `before` (all runs: `i64::MAX`), read
/// from the store: where a late answer to a call of an ended run is looked up.
pub(super) async fn of_earlier_runs(
    store: &dyn crate::store::Store,
    session_id: Uuid,
    before: i64,
) -> crate::store::StoreResult<Waiting> {
    of_events(store, session_id, 1, before).await
}

/// The calls of the events `from <= seq < before`.
async fn of_events(
    store: &dyn crate::store::Store,
    session_id: Uuid,
    from: i64,
    before: i64,
) -> crate::store::StoreResult<Waiting> {
    const PAGE: i64 = 1000;
    let mut waiting = Waiting::default();
    let mut after = from - 1;
    loop {
        let page = store.events(session_id, after, PAGE).await?;
        waiting.extend(page.iter().take_while(|e| e.seq < before));
        match page.last() {
            Some(last) if page.len() as i64 == PAGE && last.seq < before - 1 => after = last.seq,
            _ => return Ok(waiting),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Decision, ResolvedBy};

    #[test]
    fn refusals_say_who_refused() {
        let resolution = |by| Resolution {
            call_id: "a".into(),
            decision: Decision::Deny,
            by,
            reason: Some("too risky".into()),
            input: None,
            answered_by: None,
        };
        let user = refusal_output(&resolution(ResolvedBy::User));
        assert!(
            user.output.contains("the user denied this call"),
            "{}",
            user.output
        );
        assert!(user.output.contains("too risky"));
        let timeout = refusal_output(&resolution(ResolvedBy::Timeout));
        assert!(
            timeout.output.contains("nobody answered"),
            "{}",
            timeout.output
        );
        assert!(!timeout.output.contains("denied"));
        assert!(timeout.is_error);
    }
}
