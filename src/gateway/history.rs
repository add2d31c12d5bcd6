//! A Responses turn that continues a stored conversation (`previous_response_id`). The
//! vendor bills the earlier turns as input the body does not carry, so where money is
//! held to a proof (a hard ceiling, a budget) such a turn is admitted only when the
//! earlier turn is in this policy's own ledger: its recorded tokens bound that history,
//! and only the destination that stored it can continue it.
//!
//! Why one lookup is enough for a whole chain: the vendor's input count of turn N-1
//! already includes everything turn N-1 continued from, so the history turn N is billed
//! for is at most turn N-1's input tokens, its output tokens, and the framing of its
//! output items when they are read back as input (`upstream::bound`'s per-message
//! overhead, per item). The counts are the same vendor's for the same model, which is
//! why the turn may go only to the destination that served N-1.

use serde_json::Value;

use super::GatewayError;
use super::request::Parsed;
use crate::ingress::Ingress;
use crate::ledger::{Ledger, StoredTurn};
use crate::policy::plan::{Destination, Policy};
use crate::selection::Unbounded;
use crate::upstream::bound::{Per, overhead};

const FIELD: &str = "previous_response_id";

/// The stored history a turn continues, as the ledger bounds it.
#[derive(Debug, Clone)]
pub struct History {
    response_id: String,
    turn: StoredTurn,
}

impl History {
    /// The most input tokens the continued history adds at `dest`, or why `dest`
    /// cannot continue it (the response is stored elsewhere, or its usage is unknown).
    pub fn tokens_at(&self, dest: &Destination) -> Result<u64, Unbounded> {
        let t = &self.turn;
        if dest.provider.as_str() != t.provider || dest.upstream_model != t.upstream_model {
            return Err(Unbounded {
                param: FIELD.into(),
                what: format!(
                    "response `{}` is stored at provider `{}` (model `{}`), and only that destination can continue it within a bound",
                    self.response_id, t.provider, t.upstream_model
                ),
            });
        }
        let (Some(input), Some(output)) = (t.input_tokens, t.output_tokens) else {
            return Err(Unbounded {
                param: FIELD.into(),
                what: format!(
                    "the vendor did not report the usage of response `{}` (request `{}`), so the history it adds cannot be bounded",
                    self.response_id, t.request_id
                ),
            });
        };
        let framing = t
            .output_items
            .saturating_mul(overhead(dest.api, Per::Message));
        Ok(input.saturating_add(output).saturating_add(framing))
    }
}

/// The history a Responses body continues, looked up in the ledger, with
/// `previous_response_id` no longer counted as unbounded once found. Under a policy
/// that needs a proof, an id the ledger does not hold for this policy is refused here,
/// naming the field; under one that does not, it stays a named risk.
pub async fn resolve(
    ledger: &Ledger,
    policy: &Policy,
    ingress: Ingress,
    body: &Value,
    parsed: &mut Parsed,
) -> Result<Option<History>, GatewayError> {
    let id = match (ingress, body.get(FIELD)) {
        (Ingress::Responses, Some(Value::String(id))) => id,
        (Ingress::Responses, None | Some(Value::Null)) => return Ok(None),
        (Ingress::Responses, Some(_)) => {
            return Err(GatewayError::invalid(
                format!("`{FIELD}` must be a string"),
                Some(FIELD),
            ));
        }
        (Ingress::Chat | Ingress::Messages, _) => return Ok(None),
    };
    let turn = ledger
        .stored_turn(id, policy.id.as_str())
        .await
        .map_err(|e| GatewayError::ledger(super::LedgerStage::BeforeCall, e))?;
    let Some(turn) = turn else {
        if policy.needs_proof() {
            return Err(GatewayError::invalid(
                format!(
                    "`{FIELD}` `{}` is not a response purser recorded for policy `{}`: the conversation before it is billed as input the gateway cannot see, so {} admits a continued conversation only when its earlier turns went through purser, whose ledger bounds them (send the whole conversation as `input` instead)",
                    shorten(id),
                    policy.id,
                    match policy.ceiling.mode {
                        crate::policy::plan::Mode::Hard => "a hard ceiling",
                        crate::policy::plan::Mode::Soft => "a policy with a budget",
                    }
                ),
                Some(FIELD),
            ));
        }
        return Ok(None);
    };
    parsed.unbounded.retain(|(f, _)| f != FIELD);
    Ok(Some(History {
        response_id: id.clone(),
        turn,
    }))
}

/// An id as the error quotes it: a client's 1 MB "id" is not echoed whole.
fn shorten(id: &str) -> String {
    if id.len() <= 96 {
        return id.to_string();
    }
    let mut cut = 96;
    while !id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &id[..cut])
}
