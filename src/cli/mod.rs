//! Command-line interface: argument parsing, wiring and printing only.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::ledger::Target;

mod audit;
mod check;
pub mod classify;
mod demo;
mod diff;
mod explain;
mod replay;
mod serve;

/// Exit codes (DESIGN 8): 0 ok, 1 invalid input, 2 usage; `diff --fail-on widen` uses 3.
pub const EXIT_INVALID: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser, Debug)]
#[command(name = "purser", version, about = "Budget-enforcing LLM gateway")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PlanFormat {
    Text,
    Json,
    Markdown,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate a policy directory; prints every error.
    Check {
        #[arg(default_value = "policies")]
        dir: PathBuf,
    },
    /// Print the compiled plan.
    Plan {
        #[arg(default_value = "policies")]
        dir: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: PlanFormat,
    },
    /// What changes for money, vendors and jurisdictions between two policy sets.
    Diff {
        /// OLD_DIR NEW_DIR; with --git, only the directory (its old side is read from REV).
        #[arg(required = true, num_args = 1..=2)]
        dirs: Vec<PathBuf>,
        /// Read the old side from this git revision of the same directory.
        #[arg(long)]
        git: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: DiffFormat,
        /// Exit 3 when any change widens (for a CI gate).
        #[arg(long, value_enum)]
        fail_on: Option<FailOn>,
        /// Append what NEW_DIR would have done to this ledger's traffic (`purser
        /// replay`): an SQLite file (a `purser backup` copy) or a postgres:// URL.
        #[arg(long)]
        replay: Option<Target>,
        /// With --replay: only requests received this long before now (30d, 12h).
        #[arg(long, requires = "replay")]
        since: Option<String>,
    },
    /// Run recorded traffic through a proposed policy set, with no call made: what it
    /// would have refused, sent elsewhere, and spent, and when its budgets run out.
    Replay {
        /// The ledger: an SQLite file (a `purser backup` copy), or a postgres:// URL.
        #[arg(long, env = "PURSER_DB", default_value = "purser.db")]
        db: Target,
        /// The proposed policy set.
        #[arg(long)]
        config: PathBuf,
        /// Only requests received this long before now: 30d, 12h, 90m.
        #[arg(long, conflicts_with = "from")]
        since: Option<String>,
        /// Only requests received at or after (RFC 3339, or a date).
        #[arg(long)]
        from: Option<String>,
        /// Only requests received before (RFC 3339, or a date).
        #[arg(long)]
        to: Option<String>,
        /// Only requests recorded under this policy.
        #[arg(long)]
        policy: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: DiffFormat,
    },
    /// Show, step by step, the decision a request would get, without calling anyone.
    Explain {
        dir: PathBuf,
        #[arg(long)]
        policy: String,
        #[arg(long)]
        model: String,
        /// UTF-8 bytes of all text the request sends.
        #[arg(long, default_value_t = 1000)]
        input_bytes: u64,
        /// Messages in the request (each adds framing tokens to the input bound).
        #[arg(long, default_value_t = 1)]
        messages: u64,
        /// The request's max_tokens; the policy's max_output_tokens when absent.
        #[arg(long)]
        max_tokens: Option<u64>,
        /// The request's `n` (choices asked for).
        #[arg(long, default_value_t = 1)]
        n: u64,
        /// A top-level request field the request sends (repeatable), e.g.
        /// `--field prediction`: shows whether its cost can be bounded.
        #[arg(long = "field")]
        fields: Vec<String>,
        /// A media part the request carries (repeatable): image, audio, video or file.
        /// Counted at the bound its model entry declares (`media_tokens`).
        #[arg(long = "part", value_parser = media_kind)]
        parts: Vec<crate::policy::plan::MediaKind>,
        /// A real request body (JSON), or a recorded request (`{"path", "headers",
        /// "body"}`, as in tests/fixtures/agents/): its bounds are computed as the
        /// gateway computes them, over the body as each destination receives it, and
        /// its max_tokens, n and fields are read from it (the flags above are ignored).
        #[arg(long)]
        body: Option<PathBuf>,
        /// The API the body is for when the file does not say (a recorded request's
        /// path does): chat or messages.
        #[arg(long, value_parser = ingress_name)]
        ingress: Option<crate::ingress::Ingress>,
    },
    /// Run the gateway.
    Serve {
        #[arg(long, default_value = "policies")]
        config: PathBuf,
        /// The ledger: an SQLite file, or a postgres:// URL shared by several replicas.
        #[arg(long, env = "PURSER_DB", default_value = "purser.db")]
        db: Target,
        #[command(flatten)]
        replica: ReplicaArgs,
        /// SQLite ledger: `full` fsyncs every commit a call waits on, so an attempt's
        /// row is on disk before its call is sent, even across a power loss (a call's
        /// ending is fsynced within milliseconds); `normal` skips those fsyncs and survives a
        /// process crash only (the last commits may be lost on power loss). PostgreSQL
        /// commits as its server is configured; this does not apply.
        #[arg(long, env = "PURSER_DURABILITY", value_enum, default_value = "full")]
        durability: Durability,
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        #[arg(long, value_enum, default_value = "pretty")]
        log_format: LogFormat,
        /// After SIGTERM, how long in-flight requests may take to finish before exit
        /// (rows still in flight then are recovered as interrupted at the next start).
        #[arg(long, default_value_t = 30)]
        shutdown_grace_s: u64,
        /// Request-handling threads (0: one per core but one; single-threaded on two cores).
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Chat requests handled at once; beyond it clients get 503 `overloaded` with
        /// Retry-After.
        #[arg(long, default_value_t = crate::http::DEFAULT_MAX_IN_FLIGHT)]
        max_in_flight: usize,
        /// Serve /metrics on this address only (not on --listen). PURSER_METRICS_TOKEN,
        /// when set, puts /metrics behind `Authorization: Bearer <token>` wherever it is.
        #[arg(long)]
        metrics_listen: Option<std::net::SocketAddr>,
    },
    /// Run the whole mechanism offline against simulated providers and print what happened.
    Demo {
        /// Exit after the scenarios instead of serving until Ctrl-C.
        #[arg(long)]
        once: bool,
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Ledger file (default: a temporary one).
        #[arg(long)]
        db: Option<PathBuf>,
    },
    /// Settle an interrupted request: record what its interrupted attempt really cost.
    Settle {
        /// The request id (x-purser-request-id; `purser audit requests --outcome interrupted` lists them).
        request_id: String,
        /// What the vendor billed for the interrupted attempt, from its usage records (0 if nothing).
        #[arg(long)]
        cost: String,
        #[arg(long, env = "PURSER_DB", default_value = "purser.db")]
        db: Target,
    },
    /// Copy the ledger consistently while the gateway runs (SQLite online backup; for
    /// PostgreSQL use pg_dump).
    Backup {
        #[arg(long, env = "PURSER_DB", default_value = "purser.db")]
        db: Target,
        /// The new file to write (never overwritten).
        dest: PathBuf,
    },
    /// Read the ledger as the audit API does: requests, spend or budgets.
    Audit(AuditArgs),
    /// Apply the ledger's schema migrations and exit (`serve` applies them too).
    Migrate {
        #[arg(long, env = "PURSER_DB", default_value = "purser.db")]
        db: Target,
    },
    /// Classify upstream answers: JSON Lines {"api"?, "status", "headers", "body"} on stdin.
    Classify {
        #[arg(long, value_enum)]
        api: Option<ApiArg>,
        /// Also print, per line, the signal that decided the class.
        #[arg(long)]
        explain: bool,
    },
}

/// `purser serve --durability`: how far a commit of the SQLite ledger is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Durability {
    /// Each commit a call waits on is fsynced: no call without its row, even across
    /// a power loss (the default).
    Full,
    /// No fsync per commit: survives a process crash, not a power loss.
    Normal,
}

impl From<Durability> for crate::ledger::Sync {
    fn from(d: Durability) -> Self {
        match d {
            Durability::Full => crate::ledger::Sync::Full,
            Durability::Normal => crate::ledger::Sync::Normal,
        }
    }
}

/// Who this replica is on a shared (PostgreSQL) ledger.
#[derive(clap::Args, Debug)]
pub struct ReplicaArgs {
    /// This replica's id: its in-flight rows carry it, so it recovers them after a
    /// restart. Stable across restarts, unique among live replicas (default: host name).
    #[arg(long, env = "PURSER_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// How long this replica's lease lasts without renewal; a crashed replica's rows
    /// are recovered by another once it expires.
    #[arg(long, env = "PURSER_REPLICA_LEASE_MS", default_value_t = 15_000)]
    pub replica_lease_ms: u64,
}

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    #[arg(value_enum)]
    pub what: AuditWhat,
    #[arg(long, env = "PURSER_DB", default_value = "purser.db")]
    pub db: Target,
    #[command(flatten)]
    pub filters: AuditFilters,
    /// requests: page size (1-1000, default 100).
    #[arg(long)]
    pub limit: Option<u32>,
    /// requests: the cursor printed after the previous page.
    #[arg(long)]
    pub cursor: Option<String>,
    /// spend: provider | policy | client | model | day (default provider).
    #[arg(long)]
    pub group_by: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: AuditFormat,
    /// focus: the currency amounts are in (the policy set's `currency`).
    #[arg(long, default_value = "USD")]
    pub currency: String,
}

/// The audit API's filters, validated by the same parser.
#[derive(clap::Args, Debug)]
pub struct AuditFilters {
    /// RFC 3339, inclusive.
    #[arg(long)]
    pub since: Option<String>,
    /// RFC 3339, exclusive.
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long)]
    pub provider: Option<String>,
    #[arg(long)]
    pub policy: Option<String>,
    #[arg(long)]
    pub client: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    /// `success` or a failure class.
    #[arg(long)]
    pub class: Option<String>,
    /// in_flight | served | refused | failed | interrupted.
    #[arg(long)]
    pub outcome: Option<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AuditWhat {
    Requests,
    Spend,
    Budgets,
    /// Billed and maybe-billed attempts as FOCUS 1.2 CSV (always CSV).
    Focus,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AuditFormat {
    Table,
    Json,
    Csv,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DiffFormat {
    Text,
    Markdown,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FailOn {
    Widen,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ApiArg {
    Openai,
    Anthropic,
    Gemini,
}

impl From<ApiArg> for crate::policy::plan::Api {
    fn from(a: ApiArg) -> Self {
        match a {
            ApiArg::Openai => crate::policy::plan::Api::Openai,
            ApiArg::Anthropic => crate::policy::plan::Api::Anthropic,
            ApiArg::Gemini => crate::policy::plan::Api::Gemini,
        }
    }
}

fn ingress_name(s: &str) -> Result<crate::ingress::Ingress, String> {
    crate::ingress::Ingress::parse(s)
        .ok_or_else(|| format!("`{s}`: expected chat, messages or responses"))
}

fn media_kind(s: &str) -> Result<crate::policy::plan::MediaKind, String> {
    crate::policy::plan::MediaKind::ALL
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| format!("`{s}`: expected image, audio, video or file"))
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Check { dir } => check::check(&dir),
        Command::Plan { dir, format } => check::plan(&dir, format),
        Command::Diff {
            dirs,
            git,
            format,
            fail_on,
            replay,
            since,
        } => diff::diff(
            &dirs,
            git.as_deref(),
            format,
            fail_on.is_some(),
            replay.map(|db| (db, since)),
        ),
        Command::Replay {
            db,
            config,
            since,
            from,
            to,
            policy,
            format,
        } => runtime(replay::run(
            &db,
            &config,
            &replay::When { since, from, to },
            policy,
            format,
        )),
        Command::Explain {
            dir,
            policy,
            model,
            input_bytes,
            messages,
            max_tokens,
            n,
            fields,
            parts,
            body,
            ingress,
        } => match body {
            Some(file) => explain::explain_body(&dir, &policy, &model, &file, ingress),
            None => explain::explain(
                &dir,
                &policy,
                &model,
                &explain::Imagined {
                    input_bytes,
                    messages,
                    max_tokens,
                    choices: n,
                    fields,
                    reasons: Vec::new(),
                    parts,
                    body: None,
                },
            ),
        },
        Command::Audit(args) => runtime(audit::audit(&args)),
        Command::Migrate { db } => runtime(migrate(db)),
        Command::Backup { db, dest } => match crate::ledger::backup(&db, &dest) {
            Ok(()) => {
                println!("backed up {db} to {}", dest.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(EXIT_INVALID)
            }
        },
        Command::Settle {
            request_id,
            cost,
            db,
        } => runtime(audit::settle(&db, &request_id, &cost)),
        Command::Classify { api, explain } => classify::classify(api.map(Into::into), explain),
        Command::Serve {
            config,
            db,
            replica,
            durability,
            listen,
            log_format,
            shutdown_grace_s,
            workers,
            max_in_flight,
            metrics_listen,
        } => {
            init_logging(log_format);
            serve_runtime(
                workers,
                serve::serve(serve::Listen {
                    config: &config,
                    db: &db,
                    ledger: serve::ledger_options(&replica, durability),
                    listen,
                    grace: std::time::Duration::from_secs(shutdown_grace_s),
                    max_in_flight,
                    metrics_listen,
                }),
            )
        }
        Command::Demo { once, listen, db } => runtime(demo::demo(once, listen, db)),
    }
}

async fn migrate(db: Target) -> ExitCode {
    match crate::ledger::migrate_at(&db).await {
        Ok(version) => {
            println!("the ledger {db} is at schema version {version}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// Run `fut` to its value on a fresh runtime (a synchronous command's one async step).
fn runtime_value<T>(
    fut: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?
        .block_on(fut)
}

fn runtime(fut: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The gateway's runtime: a worker per core but one, leaving a core to the kernel's
/// network work and the upstreams beside it. On one or two cores that is a
/// single-threaded runtime, which also saves a cross-thread wake-up at each step of a
/// request (measured on 2 cores: about 20% less CPU per request than two workers, for
/// about 15% less throughput at c=64). `workers` overrides (0 = this choice).
fn serve_runtime(workers: usize, fut: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let n = if workers > 0 {
        workers
    } else {
        cores.saturating_sub(1).max(1)
    };
    let built = if n == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()
    };
    match built {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
