//! Which budget window an instant falls in, as PostgreSQL is given it.

use time::OffsetDateTime;

use crate::policy::plan::Period;

/// The UTC start of `period`'s window containing `t`.
pub fn window_start_at(period: Period, t: OffsetDateTime) -> OffsetDateTime {
    let t = t.to_offset(time::UtcOffset::UTC);
    let date = match period {
        Period::Day => t.date(),
        Period::Month => t.date().replace_day(1).unwrap_or(t.date()),
    };
    date.midnight().assume_utc()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The instant PostgreSQL is given is the window SQLite names as text.
        #[test]
        fn window_starts_agree_with_the_sqlite_text(secs in 0i64..253_402_300_799) {
            let t = OffsetDateTime::from_unix_timestamp(secs)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for period in [Period::Day, Period::Month] {
                let at = window_start_at(period, t);
                let text = crate::ledger::rfc3339(at);
                prop_assert_eq!(format!("{}Z", &text[..19]), crate::ledger::window_start(period, t));
            }
        }
    }
}
