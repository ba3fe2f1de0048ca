//! In-memory adapters of every trait: the embedded defaults for tests and single-process use.
