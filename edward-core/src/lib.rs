//! Edward core: domain types, the traits the engine is generic over, the run
//! engine, and in-memory adapters.
//!
//! **Architecture invariant:** this crate knows no backend: no SQL, no Redis,
//! no Docker, no HTTP server. Adapters live in `edward-store`,
//! `edward-sandbox` and `edward-http`. (HTTP *clients* for model providers
//! live here behind features.)
#![deny(missing_docs)]

pub mod chat;
mod error;
pub mod hash;
mod path;
pub mod pricing;
mod traits;
mod types;

pub mod engine;
pub mod memory;
#[cfg(any(
    feature = "openai",
    feature = "anthropic",
    feature = "gemini",
    feature = "tavily"
))]
pub mod providers;
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub mod registry;
pub mod scripted;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use chat::*;
pub use error::*;
pub use traits::*;
pub use types::*;

pub use edward_parser as parser;
