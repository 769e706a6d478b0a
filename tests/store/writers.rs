//! The store's other writers beside the batches: idempotency keys, sign-ins, the webhook
//! queue and the agents write outside the sessions' batches (on SQLite through the read pool,
//! beside the single batch connection), at the same time as batches commit, and every write of
//! either side succeeds.

use std::sync::Arc;

use tah::model::{AgentId, AgentRecord, AgentSpec, SessionState};
use tah::store::agents::{AgentQuery, Bumped};
use tah::store::keys::{KeyClaim, StoredResponse};
use tah::store::sign_ins::NewSignIn;
use tah::store::Store;

use crate::store::builders::*;

conformance!(other_writers_and_batches_commit_side_by_side);

/// Commits of each side.
const ROUNDS: i64 = 40;

/// A claim of `key` by `claim` at `now` for one minute; the key is kept a day.
fn claim_at<'a>(key: &'a str, claim: &'a str, now: i64) -> KeyClaim<'a> {
    KeyClaim {
        key,
        fingerprint: "POST /v1/sessions",
        claim,
        now,
        claimed_until: now + 60_000,
        expires_at: now + 86_400_000,
    }
}

async fn other_writers_and_batches_commit_side_by_side(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Idle).await;
    let batches = tokio::spawn({
        let store = store.clone();
        async move {
            for round in 0..ROUNDS {
                commit(&store, events_op(s.id, round * 10 + 1..=round * 10 + 10)).await;
            }
        }
    });
    let keys = store
        .idempotency()
        .expect("the store keeps idempotency keys");
    let sign_ins = store.sign_ins().expect("the store keeps sign-ins");
    let webhooks = store.webhooks().expect("the store keeps a webhook queue");
    let agents = store.agents().expect("the store keeps agents");
    let response = StoredResponse {
        status: 201,
        content_type: Some("application/json".into()),
        location: None,
        body: b"{}".to_vec(),
    };
    for round in 0..ROUNDS {
        let key = format!("key-{round}");
        let claim = claim_at(&key, "claim-a", 1_000);
        assert_eq!(keys.claim_key(&claim).await.expect("claims"), None);
        keys.answer_key(&key, "claim-a", &response)
            .await
            .expect("answers");
        let id = format!("sign-in-{round}");
        let sign_in = NewSignIn {
            id: &id,
            token_binding: "binding",
            created_at: 1_000,
            expires_at: 5_000,
        };
        sign_ins.insert_sign_in(&sign_in).await.expect("records");
        webhooks.release_claims().await.expect("frees claims");
        let first = new_agent(round);
        agents.insert_agent(&first).await.expect("creates an agent");
        let next = AgentRecord {
            version: 2,
            ..first.clone()
        };
        let bumped = agents.add_agent_version(&next, 1).await.expect("updates");
        assert_eq!(bumped, Bumped::Done);
    }
    batches.await.expect("every batch commits");

    assert_eq!(store.last_seq(s.id).await.expect("reads"), ROUNDS * 10);
    for round in 0..ROUNDS {
        let key = format!("key-{round}");
        let later = claim_at(&key, "claim-b", 2_000);
        let held = keys.claim_key(&later).await.expect("reads the key");
        let answered = held.and_then(|record| record.response);
        assert_eq!(answered.as_ref(), Some(&response), "{key}");
    }
    assert_eq!(
        sign_ins.purge_sign_ins(5_000).await.expect("purges"),
        ROUNDS as u64
    );
    let listed = agents
        .agents(&AgentQuery {
            limit: 500,
            before: None,
            include_archived: false,
            tenant: None,
        })
        .await
        .expect("lists agents");
    assert_eq!(listed.len(), ROUNDS as usize);
    assert!(listed.iter().all(|a| a.version == 2));
}

fn new_agent(round: i64) -> AgentRecord {
    let at = tah::model::now();
    AgentRecord {
        id: AgentId::Stored(tah::model::new_id()),
        version: 1,
        spec: AgentSpec::named(format!("agent-{round}"), "mock"),
        created_at: at,
        updated_at: at,
        archived_at: None,
        tenant: tah::model::DEFAULT_TENANT.to_string(),
    }
}
