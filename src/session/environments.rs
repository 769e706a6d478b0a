//! Environments (where a session's built-in tools run) and the work of their workers.
//!
//! A call of a session in a `workers` environment waits like a client tool's call (durably,
//! in the session's log, bounded by the call's timeout); admission also queues it in the
//! store's `worker_calls`. A worker claims one there under a lease (a conditional update, so
//! exactly one claim wins across workers and replicas), renews the lease while the call runs,
//! and its result answers the waiting call through the session's one answer path. A claim
//! whose lease ran out is offered again when its tool may simply run again
//! ([`rerun_safe`](crate::model::rerun_safe)); a `shell` call is answered as interrupted
//! instead, so it never runs twice.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::errors::{ConflictKind, SessionError};
use super::sessions::Sessions;
use crate::model::{
    self, rerun_safe, valid_environment_name, Environment, EnvironmentKind, ToolCall,
    LOCAL_ENVIRONMENT,
};
use crate::session::waiting::ClientResult;
use crate::store::environments::{EnvironmentRow, EnvironmentStore, WorkerCallRow};

/// The result a `shell` call gets when its worker stopped answering while it held it.
pub const INTERRUPTED_OUTPUT: &str = "the worker running this call stopped answering before it \
                                      sent a result: the command was interrupted and may or \
                                      may not have run (it was not run again)";

/// The result a worker call gets when no worker sent its result before its timeout.
pub fn no_worker_output(environment: &str) -> String {
    format!("no worker of environment {environment:?} took the call and sent its result in time")
}

/// A call a worker claimed: what to run, and the claim that names it from now on.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerClaim {
    /// The claim's id: the worker sends heartbeats and the result under it.
    pub claim_id: String,
    pub session_id: String,
    pub call_id: String,
    pub tool: String,
    pub input: Value,
    /// The claim lapses at this time unless a heartbeat renews it.
    pub lease_until: DateTime<Utc>,
    /// How many claims this call has had, this one included (more than one: a worker died
    /// holding it, and it is run again).
    pub attempt: i64,
}

fn environment_of(row: EnvironmentRow) -> Result<Environment, SessionError> {
    let kind = EnvironmentKind::parse(&row.kind).ok_or_else(|| {
        SessionError::Store(crate::store::StoreError::Corrupt(format!(
            "environment {}: type {:?}",
            row.id, row.kind
        )))
    })?;
    Ok(Environment {
        id: row.id,
        name: row.name,
        kind,
        tenant: row.tenant,
        created_at: Some(row.created_at),
    })
}

impl Sessions {
    fn environment_store(&self) -> Result<&dyn EnvironmentStore, SessionError> {
        self.deps.store.environments().ok_or_else(|| {
            SessionError::BadInput("this server's store keeps no environments".to_string())
        })
    }

    /// Creates an environment of `tenant`.
    pub async fn create_environment(
        &self,
        tenant: &str,
        name: &str,
        kind: EnvironmentKind,
    ) -> Result<Environment, SessionError> {
        if !valid_environment_name(name) {
            return Err(SessionError::BadInput(format!(
                "name {name:?}: use 1-64 of A-Z a-z 0-9 - _ . (not starting with env_)"
            )));
        }
        if name == LOCAL_ENVIRONMENT {
            return Err(SessionError::Conflict(ConflictKind::EnvironmentExists(
                name.to_string(),
            )));
        }
        let row = EnvironmentRow {
            id: format!("env_{}", model::new_id().simple()),
            tenant: tenant.to_string(),
            name: name.to_string(),
            kind: kind.as_str().to_string(),
            created_at: model::now(),
        };
        if !self.environment_store()?.insert_environment(&row).await? {
            return Err(SessionError::Conflict(ConflictKind::EnvironmentExists(
                name.to_string(),
            )));
        }
        environment_of(row)
    }

    /// The environment of `tenant` with this id or name (`local` is built in).
    pub async fn environment(
        &self,
        tenant: &str,
        id_or_name: &str,
    ) -> Result<Environment, SessionError> {
        if id_or_name == LOCAL_ENVIRONMENT {
            return Ok(Environment::local(tenant));
        }
        match self
            .environment_store()?
            .environment(tenant, id_or_name)
            .await?
        {
            Some(row) => environment_of(row),
            None => Err(SessionError::EnvironmentNotFound(format!(
                "environment {id_or_name:?} not found"
            ))),
        }
    }

    /// A page of `tenant`'s environments after the one whose id is `after` (`None`: from the
    /// start): `local` first, then the stored ones, newest first.
    pub async fn environments(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Environment>, SessionError> {
        let mut page = Vec::new();
        if after.is_none() {
            page.push(Environment::local(tenant));
        }
        let before = after.filter(|id| *id != LOCAL_ENVIRONMENT);
        let rows = self
            .environment_store()?
            .environments(tenant, before, limit - page.len() as i64)
            .await?;
        for row in rows {
            page.push(environment_of(row)?);
        }
        Ok(page)
    }

    /// Deletes an environment of `tenant`. Sessions and agents that name it keep its name: a
    /// later environment of that name serves them, and until then their built-in tool calls
    /// are answered with an error saying it is gone.
    pub async fn delete_environment(
        &self,
        tenant: &str,
        id_or_name: &str,
    ) -> Result<(), SessionError> {
        if id_or_name == LOCAL_ENVIRONMENT {
            return Err(SessionError::BadInput(
                "the local environment is built in: it cannot be deleted".to_string(),
            ));
        }
        let environment = self.environment(tenant, id_or_name).await?;
        self.environment_store()?
            .delete_environment(tenant, &environment.id)
            .await?;
        Ok(())
    }

    /// The environment a new session runs its tools in: its own choice, else its agent's,
    /// else `local`; one its tenant does not have is not found.
    pub async fn session_environment(
        &self,
        tenant: &str,
        own: Option<&str>,
        agent: Option<&str>,
    ) -> Result<String, SessionError> {
        match own.or(agent) {
            None => Ok(LOCAL_ENVIRONMENT.to_string()),
            Some(name) => Ok(self.environment(tenant, name).await?.name),
        }
    }

    /// Claims the oldest call of `tenant`'s environment `name` that a worker may take, for
    /// `lease`; `None` when there is none now. A `shell` call whose worker's lease ran out is
    /// answered as interrupted on the way (once: the update that ends it is conditional).
    pub async fn claim_worker_call(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<WorkerClaim>, SessionError> {
        let store = self.environment_store()?;
        let lease = self.deps.policy.worker_lease;
        let now = model::now();
        for row in store.claimable_calls(tenant, name, now, 16).await? {
            if row.state == "claimed" && !rerun_safe(&row.tool) {
                self.interrupt(&row).await?;
                continue;
            }
            if !self.still_waits(&row).await? {
                // Its run was cancelled or ended meanwhile: it must not run any more.
                store
                    .delivered_worker_call(&row.session_id, &row.call_id)
                    .await?;
                continue;
            }
            let claim_id = model::new_id().to_string();
            let lease_until = now + chrono_of(lease);
            if store
                .claim_worker_call(&row, &claim_id, lease_until, now)
                .await?
            {
                tracing::info!(
                    session_id = %row.session_id, call_id = %row.call_id, tool = %row.tool,
                    attempt = row.attempts + 1, "a worker claimed a call"
                );
                return Ok(Some(WorkerClaim {
                    claim_id,
                    input: serde_json::from_str(&row.input).unwrap_or(Value::Null),
                    session_id: row.session_id,
                    call_id: row.call_id,
                    tool: row.tool,
                    lease_until,
                    attempt: row.attempts + 1,
                }));
            }
        }
        Ok(None)
    }

    /// Whether the session's active run still waits for the call's result.
    async fn still_waits(&self, row: &WorkerCallRow) -> Result<bool, SessionError> {
        let Ok(id) = Uuid::parse_str(&row.session_id) else {
            return Ok(false);
        };
        match self.pending_client_calls(id).await {
            Ok(pending) => Ok(pending.iter().any(|call| call.call_id == row.call_id)),
            Err(SessionError::NotFound) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// The claim `claim_id`, when it is of `tenant`'s environment `name` and still held.
    async fn held_claim(
        &self,
        (tenant, name): (&str, &str),
        claim_id: &str,
    ) -> Result<WorkerCallRow, SessionError> {
        match self.environment_store()?.worker_call(claim_id).await? {
            Some(row) if row.tenant == tenant && row.environment == name => Ok(row),
            _ => Err(SessionError::NoSuchCall(format!(
                "claim {claim_id:?} is not held: it lapsed, was answered, or never was"
            ))),
        }
    }

    /// Renews a claim's lease on a call of `environment` (its tenant and name); when it lapses
    /// next.
    pub async fn renew_worker_claim(
        &self,
        environment: (&str, &str),
        claim_id: &str,
    ) -> Result<DateTime<Utc>, SessionError> {
        let row = self.held_claim(environment, claim_id).await?;
        let lease_until = model::now() + chrono_of(self.deps.policy.worker_lease);
        if self
            .environment_store()?
            .renew_worker_call(&row.session_id, &row.call_id, claim_id, lease_until)
            .await?
        {
            Ok(lease_until)
        } else {
            Err(SessionError::NoSuchCall(format!(
                "claim {claim_id:?} is no longer held"
            )))
        }
    }

    /// A worker's result for the call of `environment` (its tenant and name) it claimed: the
    /// waiting call's answer. It is kept with the call first, so that the replica that runs
    /// the session records it when this one may not (see [`Sessions::deliver`]).
    pub async fn worker_result(
        &self,
        environment: (&str, &str),
        claim_id: &str,
        output: String,
        is_error: bool,
    ) -> Result<ClientResult, SessionError> {
        let row = self.held_claim(environment, claim_id).await?;
        if !self
            .environment_store()?
            .finish_worker_call(&row.session_id, &row.call_id, claim_id, (&output, is_error))
            .await?
        {
            return Err(SessionError::NoSuchCall(format!(
                "claim {claim_id:?} is no longer held"
            )));
        }
        let result = ClientResult {
            call_id: row.call_id,
            output,
            is_error,
        };
        self.deliver(&row.session_id, result.clone()).await?;
        Ok(result)
    }

    /// Records a worker call's kept result in its session, when this replica may write the
    /// session; otherwise the replica that runs it does, on its next sweep.
    async fn deliver(&self, session_id: &str, result: ClientResult) -> Result<(), SessionError> {
        let store = self.environment_store()?;
        let Ok(id) = Uuid::parse_str(session_id) else {
            return Ok(store
                .delivered_worker_call(session_id, &result.call_id)
                .await?);
        };
        let call_id = result.call_id.clone();
        match self.client_result(id, result).await {
            Err(SessionError::Conflict(ConflictKind::RunningElsewhere))
            | Err(SessionError::ShuttingDown) => Ok(()),
            Err(SessionError::Store(error)) => Err(SessionError::Store(error)),
            outcome => {
                if let Err(error) = outcome {
                    // Answered otherwise meanwhile (its timeout, a cancel): nothing to record.
                    tracing::debug!(%error, %call_id, "a worker call's result was not recorded");
                }
                Ok(store.delivered_worker_call(session_id, &call_id).await?)
            }
        }
    }

    /// Answers the claimed `shell` calls whose lease ran out (any tenant's) as interrupted,
    /// and records the kept results of worker calls of the sessions this replica may write.
    pub async fn sweep_worker_calls(&self) -> Result<usize, SessionError> {
        let Some(store) = self.deps.store.environments() else {
            return Ok(0);
        };
        let mut ended = 0;
        for row in store
            .lapsed_worker_calls(&["shell"], model::now(), 64)
            .await?
        {
            if self.interrupt(&row).await? {
                ended += 1;
            }
        }
        for (session_id, call_id, output, is_error) in store.answered_worker_calls(64).await? {
            let result = ClientResult {
                call_id,
                output,
                is_error,
            };
            self.deliver(&session_id, result).await?;
        }
        Ok(ended)
    }

    /// Answers a lapsed claim as interrupted and tells the model so; false when another
    /// replica or worker got to it first.
    async fn interrupt(&self, row: &WorkerCallRow) -> Result<bool, SessionError> {
        let output = serde_json::json!({ "error": INTERRUPTED_OUTPUT }).to_string();
        if !self
            .environment_store()?
            .interrupt_worker_call(row, &output)
            .await?
        {
            return Ok(false);
        }
        tracing::warn!(
            session_id = %row.session_id, call_id = %row.call_id, tool = %row.tool,
            "a worker's lease on a call ran out: answered as interrupted"
        );
        let result = ClientResult {
            call_id: row.call_id.clone(),
            output,
            is_error: true,
        };
        self.deliver(&row.session_id, result).await?;
        Ok(true)
    }
}

/// Queues a call of a session in a `workers` environment for the environment's workers.
pub(in crate::session) async fn queue_call(
    store: &dyn crate::store::Store,
    session: &model::SessionRecord,
    environment: &str,
    call: &ToolCall,
    expires_at: Option<DateTime<Utc>>,
) -> Result<(), crate::store::StoreError> {
    let Some(calls) = store.environments() else {
        return Ok(());
    };
    let row = WorkerCallRow {
        session_id: session.id.to_string(),
        call_id: call.id.clone(),
        tenant: session.tenant.clone(),
        environment: environment.to_string(),
        tool: call.name.clone(),
        input: call.arguments.to_string(),
        state: "queued".to_string(),
        worker: None,
        attempts: 0,
        lease_until: None,
        expires_at,
        queued_at: model::now(),
    };
    calls.queue_worker_call(&row).await
}

fn chrono_of(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::seconds(30))
}

/// Answers, every `period`, the `shell` calls whose worker's lease ran out (see
/// [`Sessions::sweep_worker_calls`]); every replica runs one, and the conditional update lets
/// one of them answer each call.
pub fn start_sweeper(
    sessions: Sessions,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let period = (sessions.deps.policy.worker_lease / 4)
        .clamp(Duration::from_millis(250), Duration::from_secs(5));
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(period) => {}
            }
            match sessions.sweep_worker_calls().await {
                Ok(_) => failing = false,
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "cannot sweep the workers' lapsed calls");
                    }
                    failing = true;
                }
            }
        }
    })
}
