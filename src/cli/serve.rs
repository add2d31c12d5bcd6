use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::EXIT_INVALID;

const EXIT_USAGE: u8 = 2;
use super::check::compile_or_report;
use crate::clock::SystemClock;
use crate::gateway::Engine;
use crate::http;
use crate::ledger::{Ledger, Options, Target};
use crate::reload::Reloader;

/// The ledger's options from the replica flags (they matter on a shared ledger only)
/// and the durability (on SQLite only).
pub fn ledger_options(r: &super::ReplicaArgs, durability: super::Durability) -> Options {
    Options {
        sync: durability.into(),
        replica: r.replica_id.clone(),
        lease: Duration::from_millis(r.replica_lease_ms.max(100)),
        ..Options::default()
    }
}

/// Where `purser serve` reads and listens, and its limits.
pub struct Listen<'a> {
    pub config: &'a Path,
    pub db: &'a Target,
    /// The ledger's options (replica id and lease on PostgreSQL).
    pub ledger: Options,
    pub listen: SocketAddr,
    pub grace: Duration,
    pub max_in_flight: usize,
    /// `/metrics` on its own address instead of `listen`.
    pub metrics_listen: Option<SocketAddr>,
}

pub async fn serve(args: Listen<'_>) -> ExitCode {
    let Listen {
        config,
        db,
        ledger: opts,
        listen,
        grace,
        max_in_flight,
        metrics_listen,
    } = args;
    if max_in_flight == 0 {
        eprintln!("error: --max-in-flight must be at least 1 (0 would refuse every request)");
        return ExitCode::from(EXIT_USAGE);
    }
    let opts_sync = opts.sync;
    let Some(plan) = compile_or_report(config) else {
        return ExitCode::from(EXIT_INVALID);
    };
    let (ledger, recovered) = match Ledger::open_at(db, opts).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot open the ledger {db}: {e}");
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
    let engine = match Engine::new(plan, ledger, SystemClock::shared()) {
        Ok(e) => Arc::new(e),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The queue of connections waiting to be accepted holds as many as may be served at
    // once: a burst that size is queued, not dropped. At least 1,024, so that clients
    // beyond a low in-flight limit get their 503 `overloaded`, not a dropped SYN.
    let listener = match http::listener(listen, max_in_flight.max(1024)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {listen}: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let durability = match db {
        Target::Sqlite(_) => match opts_sync {
            crate::ledger::Sync::Full => "full",
            crate::ledger::Sync::Normal => "normal",
        },
        Target::Postgres(_) => "postgres",
    };
    tracing::info!(%listen, plan_id, db = %db, durability, max_in_flight, "purser serving");
    let admin_token = std::env::var("PURSER_ADMIN_TOKEN")
        .ok()
        .and_then(|t| http::AdminToken::new(&t));
    if admin_token.is_none() {
        tracing::info!("audit and admin APIs are off: set PURSER_ADMIN_TOKEN to enable them");
    }
    // Same constant-time bearer check as the admin token.
    let metrics_token = std::env::var("PURSER_METRICS_TOKEN")
        .ok()
        .and_then(|t| http::AdminToken::new(&t));
    let metrics = match (&metrics_listen, &metrics_token) {
        (Some(_), _) => http::MetricsAccess::Elsewhere,
        (None, Some(t)) => http::MetricsAccess::Token(t.clone()),
        (None, None) => {
            tracing::info!(
                "/metrics (every policy's remaining budget) is open on the main listener: set PURSER_METRICS_TOKEN or --metrics-listen to restrict it"
            );
            http::MetricsAccess::Open
        }
    };
    let metrics_server = match metrics_listen {
        None => None,
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!(%addr, token = metrics_token.is_some(), "metrics on their own address");
                Some((l, http::metrics_router(engine.clone(), metrics_token)))
            }
            Err(e) => {
                eprintln!("error: cannot listen on {addr} for metrics: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
        },
    };
    let reloader = Arc::new(Reloader::new(engine.clone(), config.to_path_buf()));
    tokio::spawn(reload_on_sighup(reloader.clone()));
    let requests = engine.clone();
    let app = http::router(
        engine,
        http::Options {
            admin_token,
            reloader: Some(reloader),
            max_in_flight,
            metrics,
            ..http::Options::default()
        },
    );
    // SIGTERM / Ctrl-C: stop accepting, let in-flight requests finish (their ledger
    // rows complete), then exit; a stream that outlives the grace period is cut and its
    // row is recovered as interrupted at the next start.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: no new connections; finishing requests in flight");
        let _ = stop.send(true);
    });
    let signalled = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    if let Some((l, app)) = metrics_server {
        let stop = signalled(stopped.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(l, app.into_make_service())
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::error!(error = %e, "the metrics listener stopped");
            }
        });
    }
    // `into_make_service`: each connection shares the router. Served as a `Router`,
    // axum rebuilds the route table for every connection (`Router::with_state`) and the
    // connection holds it for its life: 10.8 MB of heap at 1,024 connections
    // (heaptrack), 14 MB of PSS.
    let server = axum::serve(listener, app.into_make_service())
        .with_graceful_shutdown(signalled(stopped.clone()));
    // Requests run detached from their connections (a client that hung up does not
    // cut a billed call): once the server has closed them all, wait for those too.
    let server = async move {
        let res = server.await;
        requests.drained().await;
        res
    };
    let deadline = async {
        signalled(stopped).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        res = server => match res {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: server stopped: {e}");
                ExitCode::FAILURE
            }
        },
        () = deadline => {
            tracing::warn!(grace_s = grace.as_secs(), "requests still in flight after the grace period; their rows are recovered at the next start");
            ExitCode::SUCCESS
        }
    }
}

/// SIGHUP recompiles the policy directory; a set that does not compile is logged with
/// its errors and the running plan keeps serving.
async fn reload_on_sighup(reloader: Arc<Reloader>) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("cannot listen for SIGHUP; reload with POST /admin/v1/reload");
            return;
        };
        while hup.recv().await.is_some() {
            match reloader.reload().await {
                Ok(r) => tracing::info!(
                    plan_id = %r.plan_id,
                    previous = %r.previous_plan_id,
                    changed = r.changed,
                    "SIGHUP: plan reloaded"
                ),
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: reload refused; the running plan keeps serving")
                }
            }
        }
    }
    #[cfg(not(unix))]
    let _ = reloader;
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
