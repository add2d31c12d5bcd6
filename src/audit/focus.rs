//! FOCUS export: the ledger's billed and maybe-billed attempts as rows of a FinOps
//! Foundation FOCUS 1.2 cost and usage dataset, so FinOps tools read purser as they
//! read a cloud bill.
//!
//! One row per attempt a vendor billed or may have billed (`not_billed` attempts cost
//! nothing and are left out). Every FOCUS 1.2 column is present, in the
//! specification's (alphabetical) order, then purser's own `x_` columns, as FOCUS's
//! column-handling rules allow. A null is an empty cell.
//!
//! Mapping, where FOCUS needs a choice:
//! - `BilledCost` = `EffectiveCost` = `ListCost` = `ContractedCost` = the attempt's
//!   exact cost: purser prices at the vendor's list price and knows no discount.
//! - A maybe-billed attempt (a timeout, a cut stream) keeps the cost the ledger proved
//!   (usually 0) as `BilledCost`, so the export sums to `/audit/v1/spend`; its worst
//!   case rides in `x_MaybeBilledWorstCase`, never hidden as 0.
//! - The provider id (as configured) names `ProviderName`, `PublisherName`,
//!   `InvoiceIssuerName` and `BillingAccountId`: purser knows which account it called,
//!   not the vendor's invoice structure. The policy is the sub-account.
//! - `ResourceId` is the request id; `SkuId` the upstream model.
//! - `BillingPeriodStart/End` is the UTC calendar month of the charge.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::guard_cell;
use crate::ledger::audit::AttemptLine;

/// The FOCUS version these columns follow.
pub const FOCUS_VERSION: &str = "1.2";

/// FOCUS 1.2's columns, in the specification's order, then purser's `x_` columns.
pub const HEADER: [&str; 63] = [
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingAccountType",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrency",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
    "x_BillingState",
    "x_MaybeBilledWorstCase",
    "x_AttemptSeq",
    "x_CostBasis",
    "x_PlanId",
    "x_FocusVersion",
];

/// FOCUS date/time: UTC, `YYYY-MM-DDTHH:mm:ssZ`.
fn focus_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn parse(t: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(t, &Rfc3339).ok()
}

/// The charge period: from the attempt's start (down to the second) to its end
/// (up to the next second, exclusive); at least one second, as the end is exclusive.
fn charge_period(
    started: &str,
    finished: Option<&str>,
) -> Option<(OffsetDateTime, OffsetDateTime)> {
    let start = parse(started)?.replace_nanosecond(0).ok()?;
    let end = finished
        .and_then(parse)
        .map(|f| {
            let whole = f.replace_nanosecond(0).unwrap_or(f);
            if whole == f {
                f
            } else {
                whole + time::Duration::SECOND
            }
        })
        .filter(|e| *e > start)
        .unwrap_or(start + time::Duration::SECOND);
    Some((start, end))
}

/// The UTC calendar month holding `t`: [start, end).
fn month_of(t: OffsetDateTime) -> Option<(OffsetDateTime, OffsetDateTime)> {
    let start = t.replace_day(1).ok()?.replace_time(time::Time::MIDNIGHT);
    let (y, m) = match start.month() {
        time::Month::December => (start.year() + 1, time::Month::January),
        m => (start.year(), m.next()),
    };
    let end = start
        .replace_day(1)
        .ok()?
        .replace_year(y)
        .ok()?
        .replace_month(m)
        .ok()?;
    Some((start, end))
}

/// One attempt as a FOCUS row, in `HEADER` order; `None` for an attempt no vendor
/// billed (or one whose times cannot be read, which the ledger never writes).
pub fn record(line: &AttemptLine, currency: &str) -> Option<Vec<String>> {
    let a = &line.attempt;
    let maybe = match a.billing.as_str() {
        "billed" => false,
        "maybe_billed" => true,
        _ => return None,
    };
    let (start, end) = charge_period(&a.started_at, a.finished_at.as_deref())?;
    let (period_start, period_end) = month_of(start)?;
    let tokens = match (a.input_tokens, a.output_tokens) {
        (None, None) => None,
        (i, o) => Some(i.unwrap_or(0) + o.unwrap_or(0)),
    };
    let (quantity, unit) = match tokens {
        Some(n) => (n.to_string(), "Tokens".to_string()),
        None => (String::new(), String::new()),
    };
    let description = if maybe {
        format!(
            "{} chat completion via purser, may have been billed without proof (worst case {} {currency})",
            a.upstream_model, a.worst_case
        )
    } else {
        format!("{} chat completion via purser", a.upstream_model)
    };
    let tags = serde_json::json!({
        "purser/policy": line.policy,
        "purser/client": line.client,
        "purser/model": line.model,
        "purser/jurisdiction": a.jurisdiction,
    })
    .to_string();
    let null = String::new;
    let cost = a.cost.clone();
    let row = [
        null(),                                            // AvailabilityZone
        cost.clone(),                                      // BilledCost
        a.provider.clone(),                                // BillingAccountId
        a.provider.clone(),                                // BillingAccountName
        "Provider".into(),                                 // BillingAccountType
        currency.to_string(),                              // BillingCurrency
        focus_time(period_end),                            // BillingPeriodEnd
        focus_time(period_start),                          // BillingPeriodStart
        null(),                                            // CapacityReservationId
        null(),                                            // CapacityReservationStatus
        "Usage".into(),                                    // ChargeCategory
        null(),                                            // ChargeClass
        description,                                       // ChargeDescription
        "Usage-Based".into(),                              // ChargeFrequency
        focus_time(end),                                   // ChargePeriodEnd
        focus_time(start),                                 // ChargePeriodStart
        null(),                                            // CommitmentDiscountCategory
        null(),                                            // CommitmentDiscountId
        null(),                                            // CommitmentDiscountName
        null(),                                            // CommitmentDiscountQuantity
        null(),                                            // CommitmentDiscountStatus
        null(),                                            // CommitmentDiscountType
        null(),                                            // CommitmentDiscountUnit
        quantity.clone(),                                  // ConsumedQuantity
        unit.clone(),                                      // ConsumedUnit
        cost.clone(),                                      // ContractedCost
        null(),                                            // ContractedUnitPrice
        cost.clone(),                                      // EffectiveCost
        null(),                                            // InvoiceId
        a.provider.clone(),                                // InvoiceIssuerName
        cost,                                              // ListCost
        null(),                                            // ListUnitPrice
        "Standard".into(),                                 // PricingCategory
        null(),                                            // PricingCurrency
        null(),                                            // PricingCurrencyContractedUnitPrice
        null(),                                            // PricingCurrencyEffectiveCost
        null(),                                            // PricingCurrencyListUnitPrice
        quantity,                                          // PricingQuantity
        unit,                                              // PricingUnit
        a.provider.clone(),                                // ProviderName
        a.provider.clone(),                                // PublisherName
        null(),                                            // RegionId
        null(),                                            // RegionName
        line.request_id.clone(),                           // ResourceId
        line.request_id.clone(),                           // ResourceName
        "Chat completion request".into(),                  // ResourceType
        "AI and Machine Learning".into(),                  // ServiceCategory
        a.upstream_model.clone(),                          // ServiceName
        "Generative AI".into(),                            // ServiceSubcategory
        a.upstream_model.clone(),                          // SkuId
        "Tokens".into(),                                   // SkuMeter
        null(),                                            // SkuPriceDetails
        null(),                                            // SkuPriceId
        line.policy.clone(),                               // SubAccountId
        line.policy.clone(),                               // SubAccountName
        "Policy".into(),                                   // SubAccountType
        tags,                                              // Tags
        a.billing.clone(),                                 // x_BillingState
        if maybe { a.worst_case.clone() } else { null() }, // x_MaybeBilledWorstCase
        a.seq.to_string(),                                 // x_AttemptSeq
        a.cost_basis.clone().unwrap_or_default(),          // x_CostBasis
        line.plan_id.clone(),                              // x_PlanId
        FOCUS_VERSION.into(),                              // x_FocusVersion
    ];
    Some(row.into_iter().map(guard_cell).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_period_is_whole_seconds_and_never_empty() {
        let (s, e) =
            charge_period("2026-11-03T10:00:00.250Z", Some("2026-11-03T10:00:01.100Z")).unwrap();
        assert_eq!(
            (focus_time(s), focus_time(e)),
            ("2026-11-03T10:00:00Z".into(), "2026-11-03T10:00:02Z".into())
        );
        let (s, e) = charge_period("2026-11-03T10:00:00.000Z", None).unwrap();
        assert_eq!(focus_time(e), "2026-11-03T10:00:01Z");
        assert!(e > s);
        let (a, b) = month_of(s).unwrap();
        assert_eq!(
            (focus_time(a), focus_time(b)),
            ("2026-11-01T00:00:00Z".into(), "2026-12-01T00:00:00Z".into())
        );
        let (_, b) = month_of(parse("2026-12-31T23:00:00Z").unwrap()).unwrap();
        assert_eq!(focus_time(b), "2027-01-01T00:00:00Z");
    }
}
