//! Money and prices: exact decimal amounts, never floating point.
//!
//! `Money` is the only currency amount type in purser; `PricePerMTok::cost_of` is the
//! only way a token count becomes money, so every cost in the ledger is computed the
//! same exact way.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, Sub};
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An exact amount in the plan's currency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Money(Decimal);

/// Why a string is not an amount of money.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("`{0}` is not a decimal number (write amounts like \"0.15\")")]
    NotDecimal(String),
}

impl Money {
    pub const ZERO: Money = Money(Decimal::ZERO);

    pub fn new(d: Decimal) -> Self {
        Money(d.normalize())
    }

    pub fn decimal(self) -> Decimal {
        self.0
    }

    pub fn is_positive(self) -> bool {
        self.0 > Decimal::ZERO
    }

    pub fn is_negative(self) -> bool {
        self.0 < Decimal::ZERO
    }

    /// `self - other`, never below zero: what is left of a limit.
    pub fn saturating_sub(self, other: Money) -> Money {
        if other >= self {
            Money::ZERO
        } else {
            Money::new(self.0 - other.0)
        }
    }

    /// Checked addition; `None` only past Decimal's 96-bit range (~7.9e28).
    pub fn checked_add(self, other: Money) -> Option<Money> {
        self.0.checked_add(other.0).map(Money::new)
    }
}

impl FromStr for Money {
    type Err = MoneyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        // Scientific notation and thousands separators are refused on purpose: a price
        // reviewed in a pull request must read the same to a person and to purser.
        if t.is_empty() || t.contains(['e', 'E', '_', ',']) {
            return Err(MoneyError::NotDecimal(s.to_string()));
        }
        Decimal::from_str_exact(t)
            .map(Money::new)
            .map_err(|_| MoneyError::NotDecimal(s.to_string()))
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // normalize() drops trailing zeros so "0.50" and "0.5" print (and hash) alike.
        write!(f, "{}", self.0.normalize())
    }
}

impl Add for Money {
    type Output = Money;
    /// Saturates instead of panicking: amounts near 7.9e28 are not real money.
    fn add(self, rhs: Money) -> Money {
        self.checked_add(rhs).unwrap_or(Money(Decimal::MAX))
    }
}

impl Sub for Money {
    type Output = Money;
    fn sub(self, rhs: Money) -> Money {
        self.0
            .checked_sub(rhs.0)
            .map(Money::new)
            .unwrap_or(Money(Decimal::MIN))
    }
}

impl Sum for Money {
    fn sum<I: Iterator<Item = Money>>(iter: I) -> Money {
        iter.fold(Money::ZERO, |a, b| a + b)
    }
}

impl Serialize for Money {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Money {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A price per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PricePerMTok(Money);

const MILLION: Decimal = Decimal::from_parts(1_000_000, 0, 0, false, 0);

impl PricePerMTok {
    pub fn new(m: Money) -> Self {
        PricePerMTok(m)
    }

    pub fn per_million(self) -> Money {
        self.0
    }

    /// The exact cost of `tokens` tokens at this price.
    pub fn cost_of(self, tokens: u64) -> Money {
        let t = Decimal::from(tokens);
        match t.checked_mul(self.0.0) {
            Some(p) => Money::new(p / MILLION),
            // Beyond Decimal's range only for absurd token counts: saturate high, which is
            // the safe side for a ceiling check.
            None => Money(Decimal::MAX),
        }
    }
}

impl fmt::Display for PricePerMTok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn parses_exact_decimals_and_refuses_the_rest() {
        assert_eq!(m("0.50"), m("0.5"));
        assert_eq!(m("0.50").to_string(), "0.5");
        assert!("1e-3".parse::<Money>().is_err());
        assert!("abc".parse::<Money>().is_err());
        assert!("".parse::<Money>().is_err());
        assert!("1,5".parse::<Money>().is_err());
    }

    #[test]
    fn cost_is_exact() {
        let p = PricePerMTok::new(m("0.15"));
        assert_eq!(p.cost_of(1), m("0.00000015"));
        assert_eq!(p.cost_of(1_000_000), m("0.15"));
        let p = PricePerMTok::new(m("0.0375"));
        assert_eq!(p.cost_of(3), m("0.0000001125"));
    }

    #[test]
    fn a_million_tiny_costs_sum_exactly() {
        let one = m("0.0000001");
        let total: Money = std::iter::repeat_n(one, 1_000_000).sum();
        assert_eq!(total, m("0.1"));
    }

    #[test]
    fn saturating_sub_floors_at_zero() {
        assert_eq!(m("1").saturating_sub(m("2")), Money::ZERO);
        assert_eq!(m("2").saturating_sub(m("0.5")), m("1.5"));
    }
}
