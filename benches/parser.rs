//! Parser throughput bench (filled in by the parser work).
fn main() {}
