//! Events emitted by the parser (PROTOCOL.md §7).

use std::fmt;

/// One event of the parser's output.
///
/// With the `serde` feature, an event serialises to the JSON form of
/// PROTOCOL.md §7: `type` first, optional fields omitted when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "type", rename_all = "snake_case"))]
pub enum Event {
    /// Plain text outside any scope (or between files inside a sandbox).
    Text {
        /// The text.
        content: String,
    },
    /// `<Thinking>` opened.
    ThinkingStart,
    /// Text inside `<Thinking>`.
    ThinkingContent {
        /// The text.
        content: String,
    },
    /// `<Thinking>` closed (explicitly or implicitly).
    ThinkingEnd,
    /// `<edward_sandbox>` opened.
    SandboxStart {
        /// The `project` attribute, passed through.
        #[cfg_attr(
            feature = "serde",
            serde(default, skip_serializing_if = "Option::is_none")
        )]
        project: Option<String>,
        /// The `base` attribute, passed through.
        #[cfg_attr(
            feature = "serde",
            serde(default, skip_serializing_if = "Option::is_none")
        )]
        base: Option<String>,
    },
    /// `<edward_sandbox>` closed.
    SandboxEnd,
    /// `<file path="…">` opened with a valid path.
    FileStart {
        /// The normalised path (PROTOCOL.md §4).
        path: String,
    },
    /// Bytes of the current file's content.
    FileContent {
        /// The content, verbatim.
        content: String,
    },
    /// The current file ended.
    FileEnd,
    /// `<edward_install>` opened.
    InstallStart,
    /// The parsed body of an install block.
    InstallContent {
        /// Valid, de-duplicated package specs.
        dependencies: Vec<String>,
        /// The framework, lower-cased, when the body named one.
        #[cfg_attr(
            feature = "serde",
            serde(default, skip_serializing_if = "Option::is_none")
        )]
        framework: Option<String>,
    },
    /// The install block ended.
    InstallEnd,
    /// `<edward_command …/>`.
    Command {
        /// The program to run.
        command: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// `<edward_web_search …/>`.
    WebSearch {
        /// The query.
        query: String,
        /// Result count, clamped to 1..=8 (default 5).
        max_results: u8,
    },
    /// `<edward_done/>`: the model says the task is finished.
    Done,
    /// Something in the stream broke the protocol.
    Error {
        /// What went wrong.
        code: ErrorCode,
        /// A human-readable explanation.
        message: String,
        /// Whether parsing continued.
        severity: Severity,
        /// Input bytes that were consumed without being emitted elsewhere.
        #[cfg_attr(
            feature = "serde",
            serde(default, skip_serializing_if = "Option::is_none")
        )]
        skipped_bytes: Option<u64>,
    },
}

impl Event {
    /// The `type` string of the JSON form.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Text { .. } => "text",
            Event::ThinkingStart => "thinking_start",
            Event::ThinkingContent { .. } => "thinking_content",
            Event::ThinkingEnd => "thinking_end",
            Event::SandboxStart { .. } => "sandbox_start",
            Event::SandboxEnd => "sandbox_end",
            Event::FileStart { .. } => "file_start",
            Event::FileContent { .. } => "file_content",
            Event::FileEnd => "file_end",
            Event::InstallStart => "install_start",
            Event::InstallContent { .. } => "install_content",
            Event::InstallEnd => "install_end",
            Event::Command { .. } => "command",
            Event::WebSearch { .. } => "web_search",
            Event::Done => "done",
            Event::Error { .. } => "error",
        }
    }
}

/// The error codes of PROTOCOL.md §7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ErrorCode {
    /// A tag longer than 4 KiB; its bytes were emitted as content.
    TagTooLong,
    /// A file was closed by `</edward_sandbox>` or by the end of the stream.
    UnclosedFile,
    /// A sandbox was still open at the end of the stream.
    UnclosedSandbox,
    /// Thinking was still open at the end of the stream.
    UnclosedThinking,
    /// An install body ended without `</edward_install>`.
    UnclosedInstall,
    /// `<edward_sandbox>` inside a sandbox; ignored.
    NestedSandbox,
    /// `<file>` outside a sandbox; emitted as text.
    FileOutsideSandbox,
    /// A file path was rejected; its body was skipped.
    InvalidFilePath,
    /// Install items that are not valid npm specs, or over the limit.
    InvalidDependency,
    /// A command tag without `command`, or with bad `args`.
    MalformedCommand,
    /// A web search tag without `query`.
    MalformedWebSearch,
}

impl ErrorCode {
    /// The snake_case code string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::TagTooLong => "tag_too_long",
            ErrorCode::UnclosedFile => "unclosed_file",
            ErrorCode::UnclosedSandbox => "unclosed_sandbox",
            ErrorCode::UnclosedThinking => "unclosed_thinking",
            ErrorCode::UnclosedInstall => "unclosed_install",
            ErrorCode::NestedSandbox => "nested_sandbox",
            ErrorCode::FileOutsideSandbox => "file_outside_sandbox",
            ErrorCode::InvalidFilePath => "invalid_file_path",
            ErrorCode::InvalidDependency => "invalid_dependency",
            ErrorCode::MalformedCommand => "malformed_command",
            ErrorCode::MalformedWebSearch => "malformed_web_search",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How bad a parse error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Severity {
    /// Parsing continued.
    Recoverable,
    /// Parsing could not continue (reserved; the parser currently never emits it).
    Fatal,
}
