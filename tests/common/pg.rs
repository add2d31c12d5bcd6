//! PostgreSQL for the tests: `PURSER_TEST_POSTGRES` names a server (a URL); each test
//! gets a schema of its own on it, so tests never see each other's rows.
//!
//! Without the variable the PostgreSQL tests print why they are skipped and pass, so a
//! fresh clone with no PostgreSQL passes `cargo test`. With `CI=true` a missing
//! variable or an unreachable server fails them instead: CI must run them.

use std::sync::atomic::{AtomicU32, Ordering};

pub const VAR: &str = "PURSER_TEST_POSTGRES";

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skip (printing why) or, in CI, fail.
fn skip(test: &str, why: &str) -> Option<String> {
    assert!(
        !in_ci(),
        "{test}: CI=true but {why}: the PostgreSQL tests must run in CI"
    );
    eprintln!(
        "SKIPPED {test}: {why} (set {VAR}=postgres://postgres@127.0.0.1:5432/test to run it)"
    );
    None
}

/// A URL on a new, empty schema, or `None` when PostgreSQL tests are skipped.
pub async fn fresh_schema(test: &str) -> Option<String> {
    let Ok(base) = std::env::var(VAR) else {
        return skip(test, &format!("{VAR} is not set"));
    };
    let (client, conn) = match tokio_postgres::connect(&base, tokio_postgres::NoTls).await {
        Ok(c) => c,
        Err(e) => return skip(test, &format!("PostgreSQL at {VAR} cannot be reached: {e}")),
    };
    tokio::spawn(conn);
    sweep_old_schemas(&client).await;
    static N: AtomicU32 = AtomicU32::new(0);
    let schema = format!(
        "purser_t_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    Some(with_schema(&base, &schema))
}

/// Drop the schemas of test runs that ended over an hour ago (their names end in a
/// ULID, whose first ten characters are its time): the server outlives runs, and a
/// run that is still going is never older than that.
async fn sweep_old_schemas(client: &tokio_postgres::Client) {
    let cutoff = ulid::Ulid::from_datetime(
        std::time::SystemTime::now() - std::time::Duration::from_secs(3600),
    )
    .to_string()
    .to_lowercase();
    let Ok(rows) = client
        .query(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'purser\\_t\\_%' \
             AND right(nspname, 26) < $1",
            &[&cutoff],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let name: String = row.get(0);
        // Another run may be sweeping the same schema; either drop is enough.
        let _ = client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
            .await;
    }
}

/// `base` with its search path set to `schema` (every connection purser opens on the
/// URL then lives in that schema).
pub fn with_schema(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-c%20search_path%3D{schema}")
}

/// A plain connection to `url`, for a test's own checks.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}
