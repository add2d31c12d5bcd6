//! Policy sets: YAML files → schema-checked documents → a compiled, immutable `Plan`.

pub mod compile;
pub mod diagnostic;
pub mod diff;
pub mod family;
pub mod plan;
pub mod raw;
pub mod render;
pub mod schema;
pub mod source;

pub use compile::{compile_dir, compile_documents};
pub use diagnostic::{Diagnostic, Diagnostics, Severity};
pub use plan::Plan;
