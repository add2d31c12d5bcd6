//! What a policy change does to money and data paths: two compiled plans compared
//! per policy and model, each change tagged `widens` (more money, or more places data
//! may go) or `narrows`. Comparing plans rather than text makes reformatting, comments
//! and file moves invisible.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde::Serialize;

use super::plan::{Destination, Mode, OnExceed, Plan, Policy};
use crate::money::Money;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tag {
    /// Listed first: what a reviewer must look at.
    Widens,
    Narrows,
}

impl Tag {
    pub fn as_str(self) -> &'static str {
        match self {
            Tag::Widens => "widens",
            Tag::Narrows => "narrows",
        }
    }

    fn by(widens: bool) -> Tag {
        if widens { Tag::Widens } else { Tag::Narrows }
    }
}

/// One change, in words a reviewer reads without the YAML.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Change {
    pub tag: Tag,
    pub policy: String,
    /// The model the change applies to; `None` for policy-wide changes.
    pub model: Option<String>,
    /// What changed: `ceiling`, `mode`, `budget day`, `vendor`, `alternate`, …
    pub what: String,
    pub before: String,
    pub after: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanDiff {
    pub old_plan: String,
    pub new_plan: String,
    pub currency: String,
    /// Widening changes first, then narrowing; stable order inside each.
    pub changes: Vec<Change>,
}

impl PlanDiff {
    pub fn widens(&self) -> usize {
        self.changes.iter().filter(|c| c.tag == Tag::Widens).count()
    }

    pub fn narrows(&self) -> usize {
        self.changes.len() - self.widens()
    }
}

const NONE: &str = "(none)";

struct Out<'a> {
    policy: &'a str,
    /// Currencies of the old and new plan: amounts are shown in their minor units.
    old_currency: &'a str,
    new_currency: &'a str,
    changes: Vec<Change>,
}

impl Out<'_> {
    fn push(
        &mut self,
        tag: Tag,
        model: Option<&str>,
        what: &str,
        before: impl ToString,
        after: impl ToString,
    ) {
        self.changes.push(Change {
            tag,
            policy: self.policy.to_string(),
            model: model.map(str::to_string),
            what: what.to_string(),
            before: before.to_string(),
            after: after.to_string(),
        });
    }

    /// Added members widen and removed ones narrow (or the reverse when `added_narrows`).
    fn sets<T: Ord + Clone + ToString>(
        &mut self,
        model: Option<&str>,
        what: &str,
        old: &BTreeSet<T>,
        new: &BTreeSet<T>,
        added_narrows: bool,
    ) {
        for added in new.difference(old) {
            self.push(
                Tag::by(!added_narrows),
                model,
                what,
                NONE,
                added.to_string(),
            );
        }
        for removed in old.difference(new) {
            self.push(
                Tag::by(added_narrows),
                model,
                what,
                removed.to_string(),
                NONE,
            );
        }
    }

    /// A price as configured: a *lowered* price widens, because every ceiling and budget
    /// is proved with it, so the same limits then admit more real spend (a price of 0
    /// turns them off). A rate added where the table had none is a price lowered from the
    /// stand-in it replaces, so it widens too; a rate removed narrows.
    fn price(&mut self, model: Option<&str>, what: &str, old: Option<Money>, new: Option<Money>) {
        let shown = |m: Option<Money>, cur: &str| {
            m.map_or_else(
                || "(not listed)".to_string(),
                |m| m.for_people(cur).to_string(),
            )
        };
        let widens = match (old, new) {
            (Some(o), Some(n)) if o == n => return,
            (None, None) => return,
            (Some(o), Some(n)) => n < o,
            (None, Some(_)) => true,
            (Some(_), None) => false,
        };
        let (before, after) = (shown(old, self.old_currency), shown(new, self.new_currency));
        self.push(Tag::by(widens), model, what, before, after);
    }

    /// A raised amount widens.
    fn amount(&mut self, model: Option<&str>, what: &str, old: Money, new: Money) {
        if old != new {
            let (before, after) = (self.shown_before(old), self.shown_after(new));
            self.push(Tag::by(new > old), model, what, before, after);
        }
    }

    fn shown_before(&self, m: Money) -> String {
        m.for_people(self.old_currency).to_string()
    }

    fn shown_after(&self, m: Money) -> String {
        m.for_people(self.new_currency).to_string()
    }
}

pub fn diff(old: &Plan, new: &Plan) -> PlanDiff {
    let mut changes = Vec::new();
    if old.currency() != new.currency() {
        // Every amount changes meaning: a reviewer must re-read them all.
        changes.push(Change {
            tag: Tag::Widens,
            policy: "*".into(),
            model: None,
            what: "currency".into(),
            before: old.currency().into(),
            after: new.currency().into(),
        });
    }
    let names: BTreeSet<&str> = old
        .policies()
        .chain(new.policies())
        .map(|p| p.id.as_str())
        .collect();
    for name in names {
        let mut out = Out {
            policy: name,
            old_currency: old.currency(),
            new_currency: new.currency(),
            changes: vec![],
        };
        match (old.policy(name), new.policy(name)) {
            (None, Some(p)) => {
                out.push(
                    Tag::Widens,
                    None,
                    "policy",
                    NONE,
                    summary(p, new.currency()),
                );
            }
            (Some(p), None) => {
                out.push(
                    Tag::Narrows,
                    None,
                    "policy",
                    summary(p, old.currency()),
                    NONE,
                );
            }
            (Some(a), Some(b)) => policy(&mut out, old, a, new, b),
            (None, None) => {}
        }
        changes.extend(out.changes);
    }
    changes.sort();
    PlanDiff {
        old_plan: old.id().to_string(),
        new_plan: new.id().to_string(),
        currency: new.currency().to_string(),
        changes,
    }
}

fn summary(p: &Policy, currency: &str) -> String {
    format!(
        "{} {currency} per request ({}), models [{}], jurisdictions [{}], {} client(s)",
        p.ceiling.per_request.for_people(currency),
        p.ceiling.mode.as_str(),
        p.routes
            .keys()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        p.jurisdictions
            .iter()
            .map(|j| j.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        p.clients.len()
    )
}

fn policy(out: &mut Out<'_>, old_plan: &Plan, a: &Policy, new_plan: &Plan, b: &Policy) {
    out.amount(
        None,
        "ceiling per request",
        a.ceiling.per_request,
        b.ceiling.per_request,
    );
    if a.ceiling.mode != b.ceiling.mode {
        out.push(
            Tag::by(b.ceiling.mode == Mode::Soft),
            None,
            "mode",
            a.ceiling.mode.as_str(),
            b.ceiling.mode.as_str(),
        );
    }
    if a.ceiling.on_exceed != b.ceiling.on_exceed {
        let name = |o: OnExceed| match o {
            OnExceed::Reject => "reject",
            OnExceed::Clamp => "clamp",
        };
        // Clamping lets a request through that rejecting would have stopped.
        out.push(
            Tag::by(b.ceiling.on_exceed == OnExceed::Clamp),
            None,
            "on_exceed",
            name(a.ceiling.on_exceed),
            name(b.ceiling.on_exceed),
        );
    }
    if a.max_output_tokens != b.max_output_tokens {
        out.push(
            Tag::by(b.max_output_tokens > a.max_output_tokens),
            None,
            "max_output_tokens",
            a.max_output_tokens,
            b.max_output_tokens,
        );
    }
    let budgets = |p: &Policy| -> BTreeMap<&'static str, Money> {
        p.budgets
            .iter()
            .map(|b| (b.period.as_str(), b.limit))
            .collect()
    };
    let (ba, bb) = (budgets(a), budgets(b));
    for period in ba.keys().chain(bb.keys()).collect::<BTreeSet<_>>() {
        let what = format!("{period} budget");
        match (ba.get(period), bb.get(period)) {
            (Some(x), Some(y)) => out.amount(None, &what, *x, *y),
            // A cap removed is money no longer bounded.
            (Some(x), None) => {
                let x = out.shown_before(*x);
                out.push(Tag::Widens, None, &what, x, NONE)
            }
            (None, Some(y)) => {
                let y = out.shown_after(*y);
                out.push(Tag::Narrows, None, &what, NONE, y)
            }
            (None, None) => {}
        }
    }
    let juris = |p: &Policy| {
        p.jurisdictions
            .iter()
            .map(|j| j.to_string())
            .collect::<BTreeSet<_>>()
    };
    out.sets(None, "jurisdiction", &juris(a), &juris(b), false);
    let clients = |p: &Policy| {
        p.clients
            .iter()
            .map(|c| c.id.to_string())
            .collect::<BTreeSet<_>>()
    };
    out.sets(None, "client", &clients(a), &clients(b), false);
    for ca in &a.clients {
        if let Some(cb) = b.clients.iter().find(|c| c.id == ca.id)
            && cb.key_sha256 != ca.key_sha256
        {
            // A new key can spend; treat it as a new client.
            out.push(
                Tag::Widens,
                None,
                "client key",
                format!(
                    "{} ({}…)",
                    ca.id,
                    &ca.key_sha256[..8.min(ca.key_sha256.len())]
                ),
                format!(
                    "{} ({}…)",
                    cb.id,
                    &cb.key_sha256[..8.min(cb.key_sha256.len())]
                ),
            );
        }
    }
    let models = |p: &Policy| {
        p.routes
            .keys()
            .map(|m| m.to_string())
            .collect::<BTreeSet<_>>()
    };
    out.sets(None, "model", &models(a), &models(b), false);

    for (model, rb) in &b.routes {
        let Some(ra) = a.routes.get(model) else {
            continue;
        };
        let m = Some(model.as_str());
        let reach = |r: &super::plan::Route| -> BTreeMap<String, Destination> {
            r.pool
                .iter()
                .chain(&r.accounts)
                .chain(r.alternate.as_ref())
                .map(|d| (d.provider.to_string(), d.clone()))
                .collect()
        };
        let (da, db) = (reach(ra), reach(rb));
        let vendor = |d: &Destination| format!("{} ({})", d.provider, d.jurisdiction);
        for (id, d) in &db {
            match da.get(id) {
                None => out.push(Tag::Widens, m, "vendor", NONE, vendor(d)),
                Some(old) => destination(out, m, old_plan, old, new_plan, d),
            }
        }
        for (id, d) in &da {
            if !db.contains_key(id) {
                out.push(Tag::Narrows, m, "vendor", vendor(d), NONE);
            }
        }
        match (&ra.alternate, &rb.alternate) {
            (None, Some(y)) => out.push(Tag::Widens, m, "alternate", NONE, y.label()),
            (Some(x), None) => out.push(Tag::Narrows, m, "alternate", x.label(), NONE),
            (Some(x), Some(y)) if x.label() != y.label() => {
                out.push(Tag::Widens, m, "alternate", x.label(), y.label())
            }
            _ => {}
        }
    }
}

/// The same vendor reachable before and after: its prices and where it sends data.
fn destination(
    out: &mut Out<'_>,
    m: Option<&str>,
    old_plan: &Plan,
    a: &Destination,
    new_plan: &Plan,
    b: &Destination,
) {
    let at = |d: &Destination, what: &str| format!("{what} of {}", d.label());
    let rate = |p: &crate::money::PricePerMTok| Some(p.per_million());
    let prices = [
        (
            "input price per Mtok",
            rate(&a.input_per_mtok),
            rate(&b.input_per_mtok),
        ),
        (
            "output price per Mtok",
            rate(&a.output_per_mtok),
            rate(&b.output_per_mtok),
        ),
        (
            "cached input price per Mtok",
            a.cached_input_per_mtok.as_ref().and_then(rate),
            b.cached_input_per_mtok.as_ref().and_then(rate),
        ),
        (
            "cache write price per Mtok",
            a.cache_write_per_mtok.as_ref().and_then(rate),
            b.cache_write_per_mtok.as_ref().and_then(rate),
        ),
        (
            "1-hour cache write price per Mtok",
            a.terms.cache_write_1h_per_mtok.as_ref().and_then(rate),
            b.terms.cache_write_1h_per_mtok.as_ref().and_then(rate),
        ),
        (
            "audio input price per Mtok",
            a.terms.audio_input_per_mtok.as_ref().and_then(rate),
            b.terms.audio_input_per_mtok.as_ref().and_then(rate),
        ),
        // No fee listed is no fee: listing one narrows.
        ("fee per call", Some(a.call_fee()), Some(b.call_fee())),
    ];
    for (what, old, new) in prices {
        out.price(m, &at(b, what), old, new);
    }
    if a.jurisdiction != b.jurisdiction {
        out.push(
            Tag::Widens,
            m,
            &at(b, "jurisdiction"),
            &a.jurisdiction,
            &b.jurisdiction,
        );
    }
    let url = |p: &Plan, d: &Destination| {
        p.provider(&d.provider)
            .map(|p| p.base_url.clone())
            .unwrap_or_default()
    };
    let (ua, ub) = (url(old_plan, a), url(new_plan, b));
    if ua != ub {
        out.push(Tag::Widens, m, &at(b, "endpoint"), ua, ub);
    }
}

fn headline(d: &PlanDiff) -> String {
    if d.changes.is_empty() {
        return format!(
            "No change to money, vendors or jurisdictions (plan {} → {}).",
            d.old_plan, d.new_plan
        );
    }
    format!(
        "{} change(s) widen what may be spent or where data may go, {} narrow (plan {} → {}).",
        d.widens(),
        d.narrows(),
        d.old_plan,
        d.new_plan
    )
}

fn scope(c: &Change) -> String {
    match &c.model {
        Some(m) => format!("{} / {m}", c.policy),
        None => c.policy.clone(),
    }
}

pub fn text(d: &PlanDiff) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", headline(d));
    for tag in [Tag::Widens, Tag::Narrows] {
        let group: Vec<&Change> = d.changes.iter().filter(|c| c.tag == tag).collect();
        if group.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n{}:", tag.as_str().to_uppercase());
        for c in group {
            let _ = writeln!(s, "  {}: {}: {} → {}", scope(c), c.what, c.before, c.after);
        }
    }
    s
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

pub fn markdown(d: &PlanDiff) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### purser policy diff\n\n{}\n", headline(d));
    for (tag, title) in [
        (Tag::Widens, "Widening changes: review these"),
        (Tag::Narrows, "Narrowing changes"),
    ] {
        let group: Vec<&Change> = d.changes.iter().filter(|c| c.tag == tag).collect();
        if group.is_empty() {
            continue;
        }
        let _ = writeln!(s, "#### {title} ({})\n", group.len());
        let _ = writeln!(
            s,
            "| Policy | Model | Change | Before | After |\n|---|---|---|---|---|"
        );
        for c in group {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                cell(&c.policy),
                cell(c.model.as_deref().unwrap_or("all")),
                cell(&c.what),
                cell(&c.before),
                cell(&c.after)
            );
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "Amounts in {}. Generated by `purser diff` from the compiled plans, not the YAML text.",
        d.currency
    );
    s
}
