//! purser: an LLM gateway whose heart is a budget-enforcing policy engine.
//!
//! A request flows through the modules in this order:
//!
//! ```text
//! policy (config → plan) → selection → failure (classify) → decide → breaker
//!        → ledger → gateway (the loop) → http (response)
//! ```
//!
//! `replay` runs recorded traffic through another plan (no calls), for policy reviews.
//!
//! `audit` is the read side: validated audit filters over the ledger, for HTTP and CLI.
//!
//! `money`, `ids` and `clock` are the shared vocabulary; `cli` wires commands to the rest.

pub mod audit;
pub mod breaker;
pub mod cli;
pub mod clock;
pub mod decide;
pub mod failure;
pub mod gateway;
pub mod http;
pub mod ids;
pub mod ingress;
pub mod ledger;
pub mod metrics;
pub mod money;
pub mod policy;
pub mod pricing;
pub mod reload;
pub mod replay;
pub mod selection;
pub mod sim;
pub mod upstream;
