//! Hot reload: recompile the policy directory and swap the plan in one step, or keep
//! the running plan when the new set does not compile. Triggered by SIGHUP and by
//! `POST /admin/v1/reload`; knows nothing of either.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::gateway::Engine;
use crate::policy::{self, Diagnostics};

/// How long a reload that adds budgets waits for the admissions under way to reach the
/// ledger. New admissions queue behind the waiting reload, so this bounds how long a
/// stalled ledger can hold them there; a healthy one answers in milliseconds.
const PAUSE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Reloader {
    engine: Arc<Engine>,
    dir: PathBuf,
    /// One compile-and-swap at a time: two racing reloads must not swap out of order.
    busy: tokio::sync::Mutex<()>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Reloaded {
    pub plan_id: String,
    pub previous_plan_id: String,
    pub changed: bool,
    pub warnings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the policy set in {dir} does not compile; plan {kept} keeps serving\n{diagnostics}")]
    DoesNotCompile {
        dir: String,
        kept: String,
        diagnostics: Diagnostics,
    },
    /// Every price, ceiling and budget of a plan is in its currency, and the ledger's
    /// windows hold amounts in it: a new currency would add its amounts to the old
    /// ones. Changing it needs a fresh ledger (a restart on a new database).
    #[error(
        "the policy set in {dir} changes the currency from {from} to {to}; the ledger's budget windows and costs are in {from}, so a running gateway cannot switch: plan {kept} keeps serving (start a new ledger to change currency)"
    )]
    CurrencyChanged {
        dir: String,
        from: String,
        to: String,
        kept: String,
    },
    #[error("the reload did not complete: {0}")]
    Interrupted(String),
    /// Budgets added by the new set could not be started from the ledger.
    #[error(
        "the ledger could not prepare the budgets the new set adds ({detail}); plan {kept} keeps serving"
    )]
    Ledger { kept: String, detail: String },
}

impl Reloader {
    pub fn new(engine: Arc<Engine>, dir: PathBuf) -> Reloader {
        Reloader {
            engine,
            dir,
            busy: tokio::sync::Mutex::new(()),
        }
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    pub async fn reload(&self) -> Result<Reloaded, ReloadError> {
        let _one = self.busy.lock().await;
        let dir = self.dir.clone();
        let compiled = tokio::task::spawn_blocking(move || policy::compile_dir(&dir))
            .await
            .map_err(|e| ReloadError::Interrupted(e.to_string()))?;
        let plan = compiled.map_err(|diagnostics| ReloadError::DoesNotCompile {
            dir: self.dir.display().to_string(),
            kept: self.engine.plan().id().to_string(),
            diagnostics,
        })?;
        let running = self.engine.plan();
        if plan.currency() != running.currency() {
            return Err(ReloadError::CurrencyChanged {
                dir: self.dir.display().to_string(),
                from: running.currency().to_string(),
                to: plan.currency().to_string(),
                kept: running.id().to_string(),
            });
        }
        // A budget the running plan lacks is added (or added back): its window may be
        // a leftover from earlier in the period that missed the charges made while it
        // was absent, so what it has spent is counted again from the ledger. With
        // admissions paused: every one that read the old plan's budgets (holding
        // nothing in the window) is in the ledger before the count, and every later
        // one checks the new budgets against the counted window. When the count fails,
        // the running plan keeps serving.
        let added: Vec<_> = plan
            .policies()
            .flat_map(|p| p.budgets.iter().map(move |b| (p, b)))
            .filter(|(p, b)| {
                running
                    .policy(p.id.as_str())
                    .is_none_or(|old| !old.budgets.iter().any(|o| o.period == b.period))
            })
            .map(|(p, b)| (p.id.to_string(), b.period))
            .collect();
        // Nothing added, nothing to count: no pause (a stalled ledger then delays no
        // admission behind the reload).
        let paused = if added.is_empty() {
            None
        } else {
            let paused = self
                .engine
                .pause_admissions(PAUSE_PATIENCE)
                .await
                .ok_or_else(|| ReloadError::Ledger {
                    kept: running.id().to_string(),
                    detail: format!(
                        "the admissions under way did not reach the ledger within {} s",
                        PAUSE_PATIENCE.as_secs()
                    ),
                })?;
            self.engine
                .ledger
                .reseed_windows(added, self.engine.now())
                .await
                .map_err(|e| ReloadError::Ledger {
                    kept: running.id().to_string(),
                    detail: e.to_string(),
                })?;
            Some(paused)
        };
        let warnings = plan.warnings().iter().map(|w| w.to_string()).collect();
        let plan_id = plan.id().to_string();
        let previous = self.engine.replace_plan(plan);
        drop(paused);
        Ok(Reloaded {
            changed: previous.id() != plan_id,
            previous_plan_id: previous.id().to_string(),
            plan_id,
            warnings,
        })
    }
}
