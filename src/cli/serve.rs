use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use super::EXIT_INVALID;
use super::check::compile_or_report;
use crate::clock::SystemClock;
use crate::gateway::Engine;
use crate::http;
use crate::ledger::{Ledger, Options};

pub async fn serve(config: &Path, db: &Path, listen: SocketAddr) -> ExitCode {
    let Some(plan) = compile_or_report(config) else {
        return ExitCode::from(EXIT_INVALID);
    };
    let (ledger, recovered) = match Ledger::open(db, Options::default()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot open the ledger {}: {e}", db.display());
            return ExitCode::from(EXIT_INVALID);
        }
    };
    if recovered.attempts > 0 {
        tracing::warn!(
            attempts = recovered.attempts,
            requests = recovered.requests,
            "rows left in flight by a previous process are now interrupted / maybe_billed; settle them with `purser settle`"
        );
    }
    let plan_id = plan.id().to_string();
    let engine = Arc::new(Engine::new(plan, ledger, SystemClock::shared()));
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {listen}: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    tracing::info!(%listen, plan_id, db = %db.display(), "purser serving");
    let admin_token = std::env::var("PURSER_ADMIN_TOKEN")
        .ok()
        .and_then(|t| http::AdminToken::new(&t));
    if admin_token.is_none() {
        tracing::info!("audit and admin APIs are off: set PURSER_ADMIN_TOKEN to enable them");
    }
    let app = http::router(
        engine,
        http::Options {
            admin_token,
            ..http::Options::default()
        },
    );
    // SIGTERM / Ctrl-C: stop accepting, let in-flight requests finish (their ledger
    // rows complete), then exit.
    let res = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await;
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: server stopped: {e}");
            ExitCode::FAILURE
        }
    }
}

pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
