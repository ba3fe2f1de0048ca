//! The scripted model: replays transcripts (one per turn); the embedded
//! default model and the workhorse of tests and benches.
//!
//! The turn is the number of assistant messages already in the request, so
//! a resumed run replays the same turn's transcript. When the transcripts run
//! out, the model answers with a final reply (`<edward_done/>` by default).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::engine::context::NEW_REQUEST;
use crate::pricing::estimate_tokens;
use crate::{
    FinishReason, ModelChunk, ModelClient, ModelError, ModelRequest, ModelStream, Role, Usage,
};

/// A function producing a turn's transcript from the request (to react to tool results).
pub type ScriptFn = Arc<dyn Fn(&ModelRequest) -> String + Send + Sync>;

/// One turn's transcript.
#[derive(Clone)]
pub enum Script {
    /// Fixed text.
    Text(String),
    /// Computed from the request.
    Func(ScriptFn),
}

impl fmt::Debug for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Script::Text(t) => f.debug_tuple("Text").field(&t.len()).finish(),
            Script::Func(_) => f.write_str("Func(..)"),
        }
    }
}

impl From<String> for Script {
    fn from(s: String) -> Self {
        Script::Text(s)
    }
}

impl From<&str> for Script {
    fn from(s: &str) -> Self {
        Script::Text(s.to_string())
    }
}

/// A [`ModelClient`] replaying transcripts with configurable chunking and delays.
#[derive(Clone)]
pub struct ScriptedModel {
    scripts: Vec<Script>,
    final_reply: String,
    chunk_bytes: usize,
    delay: Duration,
    requests: Arc<Mutex<Vec<ModelRequest>>>,
}

impl fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("scripts", &self.scripts)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl ScriptedModel {
    /// Replay `transcripts`, one per turn (64-byte chunks, no delay).
    pub fn new<I, S>(transcripts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<Script>,
    {
        ScriptedModel {
            scripts: transcripts.into_iter().map(Into::into).collect(),
            final_reply: "<edward_done/>".into(),
            chunk_bytes: 64,
            delay: Duration::ZERO,
            requests: Arc::default(),
        }
    }

    /// Chunk size in bytes (rounded to character boundaries; at least 1).
    pub fn with_chunk_bytes(mut self, n: usize) -> Self {
        self.chunk_bytes = n.max(1);
        self
    }

    /// Delay before each chunk (raced against the cancel token).
    pub fn with_delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    /// The reply once the transcripts are used up (default `<edward_done/>`).
    pub fn with_final_reply(mut self, s: impl Into<String>) -> Self {
        self.final_reply = s.into();
        self
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The built-in demo: a static todo app (index.html, style.css, app.js),
    /// no installs, `ls -la` to check, then a second turn that reads the
    /// listing and finishes. A follow-up message in the same chat (a request
    /// that carries earlier history) gets the follow-up transcript instead: it
    /// adds a dark mode toggle by rewriting `index.html`, a file the first run
    /// wrote, and adding `theme.js`.
    pub fn demo() -> Self {
        let first: ScriptFn = Arc::new(|req: &ModelRequest| {
            if is_follow_up(req) {
                DEMO_FOLLOW_UP.to_string()
            } else {
                DEMO_TURN_1.to_string()
            }
        });
        let check: ScriptFn = Arc::new(|req: &ModelRequest| {
            let last = req
                .messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map(|m| m.content.as_str())
                .unwrap_or("");
            let all = ["index.html", "style.css", "app.js"]
                .iter()
                .all(|f| last.contains(f));
            if all && last.contains("exit code 0") && is_follow_up(req) {
                "The listing shows theme.js next to the app. Reload index.html: the 🌙 button in the header switches between light and dark, and the choice is remembered.\n<edward_done/>".to_string()
            } else if all && last.contains("exit code 0") {
                "The listing shows index.html, style.css and app.js in the workspace, so the app is complete. Open index.html in a browser: add todos, tick them off, filter them, and they persist in localStorage.\n<edward_done/>".to_string()
            } else {
                "The listing did not show all three files; the files were written above, so I'll stop here. Open index.html in a browser to use the app.\n<edward_done/>".to_string()
            }
        });
        ScriptedModel::new([Script::Func(first), Script::Func(check)])
            .with_chunk_bytes(48)
            .with_delay(Duration::from_millis(4))
    }
}

/// Whether the request continues a chat (its prompt follows earlier history).
fn is_follow_up(req: &ModelRequest) -> bool {
    req.messages
        .iter()
        .any(|m| m.role == Role::User && m.content.contains(NEW_REQUEST))
}

/// The follow-up of the demo: "add a dark mode toggle".
const DEMO_FOLLOW_UP: &str = r#"I'll add a dark mode toggle: a button in the header of index.html, a small theme.js that flips a class on <body> and remembers the choice, and dark colours in dark.css.
<edward_sandbox project="todo-app">
<file path="index.html">
<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Todos</title>
  <link rel="stylesheet" href="style.css">
  <link rel="stylesheet" href="dark.css">
</head>
<body>
  <main class="app">
    <header class="top">
      <h1>Todos</h1>
      <button id="theme" class="theme" title="Toggle dark mode">🌙</button>
    </header>
    <form id="new-todo">
      <input id="title" autocomplete="off" placeholder="What needs doing?" required>
      <button type="submit">Add</button>
    </form>
    <nav class="filters">
      <button data-filter="all" class="active">All</button>
      <button data-filter="open">Open</button>
      <button data-filter="done">Done</button>
    </nav>
    <ul id="list"></ul>
    <p id="count"></p>
  </main>
  <script src="theme.js"></script>
  <script src="app.js"></script>
</body>
</html>
</file>
<file path="theme.js">
const THEME_KEY = "edward-theme";
const toggle = document.getElementById("theme");
function applyTheme(dark) {
  document.body.classList.toggle("dark", dark);
  toggle.textContent = dark ? "☀️" : "🌙";
}
applyTheme(localStorage.getItem(THEME_KEY) === "dark");
toggle.addEventListener("click", () => {
  const dark = !document.body.classList.contains("dark");
  localStorage.setItem(THEME_KEY, dark ? "dark" : "light");
  applyTheme(dark);
});
</file>
</edward_sandbox>
Now the dark colours, then a check of the workspace.
<edward_sandbox project="todo-app">
<file path="dark.css">
body.dark { background: #111827; color: #e5e7eb; }
body.dark .app { background: #1f2937; box-shadow: none; }
body.dark input { background: #111827; color: #e5e7eb; border-color: #374151; }
body.dark .filters button { background: #374151; color: #e5e7eb; }
body.dark li { border-color: #374151; }
.top { display: flex; align-items: center; justify-content: space-between; }
.theme { background: transparent; font-size: 1.25rem; }
</file>
</edward_sandbox>
<edward_command command="ls" args='["-la"]' />
"#;

/// Turn 1 of the demo.
const DEMO_TURN_1: &str = r#"I'll build a small todo app as a static page: HTML for the structure, CSS for the look, and plain JavaScript that keeps the todos in localStorage.
<Thinking>Three files, no build step and no dependencies. Then list the workspace to check the files landed.</Thinking>
<edward_sandbox project="todo-app">
<file path="index.html">
<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Todos</title>
  <link rel="stylesheet" href="style.css">
</head>
<body>
  <main class="app">
    <h1>Todos</h1>
    <form id="new-todo">
      <input id="title" autocomplete="off" placeholder="What needs doing?" required>
      <button type="submit">Add</button>
    </form>
    <nav class="filters">
      <button data-filter="all" class="active">All</button>
      <button data-filter="open">Open</button>
      <button data-filter="done">Done</button>
    </nav>
    <ul id="list"></ul>
    <p id="count"></p>
  </main>
  <script src="app.js"></script>
</body>
</html>
</file>
<file path="style.css">
* { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; background: #f4f4f7; margin: 0; }
.app { max-width: 32rem; margin: 3rem auto; background: #fff; padding: 1.5rem; border-radius: 12px; box-shadow: 0 2px 12px rgba(0,0,0,.08); }
h1 { margin-top: 0; }
form { display: flex; gap: .5rem; }
input { flex: 1; padding: .6rem; border: 1px solid #ccc; border-radius: 6px; }
button { padding: .6rem 1rem; border: 0; border-radius: 6px; background: #4f46e5; color: #fff; cursor: pointer; }
.filters { margin: 1rem 0; display: flex; gap: .25rem; }
.filters button { background: #e5e7eb; color: #111; }
.filters button.active { background: #4f46e5; color: #fff; }
ul { list-style: none; padding: 0; }
li { display: flex; align-items: center; gap: .5rem; padding: .5rem 0; border-bottom: 1px solid #eee; }
li.done span { text-decoration: line-through; color: #999; }
li span { flex: 1; }
li .remove { background: transparent; color: #c00; }
</file>
<file path="app.js">
const KEY = "edward-todos";
let todos = JSON.parse(localStorage.getItem(KEY) || "[]");
let filter = "all";

const list = document.getElementById("list");
const count = document.getElementById("count");

function save() {
  localStorage.setItem(KEY, JSON.stringify(todos));
}

function render() {
  list.innerHTML = "";
  const visible = todos.filter(t => filter === "all" || (filter === "done") === t.done);
  for (const todo of visible) {
    const li = document.createElement("li");
    li.className = todo.done ? "done" : "";
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = todo.done;
    box.addEventListener("change", () => { todo.done = box.checked; save(); render(); });
    const span = document.createElement("span");
    span.textContent = todo.title;
    const remove = document.createElement("button");
    remove.className = "remove";
    remove.textContent = "✕";
    remove.addEventListener("click", () => { todos = todos.filter(t => t !== todo); save(); render(); });
    li.append(box, span, remove);
    list.append(li);
  }
  const open = todos.filter(t => !t.done).length;
  count.textContent = `${open} open, ${todos.length - open} done`;
}

document.getElementById("new-todo").addEventListener("submit", e => {
  e.preventDefault();
  const input = document.getElementById("title");
  const title = input.value.trim();
  if (title) {
    todos.push({ title, done: false });
    input.value = "";
    save();
    render();
  }
});

for (const b of document.querySelectorAll(".filters button")) {
  b.addEventListener("click", () => {
    filter = b.dataset.filter;
    document.querySelectorAll(".filters button").forEach(x => x.classList.toggle("active", x === b));
    render();
  });
}

render();
</file>
</edward_sandbox>
Now let me check that the files are in place.
<edward_command command="ls" args='["-la"]' />
"#;

/// Split `text` into chunks of about `n` bytes on character boundaries.
fn chunks(text: &str, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(text.len() / n + 1);
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + n).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(text[start..end].to_string());
        start = end;
    }
    out
}

#[async_trait]
impl ModelClient for ScriptedModel {
    fn provider(&self) -> &str {
        "scripted"
    }

    async fn stream(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> Result<ModelStream, ModelError> {
        if cancel.is_cancelled() {
            return Err(ModelError::Cancelled);
        }
        // Turns of this run: replies after the chat's history, which ends
        // at the user message carrying the new request.
        let run_start = request
            .messages
            .iter()
            .rposition(|m| m.role == Role::User && m.content.contains(NEW_REQUEST))
            .unwrap_or(0);
        let turn = request.messages[run_start..]
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let text = match self.scripts.get(turn) {
            Some(Script::Text(t)) => t.clone(),
            Some(Script::Func(f)) => f(&request),
            None => self.final_reply.clone(),
        };
        let input_tokens = estimate_tokens(&request.system)
            + request
                .messages
                .iter()
                .map(|m| estimate_tokens(&m.content))
                .sum::<u64>();
        let usage = Usage {
            input_tokens,
            output_tokens: estimate_tokens(&text),
            estimated: true,
        };
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request);
        let mut items: Vec<ModelChunk> = chunks(&text, self.chunk_bytes)
            .into_iter()
            .map(ModelChunk::Text)
            .collect();
        items.push(ModelChunk::Usage(usage));
        items.push(ModelChunk::Finish(FinishReason::Stop));
        let delay = self.delay;
        let stream = futures::stream::unfold(
            (items.into_iter(), cancel, false),
            move |(mut it, cancel, stopped)| async move {
                if stopped {
                    return None;
                }
                let item = it.next()?;
                if !delay.is_zero() && matches!(item, ModelChunk::Text(_)) {
                    if cancel
                        .run_until_cancelled(tokio::time::sleep(delay))
                        .await
                        .is_none()
                    {
                        return Some((Err(ModelError::Cancelled), (it, cancel, true)));
                    }
                } else if cancel.is_cancelled() {
                    return Some((Err(ModelError::Cancelled), (it, cancel, true)));
                }
                Some((Ok(item), (it, cancel, false)))
            },
        );
        Ok(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::Message;

    fn req(assistant_turns: usize) -> ModelRequest {
        let mut messages = vec![Message {
            role: Role::User,
            content: "hi".into(),
        }];
        for _ in 0..assistant_turns {
            messages.push(Message {
                role: Role::Assistant,
                content: "x".into(),
            });
            messages.push(Message {
                role: Role::User,
                content: "results".into(),
            });
        }
        ModelRequest {
            model: "scripted".into(),
            system: "sys".into(),
            messages,
            max_output_tokens: None,
            temperature: None,
        }
    }

    async fn collect(m: &ScriptedModel, r: ModelRequest) -> (String, Option<Usage>) {
        let mut s = m.stream(r, CancellationToken::new()).await.unwrap();
        let mut text = String::new();
        let mut usage = None;
        while let Some(c) = s.next().await {
            match c.unwrap() {
                ModelChunk::Text(t) => text.push_str(&t),
                ModelChunk::Usage(u) => usage = Some(u),
                _ => {}
            }
        }
        (text, usage)
    }

    #[tokio::test]
    async fn replays_per_turn_then_final() {
        let m = ScriptedModel::new(["héllo wörld", "second"]).with_chunk_bytes(3);
        assert_eq!(collect(&m, req(0)).await.0, "héllo wörld");
        assert_eq!(collect(&m, req(1)).await.0, "second");
        let (t, u) = collect(&m, req(2)).await;
        assert_eq!(t, "<edward_done/>");
        assert!(u.unwrap().estimated);
        assert_eq!(m.requests().len(), 3);
    }

    #[tokio::test]
    async fn delay_races_cancel() {
        let m = ScriptedModel::new(["a".repeat(100)])
            .with_chunk_bytes(1)
            .with_delay(Duration::from_secs(3600));
        let cancel = CancellationToken::new();
        let mut s = m.stream(req(0), cancel.clone()).await.unwrap();
        cancel.cancel();
        assert_eq!(s.next().await, Some(Err(ModelError::Cancelled)));
        assert_eq!(s.next().await, None);
    }

    #[test]
    fn chunks_respect_char_boundaries() {
        let c = chunks("ééé", 1);
        assert_eq!(c.concat(), "ééé");
        assert!(c.iter().all(|s| !s.is_empty()));
    }
}
