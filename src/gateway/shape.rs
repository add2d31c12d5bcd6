//! A request's shape as the ledger records it at admission (`ledger::Shape`): what
//! selection and the ceiling proof read from it, so `purser replay` can run it through
//! another plan without its body. Read from the parsed request and the body once;
//! nothing here decides anything.

use serde_json::Value;

use super::ingress::Ingress;
use super::request::Parsed;
use crate::ledger::Shape;
use crate::policy::plan::Api;
use crate::upstream::bound;

/// The shape of `parsed` (its body `body`, come in by `ingress`): `input` and
/// `output_bound` are what selection proved the ceiling with (`None` where it proved
/// nothing).
pub(crate) fn of(
    parsed: &Parsed,
    body: &Value,
    ingress: Ingress,
    input: Option<u64>,
    output_bound: Option<u64>,
) -> Shape {
    Shape {
        input_tokens: input,
        requested_output: parsed.max_tokens,
        output_bound,
        choices: parsed.choices.max(1),
        stream: parsed.stream,
        tools: has_tools(ingress, body),
        media: has_media(ingress, body),
        unbounded: !parsed.unbounded.is_empty(),
    }
}

fn non_empty(v: Option<&Value>) -> bool {
    v.and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

fn has_tools(ingress: Ingress, body: &Value) -> bool {
    let top = non_empty(body.get("tools")) || non_empty(body.get("functions"));
    match ingress {
        Ingress::Chat | Ingress::Messages => top,
        // Tools may sit inside input items too (`bound::input_tokens` counts them).
        Ingress::Responses => {
            top || body
                .get("input")
                .and_then(Value::as_array)
                .is_some_and(|items| items.iter().any(|i| non_empty(i.get("tools"))))
        }
    }
}

fn has_media(ingress: Ingress, body: &Value) -> bool {
    match ingress {
        // The kind a part is billed as depends on the API; whether it is media does not.
        Ingress::Chat => !bound::media_parts(Api::Openai, body).is_empty(),
        Ingress::Messages => !bound::native_media_parts(body).is_empty(),
        Ingress::Responses => !bound::responses_media_parts(body).is_empty(),
    }
}
