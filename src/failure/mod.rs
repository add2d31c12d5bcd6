//! The closed set of failure classes (DESIGN 4), with every property of a class
//! answered here by an exhaustive match. The classifier lives in `classify`.
#![deny(clippy::wildcard_enum_match_arm)]

use serde::Serialize;

mod classify;
mod dialects;
mod evidence;
pub use classify::*;
/// What the classifier keeps of a body to judge, and the bound it is held to (values,
/// bytes of text): the work a hostile body can make.
pub use evidence::{BOUND as READ_BOUND, kept as read_kept};

/// Why an attempt failed. Adding a class fails to compile until `fault`, `billing`,
/// `trips_circuit` and `decide` all say what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    Timeout,
    Connect,
    Dropped,
    RateLimited,
    Overloaded,
    ServerError,
    CircuitOpen,
    Auth,
    ModelNotFound,
    ContextLength,
    ContentRefusal,
    Malformed,
    Unclassified,
}

/// Whose fault a class is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Provider,
    Credential,
    Configuration,
    Request,
    Governance,
    Unknown,
}

/// Whether an attempt may have cost money.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Billing {
    NotBilled,
    MaybeBilled,
    Billed,
}

impl Billing {
    pub fn as_str(self) -> &'static str {
        match self {
            Billing::NotBilled => "not_billed",
            Billing::MaybeBilled => "maybe_billed",
            Billing::Billed => "billed",
        }
    }

    pub fn parse(s: &str) -> Option<Billing> {
        [Billing::NotBilled, Billing::MaybeBilled, Billing::Billed]
            .into_iter()
            .find(|b| b.as_str() == s)
    }
}

impl FailureClass {
    pub const ALL: [FailureClass; 13] = [
        FailureClass::Timeout,
        FailureClass::Connect,
        FailureClass::Dropped,
        FailureClass::RateLimited,
        FailureClass::Overloaded,
        FailureClass::ServerError,
        FailureClass::CircuitOpen,
        FailureClass::Auth,
        FailureClass::ModelNotFound,
        FailureClass::ContextLength,
        FailureClass::ContentRefusal,
        FailureClass::Malformed,
        FailureClass::Unclassified,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Timeout => "timeout",
            FailureClass::Connect => "connect",
            FailureClass::Dropped => "dropped",
            FailureClass::RateLimited => "rate_limited",
            FailureClass::Overloaded => "overloaded",
            FailureClass::ServerError => "server_error",
            FailureClass::CircuitOpen => "circuit_open",
            FailureClass::Auth => "auth",
            FailureClass::ModelNotFound => "model_not_found",
            FailureClass::ContextLength => "context_length",
            FailureClass::ContentRefusal => "content_refusal",
            FailureClass::Malformed => "malformed",
            FailureClass::Unclassified => "unclassified",
        }
    }

    pub fn parse(s: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub fn fault(self) -> Fault {
        match self {
            FailureClass::Timeout
            | FailureClass::Connect
            | FailureClass::Dropped
            | FailureClass::RateLimited
            | FailureClass::Overloaded
            | FailureClass::ServerError
            | FailureClass::CircuitOpen => Fault::Provider,
            FailureClass::Auth => Fault::Credential,
            FailureClass::ModelNotFound => Fault::Configuration,
            FailureClass::ContextLength | FailureClass::Malformed => Fault::Request,
            FailureClass::ContentRefusal => Fault::Governance,
            FailureClass::Unclassified => Fault::Unknown,
        }
    }

    /// Whether the vendor may have charged for the attempt. `maybe_billed` whenever the
    /// request reached a model that may have generated tokens we have no receipt for.
    pub fn billing(self) -> Billing {
        match self {
            FailureClass::Timeout
            | FailureClass::Dropped
            | FailureClass::ContentRefusal
            | FailureClass::Unclassified => Billing::MaybeBilled,
            FailureClass::Connect
            | FailureClass::RateLimited
            | FailureClass::Overloaded
            | FailureClass::ServerError
            | FailureClass::CircuitOpen
            | FailureClass::Auth
            | FailureClass::ModelNotFound
            | FailureClass::ContextLength
            | FailureClass::Malformed => Billing::NotBilled,
        }
    }

    /// Whether the class counts toward opening the destination's circuit. `circuit_open`
    /// never does: an open circuit must not re-trip itself.
    pub fn trips_circuit(self) -> bool {
        match self {
            FailureClass::Timeout
            | FailureClass::Connect
            | FailureClass::Dropped
            | FailureClass::RateLimited
            | FailureClass::Overloaded
            | FailureClass::ServerError
            | FailureClass::Unclassified => true,
            FailureClass::CircuitOpen
            | FailureClass::Auth
            | FailureClass::ModelNotFound
            | FailureClass::ContextLength
            | FailureClass::ContentRefusal
            | FailureClass::Malformed => false,
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_a_name_that_parses_back() {
        for c in FailureClass::ALL {
            assert_eq!(FailureClass::parse(c.as_str()), Some(c));
        }
    }

    #[test]
    fn circuit_open_never_trips_and_client_faults_never_trip() {
        assert!(!FailureClass::CircuitOpen.trips_circuit());
        for c in FailureClass::ALL {
            if matches!(
                c.fault(),
                Fault::Request | Fault::Governance | Fault::Credential | Fault::Configuration
            ) {
                assert!(!c.trips_circuit(), "{c}");
            }
        }
    }
}
