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

impl Event {
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
        let mut out = String::with_capacity(64);
        self.write_json(&mut out);
        out
    }

    /// Append [`Event::to_json`]'s output to `out` (no newline).
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
        match self {
            Event::Text { content }
            | Event::ThinkingContent { content }
            | Event::FileContent { content } => {
                field(out, "content");
                string(out, content);
            }
            Event::ThinkingStart
            | Event::ThinkingEnd
            | Event::SandboxEnd
            | Event::FileEnd
            | Event::InstallStart
            | Event::InstallEnd
            | Event::Done => {}
            Event::SandboxStart { project, base } => {
                if let Some(project) = project {
                    field(out, "project");
                    string(out, project);
                }
                if let Some(base) = base {
                    field(out, "base");
                    string(out, base);
                }
            }
            Event::FileStart { path } => {
                field(out, "path");
                string(out, path);
            }
            Event::InstallContent {
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
            Event::Command { command, args } => {
                field(out, "command");
                string(out, command);
                field(out, "args");
                string_array(out, args);
            }
            Event::WebSearch { query, max_results } => {
                field(out, "query");
                string(out, query);
                field(out, "max_results");
                out.push_str(&max_results.to_string());
            }
            Event::Error {
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
