//! Runs, steps and checkpoints: upserts that never rewrite what a record is, pages after a
//! cursor, lookups by id, and the latest checkpoint.

use std::sync::Arc;

use chrono::Duration;
use serde_json::json;
use tah::model::{
    new_id, now, Checkpoint, ClientTool, FinishReason, RunKind, RunRecord, RunStatus, SessionState,
    StepKind, StepStatus, Usage,
};
use tah::store::{Store, WriteOp};
use uuid::Uuid;

use crate::store::builders::*;

conformance!(
    runs_upsert,
    runs_keep_their_client_tools,
    steps_upsert_and_lookup,
    a_tenants_tokens_count_its_llm_steps_since_a_time,
    latest_checkpoint
);

async fn runs_upsert(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    assert!(store.runs(s.id, None, 10).await.expect("runs").is_empty());
    let r = run(s.id);
    commit(&store, vec![WriteOp::UpsertRun(r.clone())]).await;
    assert_same(&stored_run(&store, s.id, r.id).await, &r);

    // Finishing updates the result columns, never the identity of the run.
    let mut done = r.clone();
    done.status = RunStatus::Completed;
    done.text = Some("Demo is a small sample project. 世界".into());
    done.finish_reason = Some(FinishReason::Model("stop".into()));
    done.usage = Usage {
        input_tokens: 900,
        output_tokens: 40,
    };
    done.steps = 3;
    done.finished_at = Some(r.created_at + Duration::milliseconds(2500));
    let mut attempt = done.clone();
    attempt.kind = RunKind::Resume;
    attempt.input = Some("ignored".into());
    attempt.start_seq = 99;
    attempt.created_at = r.created_at + Duration::seconds(9);
    commit(&store, vec![WriteOp::UpsertRun(attempt)]).await;
    assert_same(&stored_run(&store, s.id, r.id).await, &done);

    let mut failed = run(s.id);
    failed.kind = RunKind::Resume;
    failed.input = None;
    commit(&store, vec![WriteOp::UpsertRun(failed.clone())]).await;
    failed.status = RunStatus::Failed;
    failed.error = Some("model unavailable".into());
    failed.finished_at = Some(now());
    commit(&store, vec![WriteOp::UpsertRun(failed.clone())]).await;

    let all = store.runs(s.id, None, 10).await.expect("runs");
    assert_eq!(all.len(), 2);
    assert_same(&all[0], &done);
    assert_same(&all[1], &failed);
    let after = store.runs(s.id, Some(r.id), 10).await.expect("runs");
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].id, failed.id);
    assert_eq!(store.runs(s.id, None, 1).await.expect("runs").len(), 1);
    assert!(store.run(new_id(), r.id).await.expect("read").is_none());
    assert!(store.run(s.id, new_id()).await.expect("read").is_none());
}

/// The run as read back; it must be there.
async fn stored_run(store: &Arc<dyn Store>, session_id: Uuid, run_id: Uuid) -> RunRecord {
    store
        .run(session_id, run_id)
        .await
        .expect("read")
        .expect("present")
}

/// The tools a run declared for itself come back as they went in, and finishing the run
/// leaves them as they were.
async fn runs_keep_their_client_tools(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    let mut r = run(s.id);
    r.client_tools = vec![ClientTool {
        name: "ask_user".into(),
        description: "Ask the user — \"quoted\" 世界".into(),
        input_schema: json!({"type": "object", "properties": {"question": {"type": "string"}}}),
        timeout_s: Some(30),
    }];
    commit(&store, vec![WriteOp::UpsertRun(r.clone())]).await;
    assert_same(&stored_run(&store, s.id, r.id).await, &r);
    let mut done = r.clone();
    done.status = RunStatus::Completed;
    done.finished_at = Some(now());
    let mut rewritten = done.clone();
    rewritten.client_tools.clear();
    commit(&store, vec![WriteOp::UpsertRun(rewritten)]).await;
    assert_same(&stored_run(&store, s.id, r.id).await, &done);
    let plain = run(s.id);
    commit(&store, vec![WriteOp::UpsertRun(plain.clone())]).await;
    let got = stored_run(&store, s.id, plain.id).await;
    assert!(got.client_tools.is_empty());
}

async fn steps_upsert_and_lookup(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    let r = run(s.id);
    let llm = step(s.id, r.id, StepKind::Llm);
    commit(
        &store,
        vec![
            WriteOp::UpsertRun(r.clone()),
            WriteOp::UpsertStep(llm.clone().into()),
        ],
    )
    .await;
    let got = store
        .step(s.id, llm.id)
        .await
        .expect("read")
        .expect("present");
    assert_same(&got, &llm);
    assert!(got.usage.is_none() && got.response.is_none());

    let mut streaming = llm.clone();
    streaming.status = StepStatus::Streaming;
    commit(&store, vec![WriteOp::UpsertStep(streaming.clone().into())]).await;
    assert_eq!(
        store
            .step(s.id, llm.id)
            .await
            .expect("read")
            .expect("present")
            .status,
        StepStatus::Streaming
    );

    let mut done = streaming.clone();
    done.status = StepStatus::Completed;
    done.response = Some(json!({
        "role": "assistant", "content": "",
        "tool_calls": [{ "id": "call_1", "name": "read_file", "arguments": { "path": "README.md" } }]
    }));
    done.usage = Some(Usage {
        input_tokens: 321,
        output_tokens: 12,
    });
    done.finished_at = Some(llm.created_at + Duration::milliseconds(800));
    // The request is written once, at insert.
    let mut attempt = done.clone();
    attempt.request = json!({ "ignored": true });
    commit(&store, vec![WriteOp::UpsertStep(attempt.into())]).await;
    let got = store
        .step(s.id, llm.id)
        .await
        .expect("read")
        .expect("present");
    assert_same(&got, &done);

    let mut tool = step(s.id, r.id, StepKind::Tool);
    tool.request = json!({ "id": "call_1", "name": "read_file", "arguments": { "path": "x" } });
    commit(&store, vec![WriteOp::UpsertStep(tool.clone().into())]).await;
    tool.status = StepStatus::Failed;
    tool.error = Some("no such file: x".into());
    tool.response = Some(json!("no such file: x"));
    tool.finished_at = Some(now());
    commit(&store, vec![WriteOp::UpsertStep(tool.clone().into())]).await;

    let all = store.steps(s.id, None, 10).await.expect("steps");
    assert_eq!(all.len(), 2);
    assert_same(&all[0], &done);
    assert_same(&all[1], &tool);
    let after = store.steps(s.id, Some(llm.id), 10).await.expect("steps");
    assert_eq!(after.len(), 1);
    assert_same(&after[0], &tool);
    assert_eq!(store.steps(s.id, None, 1).await.expect("steps").len(), 1);
    assert!(store.step(new_id(), llm.id).await.expect("read").is_none());
    assert!(store.step(s.id, new_id()).await.expect("read").is_none());
}

/// `tenant_tokens_since`: input + output of the tenant's LLM steps created since the time, not
/// another tenant's, not older ones, not tool steps.
async fn a_tenants_tokens_count_its_llm_steps_since_a_time(store: Arc<dyn Store>) {
    let since = now() - Duration::hours(1);
    let earlier = since - Duration::hours(1);
    let mut ops = Vec::new();
    for (tenant, steps) in [
        (
            "acme",
            vec![
                (10, 5, StepKind::Llm, false),
                (100, 1, StepKind::Llm, false),
            ],
        ),
        (
            "acme",
            vec![
                (3, 3, StepKind::Tool, false),
                (1000, 0, StepKind::Llm, true),
            ],
        ),
        ("bolt", vec![(7, 7, StepKind::Llm, false)]),
    ] {
        let mut s = session(SessionState::Idle);
        s.tenant = tenant.to_string();
        let r = run(s.id);
        ops.push(WriteOp::InsertSession(s.clone()));
        ops.push(WriteOp::UpsertRun(r.clone()));
        for (input, output, kind, old) in steps {
            let mut st = step(s.id, r.id, kind);
            st.usage = Some(Usage {
                input_tokens: input,
                output_tokens: output,
            });
            if old {
                let secs = u64::try_from(earlier.timestamp()).expect("after 1970");
                let at = uuid::Timestamp::from_unix(uuid::NoContext, secs, 0);
                st.id = Uuid::new_v7(at);
                st.created_at = earlier;
            }
            ops.push(WriteOp::UpsertStep(st.into()));
        }
    }
    commit(&store, ops).await;
    let used = |tenant: &'static str| store.tenant_tokens_since(tenant, since);
    assert_eq!(used("acme").await.expect("read"), 116);
    assert_eq!(used("bolt").await.expect("read"), 14);
    assert_eq!(used("nobody").await.expect("read"), 0);
    let all = store.tenant_tokens_since("acme", earlier - Duration::seconds(1));
    assert_eq!(all.await.expect("read"), 1116);
}

async fn latest_checkpoint(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    assert!(store.latest_checkpoint(s.id).await.expect("read").is_none());
    let r = run(s.id);
    let mut last = None;
    for (i, step_id) in [None, Some(new_id()), Some(new_id())]
        .into_iter()
        .enumerate()
    {
        let c = Checkpoint {
            id: new_id(),
            session_id: s.id,
            run_id: r.id,
            step_id,
            message_count: 2 * i as i64 + 1,
            seq: 10 * i as i64 + 4,
            created_at: now(),
        };
        commit(&store, vec![WriteOp::InsertCheckpoint(c.clone())]).await;
        let got = store
            .latest_checkpoint(s.id)
            .await
            .expect("read")
            .expect("present");
        assert_same(&got, &c);
        last = Some(c);
    }
    let other = new_session(&store, SessionState::Idle).await;
    assert!(store
        .latest_checkpoint(other.id)
        .await
        .expect("read")
        .is_none());
    assert!(last.is_some_and(|c| c.step_id.is_some()));
}
