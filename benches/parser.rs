//! Parser throughput and allocations (criterion): the bench of
//! `edward-parser/benches/parser.rs`, included here so the facade runs the
//! same source (`cargo bench --bench parser`). Building it in the parser
//! crate alone is much cheaper:
//!
//! ```text
//! cargo bench -p edward-parser --bench parser -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Groups `parser/corpus` (~1 MiB realistic response) and `parser/file_10mib`
//! (one 10 MiB file), each at chunk sizes 1, 16, 64, 256, 4096, 65536 and
//! whole, for the borrowing API (`borrowed/N`), the owned one (`owned/N`) and
//! the `memchr` reference over the same chunks (`memchr/N`); then a table of
//! allocations per MB from a counting global allocator.

include!("../edward-parser/benches/parser.rs");
