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
        self.as_event_ref().kind()
    }

    /// The JSON form of PROTOCOL.md §7 (`type` first, optional fields
    /// omitted), byte-identical to what `serde_json` produces with the `serde`
    /// feature, but always available.
    ///
    /// ```
    /// use edward_parser::Event;
    /// let e = Event::FileStart { path: "src/\"a\".ts".into() };
    /// assert_eq!(e.to_json(), r#"{"type":"file_start","path":"src/\"a\".ts"}"#);
    /// ```
    pub fn to_json(&self) -> String {
        self.as_event_ref().to_json()
    }

    /// Append [`Event::to_json`]'s output to `out` (no newline).
    pub fn write_json(&self, out: &mut String) {
        self.as_event_ref().write_json(out);
    }

    /// The same event, borrowed.
    pub fn as_event_ref(&self) -> EventRef<'_> {
        match self {
            Event::Text { content } => EventRef::Text { content },
            Event::ThinkingStart => EventRef::ThinkingStart,
            Event::ThinkingContent { content } => EventRef::ThinkingContent { content },
            Event::ThinkingEnd => EventRef::ThinkingEnd,
            Event::SandboxStart { project, base } => EventRef::SandboxStart {
                project: project.as_deref(),
                base: base.as_deref(),
            },
            Event::SandboxEnd => EventRef::SandboxEnd,
            Event::FileStart { path } => EventRef::FileStart { path },
            Event::FileContent { content } => EventRef::FileContent { content },
            Event::FileEnd => EventRef::FileEnd,
            Event::InstallStart => EventRef::InstallStart,
            Event::InstallContent {
                dependencies,
                framework,
            } => EventRef::InstallContent {
                dependencies,
                framework: framework.as_deref(),
            },
            Event::InstallEnd => EventRef::InstallEnd,
            Event::Command { command, args } => EventRef::Command { command, args },
            Event::WebSearch { query, max_results } => EventRef::WebSearch {
                query,
                max_results: *max_results,
            },
            Event::Done => EventRef::Done,
            Event::Error {
                code,
                message,
                severity,
                skipped_bytes,
            } => EventRef::Error {
                code: *code,
                message,
                severity: *severity,
                skipped_bytes: *skipped_bytes,
            },
        }
    }
}

/// One event of the parser's output, borrowed: what
/// [`Parser::feed_with`](crate::Parser::feed_with) hands to its callback.
///
/// The same variants and fields as [`Event`], with `&str` and `&[String]`
/// instead of owned values. Content (`text`, `thinking_content`,
/// `file_content`) borrows from the chunk being fed wherever its bytes are
/// contiguous there; only bytes the parser held across chunks (a tag
/// candidate, a fence window) come from the parser's own buffers. Nothing is
/// allocated to emit content. [`EventRef::to_event`] makes the owned form.
///
/// ```
/// use edward_parser::{Event, EventRef, Parser};
///
/// let chunk = "hello <edward_done/>";
/// let mut parser = Parser::new();
/// let mut seen = Vec::new();
/// parser.feed_with(chunk, |e| {
///     if let EventRef::Text { content } = e {
///         // a slice of `chunk` itself, not a copy
///         assert_eq!(content.as_ptr(), chunk.as_ptr());
///     }
///     seen.push(e.to_event());
/// });
/// assert_eq!(seen, [Event::Text { content: "hello ".into() }, Event::Done]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// Plain text outside any scope (or between files inside a sandbox).
    Text {
        /// The text.
        content: &'a str,
    },
    /// `<Thinking>` opened.
    ThinkingStart,
    /// Text inside `<Thinking>`.
    ThinkingContent {
        /// The text.
        content: &'a str,
    },
    /// `<Thinking>` closed (explicitly or implicitly).
    ThinkingEnd,
    /// `<edward_sandbox>` opened.
    SandboxStart {
        /// The `project` attribute, passed through.
        project: Option<&'a str>,
        /// The `base` attribute, passed through.
        base: Option<&'a str>,
    },
    /// `<edward_sandbox>` closed.
    SandboxEnd,
    /// `<file path="…">` opened with a valid path.
    FileStart {
        /// The normalised path (PROTOCOL.md §4).
        path: &'a str,
    },
    /// Bytes of the current file's content.
    FileContent {
        /// The content, verbatim.
        content: &'a str,
    },
    /// The current file ended.
    FileEnd,
    /// `<edward_install>` opened.
    InstallStart,
    /// The parsed body of an install block.
    InstallContent {
        /// Valid, de-duplicated package specs.
        dependencies: &'a [String],
        /// The framework, lower-cased, when the body named one.
        framework: Option<&'a str>,
    },
    /// The install block ended.
    InstallEnd,
    /// `<edward_command …/>`.
    Command {
        /// The program to run.
        command: &'a str,
        /// Its arguments.
        args: &'a [String],
    },
    /// `<edward_web_search …/>`.
    WebSearch {
        /// The query.
        query: &'a str,
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
        message: &'a str,
        /// Whether parsing continued.
        severity: Severity,
        /// Input bytes that were consumed without being emitted elsewhere.
        skipped_bytes: Option<u64>,
    },
}

impl EventRef<'_> {
    /// The owned form.
    pub fn to_event(&self) -> Event {
        match *self {
            EventRef::Text { content } => Event::Text {
                content: content.to_string(),
            },
            EventRef::ThinkingStart => Event::ThinkingStart,
            EventRef::ThinkingContent { content } => Event::ThinkingContent {
                content: content.to_string(),
            },
            EventRef::ThinkingEnd => Event::ThinkingEnd,
            EventRef::SandboxStart { project, base } => Event::SandboxStart {
                project: project.map(str::to_string),
                base: base.map(str::to_string),
            },
            EventRef::SandboxEnd => Event::SandboxEnd,
            EventRef::FileStart { path } => Event::FileStart {
                path: path.to_string(),
            },
            EventRef::FileContent { content } => Event::FileContent {
                content: content.to_string(),
            },
            EventRef::FileEnd => Event::FileEnd,
            EventRef::InstallStart => Event::InstallStart,
            EventRef::InstallContent {
                dependencies,
                framework,
            } => Event::InstallContent {
                dependencies: dependencies.to_vec(),
                framework: framework.map(str::to_string),
            },
            EventRef::InstallEnd => Event::InstallEnd,
            EventRef::Command { command, args } => Event::Command {
                command: command.to_string(),
                args: args.to_vec(),
            },
            EventRef::WebSearch { query, max_results } => Event::WebSearch {
                query: query.to_string(),
                max_results,
            },
            EventRef::Done => Event::Done,
            EventRef::Error {
                code,
                message,
                severity,
                skipped_bytes,
            } => Event::Error {
                code,
                message: message.to_string(),
                severity,
                skipped_bytes,
            },
        }
    }

    /// The content of a `text`, `thinking_content` or `file_content` event.
    pub fn content(&self) -> Option<&str> {
        match self {
            EventRef::Text { content }
            | EventRef::ThinkingContent { content }
            | EventRef::FileContent { content } => Some(content),
            _ => None,
        }
    }

    /// The `type` string of the JSON form.
    pub fn kind(&self) -> &'static str {
        match self {
            EventRef::Text { .. } => "text",
            EventRef::ThinkingStart => "thinking_start",
            EventRef::ThinkingContent { .. } => "thinking_content",
            EventRef::ThinkingEnd => "thinking_end",
            EventRef::SandboxStart { .. } => "sandbox_start",
            EventRef::SandboxEnd => "sandbox_end",
            EventRef::FileStart { .. } => "file_start",
            EventRef::FileContent { .. } => "file_content",
            EventRef::FileEnd => "file_end",
            EventRef::InstallStart => "install_start",
            EventRef::InstallContent { .. } => "install_content",
            EventRef::InstallEnd => "install_end",
            EventRef::Command { .. } => "command",
            EventRef::WebSearch { .. } => "web_search",
            EventRef::Done => "done",
            EventRef::Error { .. } => "error",
        }
    }

    /// The JSON form of PROTOCOL.md §7, as [`Event::to_json`].
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(64);
        self.write_json(&mut out);
        out
    }

    /// Append [`EventRef::to_json`]'s output to `out` (no newline).
    pub fn write_json(&self, out: &mut String) {
        use crate::json::write_json_string as string;
        out.push_str("{\"type\":\"");
        out.push_str(self.kind());
        out.push('"');
        let field = |out: &mut String, name: &str| {
            out.push_str(",\"");
            out.push_str(name);
            out.push_str("\":");
        };
        match *self {
            EventRef::Text { content }
            | EventRef::ThinkingContent { content }
            | EventRef::FileContent { content } => {
                field(out, "content");
                string(out, content);
            }
            EventRef::ThinkingStart
            | EventRef::ThinkingEnd
            | EventRef::SandboxEnd
            | EventRef::FileEnd
            | EventRef::InstallStart
            | EventRef::InstallEnd
            | EventRef::Done => {}
            EventRef::SandboxStart { project, base } => {
                if let Some(project) = project {
                    field(out, "project");
                    string(out, project);
                }
                if let Some(base) = base {
                    field(out, "base");
                    string(out, base);
                }
            }
            EventRef::FileStart { path } => {
                field(out, "path");
                string(out, path);
            }
            EventRef::InstallContent {
                dependencies,
                framework,
            } => {
                field(out, "dependencies");
                string_array(out, dependencies);
                if let Some(framework) = framework {
                    field(out, "framework");
                    string(out, framework);
                }
            }
            EventRef::Command { command, args } => {
                field(out, "command");
                string(out, command);
                field(out, "args");
                string_array(out, args);
            }
            EventRef::WebSearch { query, max_results } => {
                field(out, "query");
                string(out, query);
                field(out, "max_results");
                out.push_str(&max_results.to_string());
            }
            EventRef::Error {
                code,
                message,
                severity,
                skipped_bytes,
            } => {
                field(out, "code");
                string(out, code.as_str());
                field(out, "message");
                string(out, message);
                field(out, "severity");
                string(out, severity.as_str());
                if let Some(skipped) = skipped_bytes {
                    field(out, "skipped_bytes");
                    out.push_str(&skipped.to_string());
                }
            }
        }
        out.push('}');
    }
}

impl From<EventRef<'_>> for Event {
    fn from(e: EventRef<'_>) -> Event {
        e.to_event()
    }
}

impl PartialEq<Event> for EventRef<'_> {
    fn eq(&self, other: &Event) -> bool {
        *self == other.as_event_ref()
    }
}

impl PartialEq<EventRef<'_>> for Event {
    fn eq(&self, other: &EventRef<'_>) -> bool {
        self.as_event_ref() == *other
    }
}

fn string_array(out: &mut String, items: &[String]) {
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        crate::json::write_json_string(out, item);
    }
    out.push(']');
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

impl Severity {
    /// The snake_case severity string.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Recoverable => "recoverable",
            Severity::Fatal => "fatal",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    fn samples() -> Vec<Event> {
        let weird = "q\"uote\\ back\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f} é 😀 </script> \u{2028}";
        let mut v = vec![
            Event::Text {
                content: weird.into(),
            },
            Event::Text {
                content: String::new(),
            },
            Event::ThinkingStart,
            Event::ThinkingContent {
                content: "plan".into(),
            },
            Event::ThinkingEnd,
            Event::SandboxStart {
                project: None,
                base: None,
            },
            Event::SandboxStart {
                project: Some("demo".into()),
                base: None,
            },
            Event::SandboxStart {
                project: None,
                base: Some(weird.into()),
            },
            Event::SandboxStart {
                project: Some("p".into()),
                base: Some("b".into()),
            },
            Event::SandboxEnd,
            Event::FileStart {
                path: "src/App.tsx".into(),
            },
            Event::FileContent {
                content: weird.into(),
            },
            Event::FileEnd,
            Event::InstallStart,
            Event::InstallContent {
                dependencies: vec![],
                framework: None,
            },
            Event::InstallContent {
                dependencies: vec!["react@18".into(), "@types/node".into()],
                framework: Some("vite".into()),
            },
            Event::InstallEnd,
            Event::Command {
                command: "npm".into(),
                args: vec![],
            },
            Event::Command {
                command: "sh".into(),
                args: vec!["-c".into(), weird.into()],
            },
            Event::WebSearch {
                query: weird.into(),
                max_results: 1,
            },
            Event::WebSearch {
                query: "x".into(),
                max_results: 8,
            },
            Event::Done,
            Event::Error {
                code: ErrorCode::InvalidFilePath,
                message: "…".into(),
                severity: Severity::Recoverable,
                skipped_bytes: Some(12),
            },
            Event::Error {
                code: ErrorCode::TagTooLong,
                message: weird.into(),
                severity: Severity::Fatal,
                skipped_bytes: None,
            },
            Event::Error {
                code: ErrorCode::InvalidDependency,
                message: String::new(),
                severity: Severity::Recoverable,
                skipped_bytes: Some(u64::MAX),
            },
        ];
        for code in [
            ErrorCode::TagTooLong,
            ErrorCode::UnclosedFile,
            ErrorCode::UnclosedSandbox,
            ErrorCode::UnclosedThinking,
            ErrorCode::UnclosedInstall,
            ErrorCode::NestedSandbox,
            ErrorCode::FileOutsideSandbox,
            ErrorCode::InvalidFilePath,
            ErrorCode::InvalidDependency,
            ErrorCode::MalformedCommand,
            ErrorCode::MalformedWebSearch,
        ] {
            v.push(Event::Error {
                code,
                message: code.to_string(),
                severity: Severity::Recoverable,
                skipped_bytes: None,
            });
        }
        // every char below 0x80 and a few beyond, one per event
        for c in (0u32..0x80).chain([0xa0, 0x2028, 0xfeff, 0x1f600]) {
            if let Some(c) = char::from_u32(c) {
                v.push(Event::FileContent {
                    content: format!("a{c}b"),
                });
            }
        }
        v
    }

    #[test]
    fn to_json_matches_serde_json_byte_for_byte() {
        for e in samples() {
            let ours = e.to_json();
            let theirs = serde_json::to_string(&e).unwrap();
            assert_eq!(ours, theirs, "{e:?}");
            let back: Event = serde_json::from_str(&ours).unwrap();
            assert_eq!(back, e);
        }
    }

    #[test]
    fn section_7_shapes() {
        let e = Event::Error {
            code: ErrorCode::InvalidFilePath,
            message: "…".into(),
            severity: Severity::Recoverable,
            skipped_bytes: Some(12),
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"error","code":"invalid_file_path","message":"…","severity":"recoverable","skipped_bytes":12}"#
        );
        assert_eq!(
            serde_json::to_string(&Event::ThinkingStart).unwrap(),
            r#"{"type":"thinking_start"}"#
        );
        assert_eq!(
            serde_json::to_string(&Event::SandboxStart {
                project: Some("demo".into()),
                base: None
            })
            .unwrap(),
            r#"{"type":"sandbox_start","project":"demo"}"#
        );
        assert_eq!(
            serde_json::to_string(&Event::WebSearch {
                query: "q".into(),
                max_results: 5
            })
            .unwrap(),
            r#"{"type":"web_search","query":"q","max_results":5}"#
        );
    }
}
