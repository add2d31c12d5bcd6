//! Prometheus metrics of one engine. Each engine owns its registry (no global state),
//! so several gateways in one process (tests, the demo) never mix their counts.
//!
//! Spend is a counter of **nano-units** of the plan's currency (1 USD = 1e9): integer
//! counters cannot hold decimals, and every price that has at most three decimals per
//! million tokens costs a whole number of nano-units per token. The ledger stays the
//! exact record; the metric is for dashboards and alerts.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::money::Money;

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    attempts: IntCounterVec,
    failovers: IntCounterVec,
    refusals: IntCounterVec,
    spend: IntCounterVec,
    priced: IntCounterVec,
    latency: HistogramVec,
    budget_remaining: IntGaugeVec,
    circuit: IntGaugeVec,
    plan: IntGaugeVec,
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics registry: {0}")]
    Prometheus(#[from] prometheus::Error),
}

fn counter(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, MetricsError> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, MetricsError> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

/// Nano-units of the currency, rounded half away from zero.
pub fn nanos(m: Money) -> u64 {
    let scaled = (m.decimal() * rust_decimal::Decimal::from(1_000_000_000u64)).round();
    u64::try_from(scaled).unwrap_or(0)
}

impl Metrics {
    pub fn new() -> Result<Metrics, MetricsError> {
        let r = Registry::new();
        Ok(Metrics {
            requests: counter(
                &r,
                "purser_requests_total",
                "Requests by ingress API (chat, messages, responses), policy and outcome (served, or the error code the client got).",
                &["ingress", "policy", "outcome"],
            )?,
            attempts: counter(
                &r,
                "purser_attempts_total",
                "Upstream attempts by provider and class (success or a failure class).",
                &["provider", "class"],
            )?,
            failovers: counter(
                &r,
                "purser_failovers_total",
                "Failovers to a policy's alternate, by origin, destination and the class that caused them.",
                &["from", "to", "class"],
            )?,
            refusals: counter(
                &r,
                "purser_refusals_total",
                "Requests refused, by class: an upstream refusal class or the gateway's own refusal code.",
                &["class"],
            )?,
            spend: counter(
                &r,
                "purser_spend_nanos_total",
                "Billed spend by provider, in nano-units (1e-9) of the plan's currency.",
                &["provider", "currency"],
            )?,
            priced: counter(
                &r,
                "purser_priced_attempts_total",
                "Answered attempts by provider and how their cost was reached: usage (the vendor's figures), worst_case (usage missing, charged at the bound) or estimated (a token class priced without a configured rate).",
                &["provider", "cost_basis"],
            )?,
            latency: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "purser_upstream_latency_seconds",
                        "Upstream call latency by provider, from send to a classified answer.",
                    )
                    .buckets(vec![
                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    ]),
                    &["provider"],
                )?;
                r.register(Box::new(h.clone()))?;
                h
            },
            budget_remaining: gauge(
                &r,
                "purser_budget_remaining_nanos",
                "What remains of each period budget in its current window, in nano-units of the currency.",
                &["policy", "period"],
            )?,
            circuit: gauge(
                &r,
                "purser_circuit_state",
                "Circuit breaker state per provider: 0 closed, 1 half-open, 2 open.",
                &["provider"],
            )?,
            plan: gauge(
                &r,
                "purser_plan_info",
                "The active plan (value 1, id in the label).",
                &["plan_id"],
            )?,
            registry: r,
        })
    }

    pub fn request(&self, ingress: crate::ingress::Ingress, policy: &str, outcome: &str) {
        self.requests
            .with_label_values(&[ingress.as_str(), policy, outcome])
            .inc();
    }

    pub fn attempt(&self, provider: &str, class: &str, latency: Option<std::time::Duration>) {
        self.attempts.with_label_values(&[provider, class]).inc();
        if let Some(l) = latency {
            self.latency
                .with_label_values(&[provider])
                .observe(l.as_secs_f64());
        }
    }

    pub fn priced(&self, provider: &str, basis: &str) {
        self.priced.with_label_values(&[provider, basis]).inc();
    }

    pub fn failover(&self, from: &str, to: &str, class: &str) {
        self.failovers.with_label_values(&[from, to, class]).inc();
    }

    pub fn refusal(&self, class: &str) {
        self.refusals.with_label_values(&[class]).inc();
    }

    pub fn spend(&self, provider: &str, currency: &str, cost: Money) {
        self.spend
            .with_label_values(&[provider, currency])
            .inc_by(nanos(cost));
    }

    /// Set the scrape-time gauges (the caller reads budgets and breakers).
    pub fn set_budget_remaining(&self, policy: &str, period: &str, remaining: Money) {
        let v = i64::try_from(nanos(remaining)).unwrap_or(i64::MAX);
        self.budget_remaining
            .with_label_values(&[policy, period])
            .set(v);
    }

    pub fn set_circuit(&self, provider: &str, state: i64) {
        self.circuit.with_label_values(&[provider]).set(state);
    }

    pub fn set_plan(&self, plan_id: &str) {
        self.plan.reset();
        self.plan.with_label_values(&[plan_id]).set(1);
    }

    /// The Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_units_are_exact_for_token_prices() {
        let m: Money = "0.0000066".parse().unwrap();
        assert_eq!(nanos(m), 6_600);
        assert_eq!(nanos("12.5".parse().unwrap()), 12_500_000_000);
    }
}
