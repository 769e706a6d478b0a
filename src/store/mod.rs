//! Persistence: the `Store` trait, its SQLite and PostgreSQL implementations, the group-commit
//! writer, and (PostgreSQL only) the `Cluster` coordination of several replicas: session
//! leases with fencing, and notifications of committed events and commands.
//!
//! The store owns the tables; it knows nothing of actors or HTTP. Every write of a session's
//! data is expressed as [`WriteOp`]s and applied by the [`writer::Writer`] task in batched
//! transactions, so every session's changes and events commit together and many sessions share
//! few fsyncs. The idempotency keys, the sign-ins and the webhook queue, which belong to no
//! session, are written at once by their own statements (`sqlite/mod.rs` says why that is safe
//! beside the single SQLite writer).
//!
//! - `sqlite/`: the embedded store: `mod` (opening, the connection settings of both drivers),
//!   `read` over sqlx, `write` (the writer's batches on one `rusqlite` connection), `vfs` (the
//!   shim under that connection's WAL), `lock` (one process per database file).
//! - `postgres/`: the scale-out store: `read`, `write`, and `cluster` (the [`Cluster`]
//!   coordination).
//! - `rows`: what both backends share: the column lists and the decoding of rows.
//! - `writer`: the group-commit task.
//! - `keys`: the idempotency keys of POST requests, on both backends.
//! - `webhooks`: the webhook delivery queue and log, on both backends.
//! - `sign_ins`: the sign-ins of the built-in page, on both backends.
//! - `agents`: the agents and their versions, on both backends.
//! - `vaults`: the tenants' sealed secrets, on both backends.
//! - `schedules`: the schedules and their fires log, on both backends.
//! - `environments`: the remote environments and the calls queued for their workers, on both
//!   backends.

pub mod agents;
pub mod environments;
pub mod event_log;
pub mod keys;
pub mod postgres;
pub mod principals;
pub mod replays;
mod rows;
pub mod schedules;
pub mod sign_ins;
pub mod sqlite;
pub mod vaults;
pub mod webhooks;
pub mod writer;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use bytes::Bytes;

use crate::model::{
    ArtifactRecord, Checkpoint, Event, Message, Published, RunRecord, SessionRecord, SessionState,
    StepKind, StepRecord, StepStatus, Usage,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value that cannot be decoded (an unknown state, malformed JSON…).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("unsupported database URL: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// SQLite's write connection failed to apply a batch (its cause as SQLite reports it).
    #[error("database write failed: {0}")]
    Write(String),
    #[error("the writer has stopped")]
    WriterGone,
    /// The writer refuses every later commit of an actor whose earlier commit failed, so a
    /// lost write can never leave a gap in `seq`; the session's next actor writes again.
    #[error("an earlier write of this session failed: {0}")]
    Poisoned(String),
    /// The write carried a lease epoch that is no longer the session's: another replica took
    /// the session over.
    #[error("the session's lease is held by another replica")]
    Fenced,
    /// The database cannot be used as it is (in use by another process, read-only, gone);
    /// the message names the file and says what to do.
    #[error("{0}")]
    Unusable(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// The same error, for a second party to be told of it: the variants that carry text are
    /// copied, the others become a write error with their message.
    pub fn retold(&self) -> StoreError {
        match self {
            StoreError::Corrupt(why) => StoreError::Corrupt(why.clone()),
            StoreError::Unsupported(why) => StoreError::Unsupported(why.clone()),
            StoreError::Write(why) => StoreError::Write(why.clone()),
            StoreError::WriterGone => StoreError::WriterGone,
            StoreError::Poisoned(why) => StoreError::Poisoned(why.clone()),
            StoreError::Fenced => StoreError::Fenced,
            StoreError::Unusable(why) => StoreError::Unusable(why.clone()),
            StoreError::Database(_) | StoreError::Migrate(_) | StoreError::Io(_) => {
                StoreError::Write(self.to_string())
            }
        }
    }
}

/// A session's labels, as [`WriteOp::UpdateLabels`] writes them.
#[derive(Debug, Clone)]
pub struct SessionLabels {
    pub id: Uuid,
    pub title: Option<String>,
    pub metadata: serde_json::Value,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// One change to the database. A batch of ops commits in one transaction.
#[derive(Debug, Clone)]
pub enum WriteOp {
    InsertSession(SessionRecord),
    /// Writes what a session's actor changes (options, state, error, usage, last run), not
    /// its labels: those are [`WriteOp::UpdateLabels`]'s alone after the session is made.
    UpdateSession(SessionRecord),
    /// Writes a session's labels, its title and metadata: what clients set, and no run
    /// changes, so that a label's update and the session's actor never overwrite each other.
    UpdateLabels(SessionLabels),
    /// Writes what a session's runs change: [`SessionProgress`].
    UpdateProgress(SessionProgress),
    /// Removes the session and everything in it.
    DeleteSession(Uuid),
    InsertMessage {
        session_id: Uuid,
        message: Message,
    },
    /// Copies messages `0..upto` (all when `None`) of `from` into `to`, inside the database.
    CopyMessages {
        from: Uuid,
        to: Uuid,
        upto: Option<i64>,
    },
    /// Records an artifact of a session, and its bytes unless bytes of that sha256 are stored
    /// already (by any session): content is stored once per sha256.
    InsertArtifact(NewArtifact),
    /// Copies the artifact records of `from` made while its history had at most `upto`
    /// messages (all when `None`) into `to`, ids included; the bytes are shared, not copied.
    CopyArtifacts {
        from: Uuid,
        to: Uuid,
        upto: Option<i64>,
    },
    UpsertRun(RunRecord),
    UpsertStep(StepRow),
    InsertEvent(Arc<Published>),
    InsertCheckpoint(Checkpoint),
    /// Refuses the whole commit unless `owner` still holds the session's lease at `epoch`
    /// (scale-out fencing; a no-op on a single-node store).
    Fence {
        session_id: Uuid,
        owner: Uuid,
        epoch: i64,
    },
    /// Gives back the session's lease if `owner` still holds it (scale-out; a no-op on a
    /// single-node store). Through the writer, a lease given back after a run shares the
    /// transaction, and its flush, of whatever commits with it, instead of one of its own.
    ReleaseLease {
        session_id: Uuid,
        owner: Uuid,
    },
    /// Marks the steps of `run_id` that never finished as failed (an interrupted run).
    FailOpenSteps {
        session_id: Uuid,
        run_id: Uuid,
        error: String,
        at: chrono::DateTime<chrono::Utc>,
    },
}

impl WriteOp {
    /// Inserts `event`, published to the session's subscribers once committed.
    pub fn insert_event(event: Event) -> WriteOp {
        WriteOp::InsertEvent(Arc::new(Published::new(event)))
    }
}

/// The columns of a session that its runs change (state, error, usage, last run, update
/// time), written without the ones only its creation and its policy set (title, metadata,
/// options), which would have to be copied and serialised again at every state change.
#[derive(Debug, Clone)]
pub struct SessionProgress {
    pub id: Uuid,
    pub state: SessionState,
    pub error: Option<String>,
    pub usage: Usage,
    pub last_run_id: Option<Uuid>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl SessionProgress {
    pub fn of(s: &SessionRecord) -> SessionProgress {
        SessionProgress {
            id: s.id,
            state: s.state,
            error: s.error.clone(),
            usage: s.usage,
            last_run_id: s.last_run_id,
            updated_at: s.updated_at,
        }
    }
}

/// A step as the stores write it: a [`StepRecord`] whose request and response are JSON text
/// already, serialised where the step was made rather than on the writer's thread, which every
/// commit waits for. An update of an existing step writes its status, response, usage, error and
/// finish time; its request stays as first written.
#[derive(Debug, Clone)]
pub struct StepRow {
    pub id: Uuid,
    pub session_id: Uuid,
    pub run_id: Uuid,
    pub kind: StepKind,
    pub status: StepStatus,
    pub request: String,
    pub response: Option<String>,
    pub usage: Option<Usage>,
    pub error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl From<StepRecord> for StepRow {
    fn from(s: StepRecord) -> StepRow {
        StepRow {
            id: s.id,
            session_id: s.session_id,
            run_id: s.run_id,
            kind: s.kind,
            status: s.status,
            request: s.request.to_string(),
            response: s.response.as_ref().map(|r| r.to_string()),
            usage: s.usage,
            error: s.error,
            created_at: s.created_at,
            finished_at: s.finished_at,
        }
    }
}

/// An artifact to record, with its bytes (see [`WriteOp::InsertArtifact`]).
#[derive(Debug, Clone)]
pub struct NewArtifact {
    pub session_id: Uuid,
    pub artifact: ArtifactRecord,
    /// Messages in the session's history when it was recorded (what a fork compares with).
    pub message_count: i64,
    /// The `seq` of its `artifact.created` event.
    pub seq: i64,
    pub content: Bytes,
}

/// Which versions an artifact list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactVersions {
    /// The newest version of each path.
    Newest,
    /// Every version of every path.
    All,
}

/// Which artifacts of a session a list holds: the versions, those with `id > after` when
/// given, at most `limit`.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactQuery {
    pub versions: ArtifactVersions,
    pub after: Option<Uuid>,
    pub limit: i64,
}

/// Filters and paging for the session list (newest first; the cursor is the last id seen).
#[derive(Debug, Clone, Default)]
pub struct SessionQuery {
    pub limit: i64,
    pub before: Option<Uuid>,
    pub state: Option<SessionState>,
    /// Only the children (forks and sub-agents) of this session.
    pub parent_id: Option<Uuid>,
    /// Only the sessions of this tenant.
    pub tenant: Option<String>,
    /// Only the sessions this principal made.
    pub owner: Option<String>,
}

/// What a session holds in order: its messages and events (by index and `seq`), and its
/// runs, steps and artifacts (rows with time-ordered ids, read a page or one at a time). Both backends
/// have them from [`rows::SessionRows`]; every [`Store`] has them.
#[async_trait]
pub trait SessionHistory: Send + Sync {
    /// Messages with `index > after`, in order, at most `limit`.
    async fn messages(&self, session_id: Uuid, after: i64, limit: i64)
        -> StoreResult<Vec<Message>>;

    /// Events with `seq > after`, in order, at most `limit`.
    async fn events(&self, session_id: Uuid, after: i64, limit: i64) -> StoreResult<Vec<Event>>;

    /// Steps in creation order, with `id > after` when given.
    async fn steps(
        &self,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<StepRecord>>;
    async fn step(&self, session_id: Uuid, step_id: Uuid) -> StoreResult<Option<StepRecord>>;

    /// Runs in creation order, with `id > after` when given.
    async fn runs(
        &self,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<RunRecord>>;
    async fn run(&self, session_id: Uuid, run_id: Uuid) -> StoreResult<Option<RunRecord>>;

    /// A session's artifacts in creation order (by id), as `query` asks.
    async fn artifacts(
        &self,
        session_id: Uuid,
        query: ArtifactQuery,
    ) -> StoreResult<Vec<ArtifactRecord>>;
}

#[async_trait]
pub trait Store: SessionHistory + Send + Sync + 'static {
    /// Applies every group of ops in one transaction: all or nothing.
    async fn commit(&self, batch: &[&[WriteOp]]) -> StoreResult<()>;

    /// Whether [`Store::commit_owned`] does its work inside its first poll, on the caller's
    /// thread (nothing can overlap it).
    fn commits_on_caller(&self) -> bool {
        false
    }

    /// [`Store::commit`] of groups the store may move (to another thread) rather than copy;
    /// they are handed back with the result.
    async fn commit_owned(&self, batch: Vec<Vec<WriteOp>>) -> (Vec<Vec<WriteOp>>, StoreResult<()>) {
        let result = {
            let groups: Vec<&[WriteOp]> = batch.iter().map(Vec::as_slice).collect();
            self.commit(&groups).await
        };
        (batch, result)
    }

    async fn session(&self, id: Uuid) -> StoreResult<Option<SessionRecord>>;
    /// The session a run belongs to (run ids are unique across sessions); `None` when no
    /// session has that run. A store that keeps no runs has none.
    async fn run_session(&self, _run_id: Uuid) -> StoreResult<Option<Uuid>> {
        Ok(None)
    }
    async fn sessions(&self, query: &SessionQuery) -> StoreResult<Vec<SessionRecord>>;
    /// Sessions stored as `running` or `waiting_tool` (runs a dead process left behind).
    async fn active_sessions(&self) -> StoreResult<Vec<Uuid>>;
    /// Sessions whose last run failed as `interrupted` (a crash or a stop cut it short): what
    /// auto-resume continues at start.
    async fn interrupted_sessions(&self) -> StoreResult<Vec<Uuid>>;

    /// The index of the user message that starts turn `n` (0-based), if there is one.
    async fn nth_user_message(&self, session_id: Uuid, n: u64) -> StoreResult<Option<i64>>;
    /// The number of messages (= the next index).
    async fn message_count(&self, session_id: Uuid) -> StoreResult<i64>;

    /// The newest `seq` (0 for an empty log).
    async fn last_seq(&self, session_id: Uuid) -> StoreResult<i64>;

    async fn latest_checkpoint(&self, session_id: Uuid) -> StoreResult<Option<Checkpoint>>;

    async fn artifact(&self, session_id: Uuid, id: Uuid) -> StoreResult<Option<ArtifactRecord>>;
    /// The newest version of `path` among a session's artifacts; 0 when it has none.
    async fn artifact_version(&self, session_id: Uuid, path: &str) -> StoreResult<i64>;
    /// The bytes stored under a sha256 (lower-case hex).
    async fn blob(&self, sha256: &str) -> StoreResult<Option<Vec<u8>>>;
    /// The tokens (input + output) the LLM steps of a tenant's sessions used since `since`
    /// (what `--tenant-max-tokens-per-day` counts).
    async fn tenant_tokens_since(&self, tenant: &str, since: DateTime<Utc>) -> StoreResult<u64>;
    /// What the LLM steps of a tenant's sessions cost since `since`, in US dollars (what
    /// `--tenant-max-cost-usd-per-day` counts); steps without a price count nothing.
    async fn tenant_cost_since(&self, tenant: &str, since: DateTime<Utc>) -> StoreResult<f64> {
        let _ = (tenant, since);
        Ok(0.0)
    }

    /// The tables that belong to no session; `None` for a store without them. A store that
    /// keeps them answers `Some(self)`, and the accessors below follow.
    fn server_tables(&self) -> Option<&dyn ServerTables> {
        None
    }

    /// The idempotency keys of the HTTP layer; `None` for a store without them.
    fn idempotency(&self) -> Option<&dyn keys::IdempotencyKeys> {
        self.server_tables()
            .map(|tables| tables as &dyn keys::IdempotencyKeys)
    }

    /// The webhook delivery queue; `None` for a store without it.
    fn webhooks(&self) -> Option<&dyn webhooks::WebhookQueue> {
        self.server_tables()
            .map(|tables| tables as &dyn webhooks::WebhookQueue)
    }

    /// The sign-ins of the built-in page; `None` for a store without them.
    fn sign_ins(&self) -> Option<&dyn sign_ins::SignIns> {
        self.server_tables()
            .map(|tables| tables as &dyn sign_ins::SignIns)
    }

    /// The agents; `None` for a store without them.
    fn agents(&self) -> Option<&dyn agents::AgentStore> {
        self.server_tables()
            .map(|tables| tables as &dyn agents::AgentStore)
    }

    /// The vaults' sealed secrets; `None` for a store without them.
    fn vaults(&self) -> Option<&dyn vaults::VaultStore> {
        self.server_tables()
            .map(|tables| tables as &dyn vaults::VaultStore)
    }

    /// The schedules and their fires; `None` for a store without them.
    fn schedule_store(&self) -> Option<&dyn schedules::ScheduleStore> {
        self.server_tables()
            .map(|tables| tables as &dyn schedules::ScheduleStore)
    }

    /// The environments and their workers' calls; `None` for a store without them.
    fn environments(&self) -> Option<&dyn environments::EnvironmentStore> {
        self.server_tables()
            .map(|tables| tables as &dyn environments::EnvironmentStore)
    }

    /// The replays; `None` for a store without them.
    fn replay_store(&self) -> Option<&dyn replays::ReplayStore> {
        self.server_tables()
            .map(|tables| tables as &dyn replays::ReplayStore)
    }

    /// The API keys and session tokens; `None` for a store without them.
    fn principals(&self) -> Option<&dyn principals::PrincipalStore> {
        self.server_tables()
            .map(|tables| tables as &dyn principals::PrincipalStore)
    }

    /// Whether the database can be used now (for readiness): it answers a read, and whatever
    /// else the backend can check cheaply.
    async fn health(&self) -> StoreResult<()> {
        self.last_seq(Uuid::nil()).await.map(|_| ())
    }
}

/// The tables that belong to no session, written by their own statements rather than in a
/// session's batches: the idempotency keys, the webhook queue, the sign-ins, the agents, the
/// vaults' secrets, the schedules and the replays. Both backends keep them all; any type that implements them all is one.
pub trait ServerTables:
    keys::IdempotencyKeys
    + webhooks::WebhookQueue
    + sign_ins::SignIns
    + agents::AgentStore
    + principals::PrincipalStore
    + vaults::VaultStore
    + schedules::ScheduleStore
    + environments::EnvironmentStore
    + replays::ReplayStore
{
}

impl<T> ServerTables for T where
    T: keys::IdempotencyKeys
        + webhooks::WebhookQueue
        + sign_ins::SignIns
        + agents::AgentStore
        + principals::PrincipalStore
        + vaults::VaultStore
        + schedules::ScheduleStore
        + environments::EnvironmentStore
        + replays::ReplayStore
{
}

/// Coordination of several replicas on one database (PostgreSQL). Times come from the
/// database's clock, never a replica's.
#[async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// Takes or keeps the lease of a session for `owner`; the epoch grows whenever the owner
    /// changes. `None` when another live owner holds it.
    async fn acquire(
        &self,
        session_id: Uuid,
        owner: Uuid,
        ttl: Duration,
    ) -> StoreResult<Option<i64>>;
    /// Renews every lease `owner` still holds (one statement for all), also one that expired
    /// while no other owner took it; returns them.
    async fn renew(&self, owner: Uuid, ttl: Duration) -> StoreResult<Vec<(Uuid, i64)>>;
    async fn release(&self, session_id: Uuid, owner: Uuid) -> StoreResult<()>;
    async fn release_all(&self, owner: Uuid) -> StoreResult<()>;
    /// Sessions stored as running whose lease expired or was released: to be taken over.
    async fn orphaned(&self, limit: i64) -> StoreResult<Vec<Uuid>>;
    /// Asks the replica that runs `session_id` to cancel it.
    async fn send_cancel(&self, session_id: Uuid) -> StoreResult<()>;
    /// A connection that receives notifications (committed events, commands).
    async fn listen(&self) -> StoreResult<Box<dyn ClusterListener>>;
}

#[derive(Debug, Clone, PartialEq)]
pub enum ClusterNotice {
    /// Events up to `seq` of a session were committed by replica `origin`.
    Events {
        origin: Uuid,
        session_id: Uuid,
        seq: i64,
    },
    /// Cancel the session's run, if it runs here.
    Cancel { session_id: Uuid },
    /// The connection was lost and re-established: notifications may have been missed.
    Reconnected,
}

#[async_trait]
pub trait ClusterListener: Send {
    async fn next(&mut self) -> StoreResult<ClusterNotice>;
}

/// An opened database: the store, and the cluster coordination when the database offers it.
pub struct Opened {
    pub store: Arc<dyn Store>,
    pub cluster: Option<Arc<dyn Cluster>>,
}

/// What a commit survives once it is acknowledged (`--durability`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// The server's process being killed (`kill -9`, a crash, an OOM kill): SQLite writes the
    /// WAL at each commit and syncs it at checkpoints (`synchronous=NORMAL`), so a crash of the
    /// machine or a power loss may lose the last commits, never leave a torn one. PostgreSQL
    /// keeps the server's own `synchronous_commit` (on by default: synced).
    #[default]
    Process,
    /// A power loss or a kernel crash too: the log is synced before a commit is acknowledged
    /// (SQLite `synchronous=FULL`, PostgreSQL `synchronous_commit=on` on every connection).
    Power,
}

impl Durability {
    /// SQLite's `synchronous` setting for it.
    fn sqlite_synchronous(self) -> &'static str {
        match self {
            Durability::Process => "NORMAL",
            Durability::Power => "FULL",
        }
    }
}

/// Opens the store a database URL names, creating and migrating it as needed. `replica`
/// names this process in notifications.
pub async fn open(url: &str, replica: Uuid) -> StoreResult<Opened> {
    open_with(url, replica, Durability::default()).await
}

/// [`open`], with commits as durable as `durability` says.
pub async fn open_with(url: &str, replica: Uuid, durability: Durability) -> StoreResult<Opened> {
    if url.starts_with("sqlite:") {
        Ok(Opened {
            store: Arc::new(sqlite::SqliteStore::open_with(url, durability).await?),
            cluster: None,
        })
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = Arc::new(
            postgres::PostgresStore::open_with(url, durability)
                .await?
                .with_replica(replica),
        );
        Ok(Opened {
            store: store.clone(),
            cluster: Some(store),
        })
    } else {
        Err(StoreError::Unsupported(format!(
            "{url} (expected sqlite://PATH or postgres://USER@HOST/DB)"
        )))
    }
}
