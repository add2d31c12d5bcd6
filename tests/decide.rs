//! DESIGN 5 as a table: every class × mode × alternate state × billing history ×
//! credential state, checked against rules restated here independently of `decide`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use purser::decide::{Action, AlternateState, Context, decide};
use purser::failure::{Billing, FailureClass};
use purser::policy::plan::Mode;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Alt {
    None,
    Configured,
    SameUpstream,
    DoesNotFit,
    AlreadyUsed,
}

fn state(a: Alt) -> AlternateState {
    match a {
        Alt::None => AlternateState::None,
        Alt::Configured => AlternateState::Available {
            same_upstream: false,
            fits_ceiling: true,
        },
        Alt::SameUpstream => AlternateState::Available {
            same_upstream: true,
            fits_ceiling: true,
        },
        Alt::DoesNotFit => AlternateState::Available {
            same_upstream: false,
            fits_ceiling: false,
        },
        Alt::AlreadyUsed => AlternateState::AlreadyUsed,
    }
}

/// DESIGN 5, restated.
fn expected(
    class: FailureClass,
    mode: Mode,
    alt: Alt,
    earlier: Billing,
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
        if class == Auth && changed && !retried {
            return Action::RetrySame;
        }
        return Action::Refuse;
    }
    let maybe_billed_class = [Timeout, Dropped, Unclassified].contains(&class);
    let all_not_billed = earlier == Billing::NotBilled && !maybe_billed_class;
    let ok = alt == Alt::Configured && (mode == Mode::Soft || all_not_billed);
    if ok { Action::FailOver } else { Action::Stop }
}

#[test]
fn decision_table_matches_design_5() {
    let mut rows = 0;
    for class in FailureClass::ALL {
        for mode in [Mode::Hard, Mode::Soft] {
            for alt in [
                Alt::None,
                Alt::Configured,
                Alt::SameUpstream,
                Alt::DoesNotFit,
                Alt::AlreadyUsed,
            ] {
                for earlier in [Billing::NotBilled, Billing::MaybeBilled, Billing::Billed] {
                    for changed in [false, true] {
                        for retried in [false, true] {
                            let ctx = Context {
                                mode,
                                earlier_billing: earlier,
                                alternate: state(alt),
                                credential_changed: changed,
                                already_retried: retried,
                            };
                            let d = decide(class, &ctx);
                            let want = expected(class, mode, alt, earlier, changed, retried);
                            assert_eq!(
                                d.action,
                                want,
                                "{class} {mode:?} {alt:?} {earlier:?} changed={changed} retried={retried}: {}",
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
    assert_eq!(rows, 13 * 2 * 5 * 3 * 2 * 2);
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
