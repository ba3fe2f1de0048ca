//! Conformance suite for `SandboxProvider`/`Sandbox` adapters.
