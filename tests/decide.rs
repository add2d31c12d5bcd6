//! DESIGN 5 as a table: every class × mode × alternate state × billing history ×
//! this attempt's billing × credential state, checked against rules restated here
//! independently of `decide`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use purser::decide::{Action, AlternateState, BudgetRoom, Context, awaits_budget, decide};
use purser::failure::{Billing, FailureClass};
use purser::policy::plan::Mode;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Alt {
    None,
    Configured,
    SameUpstream,
    DoesNotFit,
    RefusesFields,
    OverBudget,
    BudgetUnasked,
    AlreadyUsed,
}

const ALTS: [Alt; 8] = [
    Alt::None,
    Alt::Configured,
    Alt::SameUpstream,
    Alt::DoesNotFit,
    Alt::RefusesFields,
    Alt::OverBudget,
    Alt::BudgetUnasked,
    Alt::AlreadyUsed,
];

fn available(
    same_upstream: bool,
    fits_ceiling: bool,
    carries_fields: bool,
    budget: BudgetRoom,
) -> AlternateState {
    AlternateState::Available {
        same_upstream,
        fits_ceiling,
        carries_fields,
        budget,
    }
}

fn state(a: Alt) -> AlternateState {
    match a {
        Alt::None => AlternateState::None,
        Alt::Configured => available(false, true, true, BudgetRoom::Reserved),
        Alt::SameUpstream => available(true, true, true, BudgetRoom::Reserved),
        Alt::DoesNotFit => available(false, false, true, BudgetRoom::Reserved),
        Alt::RefusesFields => available(false, true, false, BudgetRoom::Reserved),
        Alt::OverBudget => available(false, true, true, BudgetRoom::Exhausted),
        Alt::BudgetUnasked => available(false, true, true, BudgetRoom::Unasked),
        Alt::AlreadyUsed => AlternateState::AlreadyUsed,
    }
}

/// DESIGN 5, restated.
fn expected(
    class: FailureClass,
    mode: Mode,
    alt: Alt,
    earlier: Billing,
    this: Billing,
    changed: bool,
    retried: bool,
) -> Action {
    use FailureClass::*;
    let refuse = [
        Auth,
        ModelNotFound,
        ContextLength,
        ContentRefusal,
        Malformed,
    ];
    if refuse.contains(&class) {
        // A rotated key is retried once, on the same reservation: only when the failed
        // call cannot have been billed (a 2xx auth error may have been).
        if class == Auth && changed && !retried && this == Billing::NotBilled {
            return Action::RetrySame;
        }
        return Action::Refuse;
    }
    // Whatever may have billed this attempt or an earlier one: its class, or that the
    // vendor started (a 2xx, streamed output), or usage found in it.
    let all_not_billed = earlier == Billing::NotBilled && this == Billing::NotBilled;
    let ok = alt == Alt::Configured && (mode == Mode::Soft || all_not_billed);
    if ok { Action::FailOver } else { Action::Stop }
}

/// What an attempt of `class` can be billed as: at least its class's billing.
fn billings_of(class: FailureClass) -> impl Iterator<Item = Billing> {
    [Billing::NotBilled, Billing::MaybeBilled, Billing::Billed]
        .into_iter()
        .filter(move |b| *b >= class.billing())
}

#[test]
fn decision_table_matches_design_5() {
    let mut rows = 0;
    for class in FailureClass::ALL {
        for mode in [Mode::Hard, Mode::Soft] {
            for alt in ALTS {
                for earlier in [Billing::NotBilled, Billing::MaybeBilled, Billing::Billed] {
                    for this in billings_of(class) {
                        for changed in [false, true] {
                            for retried in [false, true] {
                                let ctx = Context {
                                    mode,
                                    earlier_billing: earlier,
                                    billing: this,
                                    alternate: state(alt),
                                    credential_changed: changed,
                                    already_retried: retried,
                                };
                                let d = decide(class, &ctx);
                                let want =
                                    expected(class, mode, alt, earlier, this, changed, retried);
                                assert_eq!(
                                    d.action,
                                    want,
                                    "{class} {mode:?} {alt:?} {earlier:?} {this:?} changed={changed} retried={retried}: {}",
                                    d.reason()
                                );
                                assert_eq!(d.class, class);
                                assert!(!d.reason().is_empty());
                                rows += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    // 9 not-billed classes × 3 billings, 4 maybe-billed classes × 2.
    assert_eq!(rows, (9 * 3 + 4 * 2) * 2 * 8 * 3 * 2 * 2);
}

/// The budget is asked exactly when it is all that stands between the request and its
/// alternate; with the answer in, the decision follows it.
#[test]
fn the_budget_is_asked_only_when_it_decides() {
    for class in FailureClass::ALL {
        for mode in [Mode::Hard, Mode::Soft] {
            for alt in ALTS {
                for earlier in [Billing::NotBilled, Billing::MaybeBilled, Billing::Billed] {
                    for this in billings_of(class) {
                        let ctx = Context {
                            mode,
                            earlier_billing: earlier,
                            billing: this,
                            alternate: state(alt),
                            credential_changed: false,
                            already_retried: false,
                        };
                        let reserved = Context {
                            alternate: ctx.alternate.with_budget(BudgetRoom::Reserved),
                            ..ctx
                        };
                        let want = alt == Alt::BudgetUnasked
                            && expected(class, mode, Alt::Configured, earlier, this, false, false)
                                == Action::FailOver;
                        assert_eq!(
                            awaits_budget(class, &ctx),
                            want,
                            "{class} {mode:?} {alt:?} {earlier:?} {this:?}"
                        );
                        if want {
                            assert_eq!(
                                decide(class, &ctx).action,
                                Action::Stop,
                                "never on an unasked budget"
                            );
                            assert_eq!(decide(class, &reserved).action, Action::FailOver);
                            let exhausted = Context {
                                alternate: ctx.alternate.with_budget(BudgetRoom::Exhausted),
                                ..ctx
                            };
                            assert_eq!(decide(class, &exhausted).action, Action::Stop);
                        }
                    }
                }
            }
        }
    }
}

/// An attempt that started (a 2xx, streamed output) is at least maybe billed whatever
/// its class: under a hard ceiling even a rate limit then stops the request.
#[test]
fn a_started_attempt_never_fails_over_under_hard() {
    for class in [
        FailureClass::RateLimited,
        FailureClass::Overloaded,
        FailureClass::ServerError,
    ] {
        for this in [Billing::MaybeBilled, Billing::Billed] {
            let ctx = Context {
                mode: Mode::Hard,
                earlier_billing: Billing::NotBilled,
                billing: this,
                alternate: state(Alt::Configured),
                credential_changed: false,
                already_retried: false,
            };
            assert_eq!(decide(class, &ctx).action, Action::Stop, "{class} {this:?}");
            let soft = Context {
                mode: Mode::Soft,
                ..ctx
            };
            assert_eq!(
                decide(class, &soft).action,
                Action::FailOver,
                "{class} {this:?}"
            );
        }
    }
}

#[test]
fn hard_mode_never_fails_over_after_a_maybe_billed_class() {
    for class in [
        FailureClass::Timeout,
        FailureClass::Unclassified,
        FailureClass::Dropped,
    ] {
        let ctx = Context {
            mode: Mode::Hard,
            earlier_billing: Billing::NotBilled,
            billing: class.billing(),
            alternate: state(Alt::Configured),
            credential_changed: false,
            already_retried: false,
        };
        assert_eq!(decide(class, &ctx).action, Action::Stop, "{class}");
        let soft = Context {
            mode: Mode::Soft,
            ..ctx
        };
        assert_eq!(decide(class, &soft).action, Action::FailOver, "{class}");
    }
}

#[test]
fn nothing_produces_a_third_destination() {
    for class in FailureClass::ALL {
        for mode in [Mode::Hard, Mode::Soft] {
            let ctx = Context {
                mode,
                earlier_billing: Billing::NotBilled,
                billing: class.billing(),
                alternate: AlternateState::AlreadyUsed,
                credential_changed: true,
                already_retried: false,
            };
            assert_ne!(decide(class, &ctx).action, Action::FailOver, "{class}");
        }
    }
}

#[test]
fn auth_retries_once_only_when_the_credential_changed() {
    let base = Context {
        mode: Mode::Hard,
        earlier_billing: Billing::NotBilled,
        billing: Billing::NotBilled,
        alternate: state(Alt::Configured),
        credential_changed: false,
        already_retried: false,
    };
    assert_eq!(decide(FailureClass::Auth, &base).action, Action::Refuse);
    let changed = Context {
        credential_changed: true,
        ..base
    };
    assert_eq!(
        decide(FailureClass::Auth, &changed).action,
        Action::RetrySame
    );
    let again = Context {
        already_retried: true,
        ..changed
    };
    assert_eq!(decide(FailureClass::Auth, &again).action, Action::Refuse);
}
