//! Identifier newtypes, so a provider id can never be passed where a policy id is meant.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(s: impl AsRef<str>) -> Self {
                $name(Arc::from(s.as_ref()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// A provider document's `id`.
    ProviderId
);
id_type!(
    /// A policy document's `id`.
    PolicyId
);
id_type!(
    /// A client's `id` inside a policy.
    ClientId
);
id_type!(
    /// A model name as clients request it.
    ModelName
);
id_type!(
    /// A jurisdiction tag (`us`, `eu`, `eu-de`).
    Jurisdiction
);
