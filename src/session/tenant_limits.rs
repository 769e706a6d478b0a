//! The limits of one tenant (`--tenant-max-concurrent-runs`, `--tenant-max-tokens-per-day`,
//! `--tenant-max-cost-usd-per-day`). Runs and tokens are checked when a run is asked for; the
//! spend of the day before each LLM step (a run that reaches it ends with `budget`). Concurrency is counted in this process: a top-level run
//! holds a [`TenantSlot`] for its whole tree of sub-agents (whose runs take none), given back
//! when the run ends however it ends (the slot is dropped with the run, and before its end is
//! written when it is recorded). The tokens of the day are read from the
//! database, which replicas share, and kept for a few seconds per tenant; a run of the tenant
//! that ends here forgets them once its end is written, so the next request reads what it
//! used.
//!
//! The spend of the day (the `cost_usd` of the tenant's LLM steps since 00:00 UTC) is read from
//! the database at first use and at most every few seconds after, and the steps of this
//! process add to it between two reads. With several replicas, a replica sees what the others
//! spent at its next read: the tenant may go past its cap by what the other replicas' runs
//! spend in that time, one step each at most per run once they read it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDate, Utc};

use super::errors::SessionError;
use crate::store::{Store, StoreError};

/// How long a tenant's usage of the day is kept before it is read again.
const USAGE_TTL: Duration = Duration::from_secs(5);

/// What a run refused for the concurrency limit is told to wait, in seconds.
const RUNS_RETRY_AFTER: u64 = 2;

/// The limits and what counts against them.
#[derive(Debug, Default)]
pub struct TenantLimits {
    max_runs: Option<usize>,
    max_tokens_per_day: Option<u64>,
    max_cost_usd_per_day: Option<f64>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Top-level runs in progress in this process, by tenant (no entry: none).
    running: HashMap<String, usize>,
    /// Tokens used today, by tenant, as last read.
    usage: HashMap<String, Usage>,
    /// US dollars spent today, by tenant: as last read, plus this process's steps since.
    spend: HashMap<String, Spend>,
}

#[derive(Debug, Clone, Copy)]
struct Spend {
    day: NaiveDate,
    usd: f64,
    read_at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Usage {
    day: NaiveDate,
    tokens: u64,
    read_at: Instant,
}

/// A top-level run's place among its tenant's runs; given back when dropped.
#[derive(Debug)]
pub struct TenantSlot {
    limits: Arc<TenantLimits>,
    tenant: String,
}

impl TenantLimits {
    pub fn new(
        max_runs: Option<usize>,
        max_tokens_per_day: Option<u64>,
        max_cost_usd_per_day: Option<f64>,
    ) -> Arc<TenantLimits> {
        Arc::new(TenantLimits {
            max_runs,
            max_tokens_per_day,
            max_cost_usd_per_day,
            state: Mutex::default(),
        })
    }

    /// Why `tenant` may not start another LLM step: its spend of the day has reached
    /// `--tenant-max-cost-usd-per-day`; `None` while it has room or there is no such cap.
    pub async fn cost_reached(
        &self,
        store: &dyn Store,
        tenant: &str,
    ) -> Result<Option<String>, StoreError> {
        let Some(max) = self.max_cost_usd_per_day else {
            return Ok(None);
        };
        let spent = self.spent_today(store, tenant, Utc::now()).await?;
        Ok((spent >= max).then(|| {
            format!(
                "cost budget reached: tenant {tenant:?} has spent {} today (UTC), its cap is \
                 {max} a day (--tenant-max-cost-usd-per-day); resume after 00:00 UTC or once \
                 the cap is raised",
                super::cost::usd(spent)
            )
        }))
    }

    /// Adds the cost of a step of `tenant`'s to its spend of the day.
    pub fn add_cost(&self, tenant: &str, usd: f64) {
        if self.max_cost_usd_per_day.is_none() {
            return;
        }
        let today = Utc::now().date_naive();
        if let Some(spend) = self.lock().spend.get_mut(tenant) {
            if spend.day == today {
                spend.usd += usd;
            }
        }
    }

    /// What `tenant` spent today: as read less than [`USAGE_TTL`] ago plus this process's
    /// steps since, or read now.
    async fn spent_today(
        &self,
        store: &dyn Store,
        tenant: &str,
        now: DateTime<Utc>,
    ) -> Result<f64, StoreError> {
        let day = now.date_naive();
        let kept = self.lock().spend.get(tenant).copied();
        if let Some(spend) = kept.filter(|s| s.day == day && s.read_at.elapsed() < USAGE_TTL) {
            return Ok(spend.usd);
        }
        let since = day.and_time(chrono::NaiveTime::MIN).and_utc();
        let usd = store.tenant_cost_since(tenant, since).await?;
        let spend = Spend {
            day,
            usd,
            read_at: Instant::now(),
        };
        self.lock().spend.insert(tenant.to_string(), spend);
        Ok(usd)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain data behind the lock, never held across an await.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new top-level run of `tenant`: its slot (none when no limit is set), or why
    /// it is refused.
    pub async fn admit(
        self: &Arc<Self>,
        store: &dyn Store,
        tenant: &str,
    ) -> Result<Option<TenantSlot>, SessionError> {
        if self.max_runs.is_none() && self.max_tokens_per_day.is_none() {
            return Ok(None);
        }
        if let Some(max) = self.max_tokens_per_day {
            let now = Utc::now();
            let used = self.used_today(store, tenant, now).await?;
            if used >= max {
                return Err(SessionError::TenantLimit {
                    detail: format!(
                        "tenant {tenant:?} has used {used} tokens today (UTC), its limit is \
                         {max} a day (--tenant-max-tokens-per-day); new runs start again at \
                         00:00 UTC"
                    ),
                    retry_after: seconds_to_midnight(now),
                });
            }
        }
        let mut state = self.lock();
        let running = state.running.entry(tenant.to_string()).or_default();
        if let Some(max) = self.max_runs {
            if *running >= max {
                let detail = format!(
                    "tenant {tenant:?} has {running} runs in progress on this server, its limit \
                     is {max} (--tenant-max-concurrent-runs); retry shortly"
                );
                if *running == 0 {
                    state.running.remove(tenant);
                }
                return Err(SessionError::TenantLimit {
                    detail,
                    retry_after: RUNS_RETRY_AFTER,
                });
            }
        }
        *running += 1;
        Ok(Some(TenantSlot {
            limits: self.clone(),
            tenant: tenant.to_string(),
        }))
    }

    /// The tokens `tenant` used today: as read less than [`USAGE_TTL`] ago, or read now.
    async fn used_today(
        &self,
        store: &dyn Store,
        tenant: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, SessionError> {
        let day = now.date_naive();
        let kept = self.lock().usage.get(tenant).copied();
        if let Some(usage) = kept.filter(|u| u.day == day && u.read_at.elapsed() < USAGE_TTL) {
            return Ok(usage.tokens);
        }
        let since = day.and_time(chrono::NaiveTime::MIN).and_utc();
        let tokens = store.tenant_tokens_since(tenant, since).await?;
        let usage = Usage {
            day,
            tokens,
            read_at: Instant::now(),
        };
        self.lock().usage.insert(tenant.to_string(), usage);
        Ok(tokens)
    }

    /// Forgets the tokens `tenant` used as last read (a run of its has ended and written what
    /// it used).
    pub fn forget_usage(&self, tenant: &str) {
        self.lock().usage.remove(tenant);
    }

    /// Runs of `tenant` in progress in this process.
    #[cfg(test)]
    fn running(&self, tenant: &str) -> usize {
        self.lock().running.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut state = self.limits.lock();
        if let Some(running) = state.running.get_mut(&self.tenant) {
            *running = running.saturating_sub(1);
            if *running == 0 {
                state.running.remove(&self.tenant);
            }
        }
    }
}

/// Seconds from `now` to the next 00:00 UTC (at least 1).
fn seconds_to_midnight(now: DateTime<Utc>) -> u64 {
    let next = now.date_naive().succ_opt().unwrap_or(now.date_naive());
    let midnight = next.and_time(chrono::NaiveTime::MIN).and_utc();
    let millis = u64::try_from((midnight - now).num_milliseconds()).unwrap_or(0);
    millis.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[test]
    fn the_wait_until_midnight_is_rounded_up_and_never_zero() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        assert_eq!(seconds_to_midnight(at("2026-12-03T00:00:00Z")), 86_400);
        assert_eq!(seconds_to_midnight(at("2026-12-03T23:59:59.500Z")), 1);
        assert_eq!(seconds_to_midnight(at("2026-12-03T23:59:59.999Z")), 1);
        assert_eq!(seconds_to_midnight(at("2026-12-03T12:00:00.200Z")), 43_200);
    }

    #[tokio::test]
    async fn a_tenant_at_its_run_limit_is_refused_until_a_slot_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = SqliteStore::open(&url).await.expect("open");
        let limits = TenantLimits::new(Some(1), None, None);
        let a = limits
            .admit(&store, "a")
            .await
            .expect("admitted")
            .expect("a slot");
        let refused = limits.admit(&store, "a").await.expect_err("at the limit");
        match refused {
            SessionError::TenantLimit {
                detail,
                retry_after,
            } => {
                assert_eq!(retry_after, RUNS_RETRY_AFTER);
                assert!(detail.contains("has 1 runs in progress"), "{detail}");
            }
            other => panic!("refused as {other:?}"),
        }
        let b = limits.admit(&store, "b").await.expect("another tenant");
        assert_eq!((limits.running("a"), limits.running("b")), (1, 1));
        drop(a);
        assert_eq!(limits.running("a"), 0);
        let again = limits.admit(&store, "a").await.expect("admitted again");
        assert_eq!(limits.running("a"), 1);
        drop((again, b));
        assert!(limits.lock().running.is_empty());
        let off = TenantLimits::new(None, None, None);
        assert!(off.admit(&store, "a").await.expect("ok").is_none());
    }
}
