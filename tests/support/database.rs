//! Reading the server's own database from a test, on either backend: for what only the tables
//! show (how many copies of some bytes are stored, how much room rows take), never for what
//! the API can answer. Queries are written once, in SQL both SQLite and PostgreSQL read.

use sqlx::Connection;

use crate::support::server::{Backend, TestServer};

impl TestServer {
    /// The integer the one-row, one-column query `sql` answers (`CAST(… AS BIGINT)` what
    /// PostgreSQL would answer as `numeric`).
    pub async fn query_i64(&self, sql: &str) -> i64 {
        match self.backend() {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.database_path())
                    .expect("open the SQLite database");
                conn.query_row(sql, [], |row| row.get(0))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(self.database_url())
                    .await
                    .expect("connect to the test database");
                let value: i64 = sqlx::query_scalar(sql)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                let _ = conn.close().await;
                value
            }
        }
    }

    /// Bytes the database uses for `table` with its indexes (and, with PostgreSQL, its
    /// TOAST table), as the database itself counts them: whole pages.
    pub async fn table_bytes(&self, table: &str) -> i64 {
        let sql = match self.backend() {
            // The `dbstat` table counts every page of the table and of its indexes.
            Backend::Sqlite => format!(
                "SELECT CAST(COALESCE(SUM(pgsize), 0) AS BIGINT) FROM dbstat \
                 WHERE name = '{table}' OR name IN \
                 (SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}')"
            ),
            Backend::Postgres => format!("SELECT pg_total_relation_size('{table}')"),
        };
        self.query_i64(&sql).await
    }

    /// Bytes the rows of `table` hold, without page and index overhead: SQLite's record
    /// payloads (`dbstat`), PostgreSQL's row sizes (`pg_column_size` of each row).
    pub async fn row_bytes(&self, table: &str) -> i64 {
        let sql = match self.backend() {
            Backend::Sqlite => format!(
                "SELECT CAST(COALESCE(SUM(payload), 0) AS BIGINT) FROM dbstat WHERE name = '{table}'"
            ),
            Backend::Postgres => format!(
                "SELECT CAST(COALESCE(SUM(pg_column_size(t.*)), 0) AS BIGINT) FROM {table} t"
            ),
        };
        self.query_i64(&sql).await
    }
}
