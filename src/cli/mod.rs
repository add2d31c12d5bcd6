//! Command-line interface: argument parsing, wiring and printing only.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod check;
pub mod classify;
mod explain;

/// Exit codes (DESIGN 8): 0 ok, 1 invalid input, 2 usage; `diff --fail-on widen` uses 3.
pub const EXIT_INVALID: u8 = 1;

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
    },
    /// Classify upstream answers: JSON Lines {"api"?, "status", "headers", "body"} on stdin.
    Classify {
        #[arg(long, value_enum)]
        api: Option<ApiArg>,
    },
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

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Check { dir } => check::check(&dir),
        Command::Plan { dir, format } => check::plan(&dir, format),
        Command::Explain {
            dir,
            policy,
            model,
            input_bytes,
            messages,
            max_tokens,
        } => explain::explain(&dir, &policy, &model, input_bytes, messages, max_tokens),
        Command::Classify { api } => classify::classify(api.map(Into::into)),
    }
}
