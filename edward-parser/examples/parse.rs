//! Parse a model response from stdin (contract: see README).
fn main() {}
