//! Pages of lists: the `limit` rule, cursors, the `{data, next_cursor}` envelope shared by
//! every list route, and the page of a session's records (paged by id or by position).

use std::future::Future;

use axum::Json;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::problem::Problem;
use super::AppState;
use crate::session::SessionError;

pub const MAX_PAGE: i64 = 500;
const DEFAULT_PAGE: i64 = 100;

/// A page of a list; `next_cursor` is absent on the last page.
#[derive(Debug, Serialize)]
pub struct Page<T: Serialize> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T: Serialize> Page<T> {
    /// A page of at most `limit` items from `data`, which was read with [`one_more`]`(limit)`:
    /// only when there is more does the page name its last item as the next cursor, so paging
    /// ends on the last page, not on an empty one after it.
    pub fn new(mut data: Vec<T>, limit: i64, cursor_of: impl Fn(&T) -> String) -> Page<T> {
        let limit = usize::try_from(limit).unwrap_or(0);
        let next_cursor = if data.len() > limit {
            data.truncate(limit);
            data.last().map(cursor_of)
        } else {
            None
        };
        Page { data, next_cursor }
    }
}

/// How many items to read for a page of `limit`: one more tells whether another page follows.
pub fn one_more(limit: i64) -> i64 {
    limit + 1
}

/// `?cursor&limit` for lists paged by id.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CursorQuery {
    pub cursor: Option<String>,
    pub limit: Option<i64>,
}

impl CursorQuery {
    pub fn cursor(&self) -> Result<Option<Uuid>, Problem> {
        parse_cursor(self.cursor.as_deref())
    }

    pub fn limit(&self) -> Result<i64, Problem> {
        page_limit(self.limit)
    }
}

pub fn page_limit(limit: Option<i64>) -> Result<i64, Problem> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(_) => Err(Problem::bad_request(format!(
            "limit must be between 1 and {MAX_PAGE}"
        ))),
    }
}

pub fn parse_cursor(cursor: Option<&str>) -> Result<Option<Uuid>, Problem> {
    match cursor {
        None | Some("") => Ok(None),
        Some(c) => Uuid::parse_str(c)
            .map(Some)
            .map_err(|_| Problem::bad_request("cursor is not valid")),
    }
}

/// A page of one session's records that are paged by id (its runs, its steps): the session
/// must exist, and the cursor is the last id of the page before.
pub async fn page_by_id<T, Read>(
    state: &AppState,
    id: Uuid,
    q: &CursorQuery,
    read: impl FnOnce(Uuid, Option<Uuid>, i64) -> Read,
    id_of: fn(&T) -> Uuid,
) -> Result<Json<Page<T>>, Problem>
where
    T: Serialize,
    Read: Future<Output = Result<Vec<T>, SessionError>>,
{
    let (limit, after) = (q.limit()?, q.cursor()?);
    session_page(state, id, limit, after, read, |r| id_of(r).to_string()).await
}

/// A page of at most `limit` of one session's records, from `after` (the last id or position
/// of the page before): the session must exist, and `read` is asked for one more than a page.
pub async fn session_page<T, After, Read>(
    state: &AppState,
    id: Uuid,
    limit: i64,
    after: After,
    read: impl FnOnce(Uuid, After, i64) -> Read,
    cursor_of: impl Fn(&T) -> String,
) -> Result<Json<Page<T>>, Problem>
where
    T: Serialize,
    Read: Future<Output = Result<Vec<T>, SessionError>>,
{
    state.sessions.get(id).await?;
    let data = read(id, after, one_more(limit)).await?;
    Ok(Json(Page::new(data, limit, cursor_of)))
}
