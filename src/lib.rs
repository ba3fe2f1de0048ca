//! Edward: run coding-agent runs inside your own Rust service.
//!
//! This facade re-exports the workspace crates; features pick adapters.

pub use edward_core as core;
#[cfg(feature = "http")]
pub use edward_http as http;
pub use edward_parser as parser;
pub use edward_sandbox as sandbox;
pub use edward_store as store;
