//! The Edward engine: domain types, traits, the run engine and in-memory adapters (work in progress).
