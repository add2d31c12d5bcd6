//! The ledger a test gateway writes, on either engine, read the way a test checks it:
//! plain SQL whose every value comes back as text, and the audit view of a request
//! through the ledger's own interface.

use std::path::{Path, PathBuf};

use purser::ledger::read::RequestRow;
use purser::ledger::{Ledger, Target};

/// Which engine a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// A test gateway's ledger.
#[derive(Debug, Clone)]
pub enum Db {
    Sqlite(PathBuf),
    /// A URL whose search path is the test's own schema.
    Postgres(String),
}

/// One row, every column as text (`None` for NULL).
pub type Row = Vec<Option<String>>;

impl Db {
    pub fn target(&self) -> Target {
        match self {
            Db::Sqlite(p) => Target::Sqlite(p.clone()),
            Db::Postgres(url) => Target::Postgres(url.clone()),
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            Db::Sqlite(_) => Engine::Sqlite,
            Db::Postgres(_) => Engine::Postgres,
        }
    }

    /// The SQLite file, for the tests that only make sense on one (a lock held on it).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Db::Sqlite(p) => Some(p),
            Db::Postgres(_) => None,
        }
    }

    /// Run `sql` (no parameters) and return its rows as text.
    pub async fn rows(&self, sql: &str) -> Vec<Row> {
        match self {
            Db::Sqlite(path) => sqlite_rows(path, sql),
            Db::Postgres(url) => {
                let client = super::pg::connect(url).await;
                client
                    .simple_query(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
                    .into_iter()
                    .filter_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => {
                            Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                        }
                        _ => None,
                    })
                    .collect()
            }
        }
    }

    /// The first column of every row, NULL as "".
    pub async fn column(&self, sql: &str) -> Vec<String> {
        self.rows(sql)
            .await
            .into_iter()
            .map(|mut r| r.swap_remove(0).unwrap_or_default())
            .collect()
    }

    /// A single number (`SELECT COUNT(*) …`).
    pub async fn count(&self, sql: &str) -> i64 {
        let c = self.column(sql).await;
        c.first()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{sql}: not a count: {c:?}"))
    }

    /// The request with its attempts, as the audit API shows it.
    pub async fn request(&self, id: &str) -> RequestRow {
        let ledger = Ledger::open_reader(&self.target()).await.unwrap();
        ledger.request(id).await.unwrap().unwrap()
    }

    /// The newest request.
    pub async fn last_request(&self) -> RequestRow {
        let id = self
            .column("SELECT id FROM requests ORDER BY ledger_seq DESC LIMIT 1")
            .await;
        self.request(&id[0]).await
    }

    /// A time column as UTC text, `YYYY-MM-DDTHH:MM:SS…`, on either engine.
    pub fn utc(&self, column: &str) -> String {
        match self {
            Db::Sqlite(_) => column.to_string(),
            Db::Postgres(_) => {
                format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')")
            }
        }
    }
}

/// `Db::rows` on an SQLite file, without a runtime.
pub fn sqlite_rows(path: &Path, sql: &str) -> Vec<Row> {
    use rusqlite::types::ValueRef;
    let conn = purser::ledger::read::open_reader(path).unwrap();
    let mut st = conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let n = st.column_count();
    st.query_map([], |r| {
        (0..n)
            .map(|i| {
                Ok(match r.get_ref(i)? {
                    ValueRef::Null => None,
                    ValueRef::Integer(v) => Some(v.to_string()),
                    ValueRef::Real(v) => Some(v.to_string()),
                    ValueRef::Text(t) | ValueRef::Blob(t) => {
                        Some(String::from_utf8_lossy(t).into_owned())
                    }
                })
            })
            .collect()
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}
