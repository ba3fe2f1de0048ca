//! The system prompt and the continuation messages fed back to the model.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The system prompt: the tag protocol, in words a model can follow.
pub const SYSTEM_PROMPT: &str = r#"You are Edward, a coding agent. You build and change software projects inside a sandbox workspace by writing files and running commands. You act only through the tags below; everything outside tags is shown to the user as your reply, so keep it short and useful.

## Tags

1. Thinking (optional, private plan):
<Thinking>what you intend to do and why</Thinking>

2. Files. Put every file you create or change inside ONE sandbox block. Each <file> holds the COMPLETE new content of that file (never a diff, never "..." placeholders). Paths are relative to the workspace root; never absolute, never "..".
<edward_sandbox project="short-project-name">
<file path="index.html">
...entire file content...
</file>
<file path="src/app.js">
...entire file content...
</file>
</edward_sandbox>
Do not wrap file content in markdown fences and do not HTML-escape it: write the bytes exactly as they must appear on disk.

3. Packages (npm specs, one per line; installed before any later command runs):
<edward_install>
framework: vite
packages:
- react@18
- react-dom@18
</edward_install>

4. Commands (one program plus a JSON array of string arguments; no shell, no pipes, no redirection, no `cd`; paths must stay inside the workspace):
<edward_command command="npm" args='["run","build"]' />
<edward_command command="ls" args='["-la"]' />
Allowed programs are limited (typically npm, pnpm, node, npx, ls, cat, mkdir, mv, cp, rm, grep, find, head, tail, wc, echo, pwd, tsc, git). A refused command is reported back to you with the reason.

5. Web search (only when you truly need outside information):
<edward_web_search query="vite react template" max_results="3" />

6. Done. When the whole task is finished and verified, end your message with:
<edward_done/>

## How a run works

You work in turns. After each turn that wrote files or ran tools, you get a message with the results: every file written, every command with its exit code and (truncated) output, every install, refusal and error. Read them: fix failures (a non-zero exit code means something is wrong) and continue. Files you already wrote persist between turns; rewrite a file only to change it. Keep each turn focused; prefer a few complete files over many partial ones. Only emit <edward_done/> when the task is complete; if you produce a turn with no files, no commands and no done, you will be asked once to continue, and the run stops if it happens again. Budgets limit the number of turns, tool calls, tokens, cost and time.
"#;

/// The message sent when a turn made no progress.
pub const NUDGE_MESSAGE: &str = "Your last turn wrote no files, ran no commands and did not say done. Continue the task now using the tags (files in <edward_sandbox>, <edward_command …/>), or end with <edward_done/> if the task is already complete.";

/// One tool result reported back to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// Order within the turn (the effect index).
    pub index: u32,
    /// What it was, for the model (`command: ls -la`, `install: react`, `file: a.ts`).
    pub title: String,
    /// Exit code, when it ran.
    pub exit_code: Option<i32>,
    /// The text to show (already capped).
    pub body: String,
}

/// Keep `s` under `cap` bytes: head and tail with a marker saying how much was cut.
pub fn bounded(s: &str, cap: usize) -> String {
    if s.len() <= cap {
        return s.to_string();
    }
    let half = cap / 2;
    let mut head_end = half;
    while !s.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = s.len() - half;
    while !s.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &s[..head_end],
        tail_start - head_end,
        &s[tail_start..]
    )
}

/// Text gathered piece by piece, holding no more than what
/// [`bounded`]`(whole, cap)` shows: a turn's output can be any size without
/// the engine keeping all of it in memory.
#[derive(Debug)]
pub(crate) struct BoundedText {
    cap: usize,
    /// Everything, while it fits the cap; afterwards the head.
    head: String,
    /// The last bytes once over the cap (kept between `cap/2` and `cap`).
    tail: String,
    total: usize,
    over: bool,
}

impl BoundedText {
    pub(crate) fn new(cap: usize) -> Self {
        BoundedText {
            cap,
            head: String::new(),
            tail: String::new(),
            total: 0,
            over: false,
        }
    }

    /// Bytes pushed so far.
    pub(crate) fn len(&self) -> usize {
        self.total
    }

    pub(crate) fn push_str(&mut self, s: &str) {
        self.total += s.len();
        if !self.over {
            if self.head.len() + s.len() <= self.cap {
                self.head.push_str(s);
                return;
            }
            // Switch to head + tail: keep the first half as the head.
            self.over = true;
            let mut whole = std::mem::take(&mut self.head);
            whole.push_str(s);
            let mut head_end = (self.cap / 2).min(whole.len());
            while !whole.is_char_boundary(head_end) {
                head_end -= 1;
            }
            self.tail = whole.split_off(head_end);
            self.head = whole;
        } else {
            self.tail.push_str(s);
        }
        let half = self.cap / 2;
        if self.tail.len() > self.cap.max(half * 2).max(1) {
            let mut start = self.tail.len() - half;
            while !self.tail.is_char_boundary(start) {
                start += 1;
            }
            self.tail.drain(..start);
        }
    }

    /// What [`bounded`] would show of the whole text.
    pub(crate) fn view(&self) -> String {
        if !self.over {
            return self.head.clone();
        }
        let half = self.cap / 2;
        let mut start = self.tail.len().saturating_sub(half);
        while !self.tail.is_char_boundary(start) {
            start += 1;
        }
        let tail = &self.tail[start..];
        format!(
            "{}\n[… {} bytes omitted …]\n{}",
            self.head,
            self.total - self.head.len() - tail.len(),
            tail
        )
    }
}

/// At most this many files are listed one by one in a continuation message.
pub const MAX_LISTED_FILES: usize = 100;
/// At most this many tool results are shown in a continuation message.
pub const MAX_LISTED_RESULTS: usize = 50;

/// The user message that continues a run after a turn.
///
/// Bounded whatever the turn did: at most [`MAX_LISTED_FILES`] files and
/// [`MAX_LISTED_RESULTS`] results (each body at most `cap_per_result`
/// bytes) are listed, the rest counted.
pub fn continuation_message(
    turn: u32,
    files: &[(String, u64)],
    results: &[ToolResult],
    cap_per_result: usize,
) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "Results of turn {turn}:");
    if files.is_empty() {
        m.push_str("- No files were written.\n");
    } else {
        m.push_str("- Files written:\n");
        for (path, bytes) in files.iter().take(MAX_LISTED_FILES) {
            let _ = writeln!(m, "  - {path} ({bytes} bytes)");
        }
        if files.len() > MAX_LISTED_FILES {
            let rest = &files[MAX_LISTED_FILES..];
            let bytes: u64 = rest.iter().map(|(_, b)| b).sum();
            let _ = writeln!(m, "  - … and {} more files ({bytes} bytes)", rest.len());
        }
    }
    if results.len() > MAX_LISTED_RESULTS {
        let _ = writeln!(
            m,
            "- {} tool results; the first {MAX_LISTED_RESULTS} follow.",
            results.len()
        );
    }
    for r in results.iter().take(MAX_LISTED_RESULTS) {
        match r.exit_code {
            Some(code) => {
                let _ = writeln!(m, "- {} → exit code {code}", r.title);
            }
            None => {
                let _ = writeln!(m, "- {}", r.title);
            }
        }
        if !r.body.is_empty() {
            let _ = writeln!(
                m,
                "```\n{}\n```",
                bounded(&r.body, cap_per_result).trim_end()
            );
        }
    }
    m.push_str(
        "\nContinue with the task. Fix anything that failed. When everything is finished, end with <edward_done/>.",
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_keeps_head_and_tail() {
        let s = "a".repeat(100) + &"b".repeat(100);
        let b = bounded(&s, 50);
        assert!(b.starts_with(&"a".repeat(25)));
        assert!(b.ends_with(&"b".repeat(25)));
        assert!(b.contains("150 bytes omitted"));
        assert_eq!(bounded("short", 50), "short");
        // multi-byte safety
        let s = "é".repeat(100);
        let _ = bounded(&s, 51);
    }

    #[test]
    fn bounded_text_matches_bounded_without_keeping_everything() {
        for cap in [0usize, 1, 7, 50, 51, 1000] {
            for pieces in [vec!["a"; 300], vec!["héllo wörld "; 40], vec!["x"; 3]] {
                let mut t = BoundedText::new(cap);
                let mut whole = String::new();
                for p in &pieces {
                    t.push_str(p);
                    whole.push_str(p);
                    assert!(t.head.len() + t.tail.len() <= cap.max(2) * 2 + 16);
                }
                assert_eq!(t.len(), whole.len());
                assert_eq!(t.view(), bounded(&whole, cap), "cap {cap}");
            }
        }
    }

    #[test]
    fn continuation_message_is_bounded() {
        let files: Vec<(String, u64)> = (0..10_000)
            .map(|i| (format!("src/generated/file-{i:05}.ts"), 100))
            .collect();
        let results: Vec<ToolResult> = (0..500)
            .map(|i| ToolResult {
                index: i,
                title: format!("command `x{i}`: rejected"),
                exit_code: None,
                body: "y".repeat(10_000),
            })
            .collect();
        let m = continuation_message(1, &files, &results, 4096);
        assert!(m.len() < 300 * 1024, "{} bytes", m.len());
        assert!(m.len() < 50 * 4200 + 100 * 64 + 1024, "{} bytes", m.len());
        assert!(m.contains("… and 9900 more files (990000 bytes)"));
        assert!(m.contains("500 tool results; the first 50 follow."));
    }

    #[test]
    fn continuation_lists_exit_codes_and_output() {
        let m = continuation_message(
            2,
            &[("index.html".into(), 10)],
            &[ToolResult {
                index: 1,
                title: "command: ls -la".into(),
                exit_code: Some(0),
                body: "stdout:\nindex.html".into(),
            }],
            1000,
        );
        assert!(m.contains("index.html (10 bytes)"));
        assert!(m.contains("command: ls -la → exit code 0"));
        assert!(m.contains("stdout:\nindex.html"));
    }
}
