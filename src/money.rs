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

/// Decimal places of a currency's minor unit (ISO 4217), for showing amounts to
/// people. Codes not listed use 2, the most common exponent; an amount is never
/// shown with fewer decimals than it has, so a wrong guess never hides a digit.
pub fn minor_units(currency: &str) -> u32 {
    const ZERO: [&str; 17] = [
        "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
        "VUV", "XAF", "XOF", "XPF",
    ];
    const THREE: [&str; 7] = ["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"];
    const FOUR: [&str; 2] = ["CLF", "UYW"];
    let code = currency.trim().to_ascii_uppercase();
    let has = |list: &[&str]| list.contains(&code.as_str());
    if has(&ZERO) {
        0
    } else if has(&THREE) {
        3
    } else if has(&FOUR) {
        4
    } else {
        DEFAULT_MINOR_UNITS
    }
}

/// Minor units assumed where the currency is not at hand (USD, EUR, GBP, ...).
pub const DEFAULT_MINOR_UNITS: u32 = 2;

/// An amount as a person reads it: at least `min_decimals` places (`0.5` → `0.50`,
/// `5` → `5.00`), every place the amount has (`0.000123` stays), never exponent
/// notation. Only for text meant for people; JSON and the ledger keep `Display`'s
/// exact shortest form.
#[derive(Clone, Copy, Debug)]
pub struct ForPeople {
    amount: Decimal,
    min_decimals: u32,
}

impl fmt::Display for ForPeople {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A precision at or above the scale only pads zeros: nothing is rounded away.
        let places = self.amount.scale().max(self.min_decimals) as usize;
        write!(f, "{:.places$}", self.amount)
    }
}

impl Money {
    /// This amount for people, with the currency's minor units (see [`minor_units`]).
    pub fn for_people(self, currency: &str) -> ForPeople {
        self.with_decimals(minor_units(currency))
    }

    /// This amount for people where the currency is not at hand (the ledger's own
    /// messages): [`DEFAULT_MINOR_UNITS`], at least the minor units of every currency
    /// with 0 or 2 of them.
    pub fn for_people_default(self) -> ForPeople {
        self.with_decimals(DEFAULT_MINOR_UNITS)
    }

    /// This amount for people with at least `min_decimals` places.
    pub fn with_decimals(self, min_decimals: u32) -> ForPeople {
        ForPeople {
            amount: self.0.normalize(),
            min_decimals,
        }
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

impl PricePerMTok {
    /// The price per million tokens for people, like [`Money::for_people`].
    pub fn for_people(self, currency: &str) -> ForPeople {
        self.0.for_people(currency)
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
    fn amounts_for_people_show_minor_units_and_keep_every_digit() {
        let p = |s: &str, c: &str| m(s).for_people(c).to_string();
        assert_eq!(p("0.5", "USD"), "0.50");
        assert_eq!(p("5", "EUR"), "5.00");
        assert_eq!(p("0.000123", "USD"), "0.000123");
        assert_eq!(p("0.0009288", "GBP"), "0.0009288");
        assert_eq!(p("0", "USD"), "0.00");
        assert_eq!(p("-0.5", "USD"), "-0.50");
        assert_eq!(p("1500", "JPY"), "1500");
        assert_eq!(p("1500", "krw"), "1500");
        assert_eq!(p("0.5", "JPY"), "0.5");
        assert_eq!(p("1.5", "KWD"), "1.500");
        assert_eq!(p("2", "XYZ"), "2.00");
        // The largest amount Decimal holds: padding never overflows or rounds.
        assert_eq!(
            p("79228162514264337593543950335", "USD"),
            "79228162514264337593543950335.00"
        );
        assert_eq!(
            p("0.0000000000000000000000000001", "USD"),
            "0.0000000000000000000000000001"
        );
        // JSON and the ledger keep the exact shortest form.
        assert_eq!(m("0.50").to_string(), "0.5");
        assert_eq!(serde_json::to_string(&m("0.50")).unwrap(), "\"0.5\"");
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn any_money() -> impl Strategy<Value = Money> {
            (any::<i64>(), 0u32..=28).prop_map(|(n, scale)| Money::new(Decimal::new(n, scale)))
        }

        fn any_currency() -> impl Strategy<Value = &'static str> {
            prop::sample::select(vec![
                "USD", "EUR", "GBP", "JPY", "KRW", "KWD", "CLF", "CHF", "",
            ])
        }

        proptest! {
            #[test]
            fn never_exponent_and_round_trips(a in any_money(), c in any_currency()) {
                let shown = a.for_people(c).to_string();
                prop_assert!(!shown.contains(['e', 'E']), "{shown}");
                prop_assert_eq!(shown.parse::<Money>().unwrap(), a);
            }

            #[test]
            fn at_least_the_minor_units(a in any_money(), c in any_currency()) {
                let shown = a.for_people(c).to_string();
                let decimals = shown.split_once('.').map_or(0, |(_, f)| f.len());
                prop_assert!(decimals >= minor_units(c) as usize, "{shown} in {c}");
                prop_assert!(decimals >= a.decimal().normalize().scale() as usize, "{shown}");
            }
        }
    }

    #[test]
    fn saturating_sub_floors_at_zero() {
        assert_eq!(m("1").saturating_sub(m("2")), Money::ZERO);
        assert_eq!(m("2").saturating_sub(m("0.5")), m("1.5"));
    }
}
