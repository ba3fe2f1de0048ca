// Edward's run page. No framework, no build step.
//
// Streaming uses fetch() and a small SSE parser instead of EventSource,
// because EventSource cannot send an Authorization header: the API key
// travels in that header only, never in a URL. The key is kept in
// sessionStorage (gone when the tab closes), or in localStorage when
// "remember on this device" is ticked. Every value from the server is
// rendered with textContent, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_NAME = "edward.apiKey";
const CHAT_NAME = "edward.chat";

const state = {
  key: sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "",
  runId: null,
  lastSeq: 0,       // the resume cursor: highest seq applied
  finished: false,
  abort: null,      // AbortController of the open stream
  retryMs: 2000,    // from the server's `retry:` hint
  files: new Map(), // path -> {size, writing, li}
  cmds: new Map(),  // key -> element
  usage: { input: 0, output: 0, turns: 0 },
  lastBlock: null,  // {kind, el} for coalescing text/thinking
  generation: 0,    // bumps when another run is opened
};

// `activeRun`: the run that keeps the chat busy (a `429` naming
// `error.active_run`), offered as a button.
function showError(msg, activeRun) {
  $("error-text").textContent = msg || "";
  $("error").hidden = !msg;
  const open = $("open-active");
  open.hidden = !activeRun;
  open.dataset.run = activeRun || "";
}

$("open-active").addEventListener("click", (e) => {
  const runId = e.target.dataset.run;
  showError("");
  if (runId) openRun(runId);
});

function authHeaders(extra) {
  return Object.assign({ Authorization: "Bearer " + state.key }, extra || {});
}

async function api(path, opts) {
  const res = await fetch(path, Object.assign({}, opts, { headers: authHeaders(opts && opts.headers) }));
  if (!res.ok) {
    let msg = res.status + " " + res.statusText;
    let activeRun = null;
    try {
      const body = await res.json();
      if (body && body.error) {
        msg = body.error.code + ": " + body.error.message;
        activeRun = body.error.active_run || null;
      }
    } catch (_) { /* not JSON */ }
    const err = new Error(msg);
    err.status = res.status;
    err.activeRun = activeRun;
    throw err;
  }
  return res;
}

// ---------------------------------------------------------------- key

function renderKeyState() {
  $("key-state").textContent = state.key ? "key set" : "no key";
  $("submit").disabled = !state.key;
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const key = $("key").value.trim();
  if (!key) return;
  state.key = key;
  sessionStorage.setItem(KEY_NAME, key);
  if ($("remember").checked) localStorage.setItem(KEY_NAME, key);
  else localStorage.removeItem(KEY_NAME);
  $("key").value = "";
  renderKeyState();
  loadRecent();
});

// ---------------------------------------------------------------- submit

// The chat is sticky: follow-up messages continue it (same workspace, the
// conversation so far) until "New chat" or another chat id.
function setChat(chat) {
  $("chat").value = chat || "";
  if (chat) sessionStorage.setItem(CHAT_NAME, chat);
  else sessionStorage.removeItem(CHAT_NAME);
}

$("chat").addEventListener("change", () => setChat($("chat").value.trim()));

$("new-chat").addEventListener("click", () => {
  setChat("");
  if (state.abort) state.abort.abort();
  state.generation += 1;
  state.runId = null;
  $("run").hidden = true;
  $("run-id").textContent = "";
  setStatus("—");
  showError("");
  $("prompt").focus();
});

$("run-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  showError("");
  const prompt = $("prompt").value;
  const chat = $("chat").value.trim() || "web-" + Math.random().toString(36).slice(2, 10);
  setChat(chat);
  const body = { chat_id: chat, prompt };
  const policy = $("double-texting").value;
  if (policy) body.double_texting = policy;
  $("submit").disabled = true;
  try {
    const res = await api("/v1/runs", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) },
      body: JSON.stringify(body),
    });
    const run = await res.json();
    openRun(run.run_id);
    loadRecent();
  } catch (err) {
    showError(err.message, err.activeRun);
  } finally {
    $("submit").disabled = !state.key;
  }
});

async function loadRecent() {
  if (!state.key) return;
  try {
    const res = await api("/v1/runs?limit=20");
    const page = await res.json();
    const sel = $("recent");
    while (sel.options.length > 1) sel.remove(1);
    for (const r of page.runs) {
      const opt = document.createElement("option");
      opt.value = r.run_id;
      opt.dataset.chat = r.chat_id;
      opt.textContent = r.status + " · " + r.created_at.slice(0, 19).replace("T", " ") + " · " + r.chat_id + " · " + r.run_id.slice(0, 8);
      sel.appendChild(opt);
    }
  } catch (_) { /* the list is a convenience */ }
}

$("recent").addEventListener("change", (e) => {
  const opt = e.target.selectedOptions[0];
  if (!e.target.value) return;
  // Continue the opened run's chat.
  if (opt && opt.dataset.chat) setChat(opt.dataset.chat);
  openRun(e.target.value);
});

// ---------------------------------------------------------------- run view

function openRun(runId) {
  if (state.abort) state.abort.abort();
  state.generation += 1;
  Object.assign(state, {
    runId, lastSeq: 0, finished: false, abort: null,
    files: new Map(), cmds: new Map(), usage: { input: 0, output: 0, turns: 0 }, lastBlock: null,
  });
  $("run").hidden = false;
  $("run-id").textContent = runId;
  $("log").replaceChildren();
  $("files").replaceChildren();
  $("viewer").hidden = true;
  $("budget").textContent = "";
  setStatus("queued");
  $("cancel").disabled = false;
  stream(state.generation);
  loadFiles(state.generation);
}

// The chat's workspace as it is now (earlier runs of the chat wrote files
// too: every run of a chat shares one workspace). Files this run is writing
// are left to its events.
async function loadFiles(gen) {
  const runId = state.runId;
  try {
    const res = await api("/v1/runs/" + runId + "/files");
    const list = await res.json();
    if (gen !== state.generation) return;
    for (const f of list.files) {
      const known = state.files.get(f.path);
      if (!known || !known.writing) upsertFile(f.path, f.size, false);
    }
  } catch (_) { /* the events still show this run's files */ }
}

function setStatus(s) {
  const el = $("status");
  el.textContent = s;
  el.className = "badge " + s;
  el.dataset.status = s;
}

function setConn(s) { $("conn").textContent = s; }

function logLine(cls, text) {
  const div = document.createElement("div");
  div.className = cls;
  div.textContent = text;
  $("log").appendChild(div);
  state.lastBlock = null;
  scrollLog();
  return div;
}

function appendText(kind, text) {
  if (!state.lastBlock || state.lastBlock.kind !== kind) {
    if (!text.trim()) return; // no empty-looking blocks between files
    const div = document.createElement("div");
    div.className = kind;
    $("log").appendChild(div);
    state.lastBlock = { kind, el: div };
  }
  state.lastBlock.el.textContent += text;
  scrollLog();
}

function scrollLog() {
  const pane = $("log").parentElement;
  pane.scrollTop = pane.scrollHeight;
}

function fmtBytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(1) + " MiB";
}

function upsertFile(path, size, writing) {
  let f = state.files.get(path);
  if (!f) {
    const li = document.createElement("li");
    const name = document.createElement("span");
    name.className = "path";
    name.textContent = path;
    const sz = document.createElement("span");
    sz.className = "size";
    li.append(name, sz);
    li.dataset.path = path;
    li.addEventListener("click", () => openFile(path));
    f = { size: 0, writing: true, li };
    state.files.set(path, f);
    const items = [...state.files.keys()].sort();
    const list = $("files");
    const idx = items.indexOf(path);
    list.insertBefore(li, list.children[idx] || null);
  }
  f.size = size;
  f.writing = writing;
  f.li.classList.toggle("writing", writing);
  f.li.querySelector(".size").textContent = fmtBytes(size);
  f.li.dataset.size = String(size);
}

async function openFile(path) {
  const runId = state.runId;
  try {
    const enc = path.split("/").map(encodeURIComponent).join("/");
    const res = await api("/v1/runs/" + runId + "/files/" + enc);
    const text = await res.text();
    if (runId !== state.runId) return;
    $("viewer-path").textContent = path;
    $("viewer-body").textContent = text;
    $("viewer").hidden = false;
  } catch (err) {
    showError(err.message);
  }
}

$("viewer-close").addEventListener("click", () => { $("viewer").hidden = true; });

function renderBudget() {
  const u = state.usage;
  let s = "turns " + u.turns + " · tokens in " + u.input + " / out " + u.output;
  if (u.cost != null) s += " · cost $" + Number(u.cost).toFixed(4);
  $("budget").textContent = s;
}

function cmdLine(p) {
  return "$ " + [p.command].concat(p.args || []).join(" ");
}

function apply(ev) {
  const p = ev.payload || {};
  switch (ev.type) {
    case "run_queued": setStatus("queued"); break;
    case "run_started": setStatus("running"); logLine("note", "started on " + p.worker + " with " + p.model); break;
    case "run_resumed": setStatus("running"); logLine("note", "resumed by " + p.worker + " after turn " + p.from_turn); break;
    case "run_waiting": logLine("note", "waiting for run " + p.behind + " of this chat to end"); break;
    case "framework_detected": logLine("context", "framework: " + p.framework + (p.evidence ? " (" + p.evidence + ")" : "")); break;
    case "context_prepared":
      logLine("context", "context: " + p.history_messages + " earlier messages (" + p.history_dropped + " dropped), " +
        p.files_listed + " files listed, " + p.files_included + " included, ~" + p.estimated_tokens + " tokens");
      break;
    case "cancel_requested": logLine("warn", "cancel requested"); break;
    case "turn_started": logLine("note", "turn " + p.turn); break;
    case "turn_finished":
      state.usage.turns = Math.max(state.usage.turns, p.turn || 0);
      if (p.usage) { state.usage.input += p.usage.input_tokens || 0; state.usage.output += p.usage.output_tokens || 0; }
      renderBudget();
      break;
    case "text_delta": appendText("text", p.content || ""); break;
    case "thinking_delta": appendText("thinking", p.content || ""); break;
    case "file_delta": {
      const f = state.files.get(p.path);
      upsertFile(p.path, (f && f.writing ? f.size : 0) + new TextEncoder().encode(p.content || "").length, true);
      break;
    }
    case "file_written": upsertFile(p.path, p.bytes, false); break;
    case "file_write_failed": logLine("warn", "write of " + p.path + " failed: " + p.error); break;
    case "install_started": {
      const el = logLine("cmd", "install (" + p.manager + ") " + (p.dependencies || []).join(" "));
      state.cmds.set(p.key, el);
      break;
    }
    case "command_started": {
      const el = logLine("cmd", cmdLine(p));
      el.dataset.key = p.key;
      state.cmds.set(p.key, el);
      break;
    }
    case "install_finished":
    case "command_finished": {
      const el = state.cmds.get(p.key) || logLine("cmd", cmdLine(p));
      const exit = document.createElement("span");
      const ok = p.exit_code === 0;
      exit.className = "exit " + (ok ? "ok" : "bad");
      exit.textContent = p.exit_code == null ? (p.timed_out ? "timed out" : "killed") : "exit " + p.exit_code;
      el.prepend(exit);
      const out = ((p.stdout || "") + (p.stderr || "")).trim();
      if (out) {
        const pre = document.createElement("pre");
        pre.textContent = out;
        el.appendChild(pre);
      }
      if (p.error) el.appendChild(document.createTextNode(" (" + p.error + ")"));
      break;
    }
    case "command_rejected": logLine("warn", cmdLine(p) + " — rejected: " + p.reason); break;
    case "tool_skipped": logLine("warn", p.tool + " skipped: " + p.budget + " budget"); break;
    case "web_search_started": logLine("note", "searching: " + p.query); break;
    case "budget_warning": logLine("warn", "budget " + p.budget + ": " + p.used + " of " + p.limit); break;
    case "parse_error": logLine("warn", "parse error " + p.code + ": " + p.message); break;
    case "model_retry": logLine("note", "model retry " + p.attempt + " in " + p.delay_ms + " ms"); break;
    case "build_started": {
      const cmd = Array.isArray(p.command) ? p.command.join(" ") : String(p.command || "");
      const el = logLine("cmd build", "build " + p.number + ": " + cmd);
      state.cmds.set("build-" + p.number, el);
      break;
    }
    case "build_finished": {
      const el = state.cmds.get("build-" + p.number) || logLine("cmd build", "build " + p.number);
      const exit = document.createElement("span");
      exit.className = "exit " + (p.status === "succeeded" ? "ok" : "bad");
      exit.textContent = p.status + (p.exit_code == null ? "" : " · exit " + p.exit_code) + " · " + p.duration_ms + " ms";
      el.prepend(exit);
      const out = (p.output || "").trim();
      if (out) {
        const pre = document.createElement("pre");
        pre.textContent = out;
        el.appendChild(pre);
      }
      if (p.autofix) logLine("note", "the build failed: one autofix turn follows");
      break;
    }
    case "run_finished":
      state.finished = true;
      loadFiles(state.generation);
      setStatus(p.status);
      if (p.turns != null) state.usage.turns = p.turns;
      if (p.usage) { state.usage.input = p.usage.input_tokens; state.usage.output = p.usage.output_tokens; }
      state.usage.cost = p.cost_usd;
      renderBudget();
      logLine("note", "finished: " + p.status + " (" + p.reason + ")");
      $("cancel").disabled = true;
      break;
    default: break;
  }
}

// ---------------------------------------------------------------- stream

// One SSE block ("field: value" lines up to a blank line) -> object.
function parseBlock(block) {
  const ev = { id: null, event: "message", data: null, retry: null };
  for (const line of block.split(/\r?\n/)) {
    if (line === "" || line.startsWith(":")) continue; // comments are heartbeats
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") ev.id = value;
    else if (field === "event") ev.event = value;
    else if (field === "data") ev.data = ev.data == null ? value : ev.data + "\n" + value;
    else if (field === "retry") ev.retry = parseInt(value, 10);
  }
  return ev;
}

// Follow the run until run_finished, reconnecting with Last-Event-ID after
// any drop. Events at or below lastSeq are ignored, so a reconnect never
// shows anything twice; the server resumes exactly after lastSeq, so
// nothing is lost.
async function stream(gen) {
  let failures = 0;
  while (gen === state.generation && !state.finished) {
    const ctrl = new AbortController();
    const before = state.lastSeq;
    let reconnectAsked = false;
    state.abort = ctrl;
    setConn(state.lastSeq ? "reconnecting after seq " + state.lastSeq + "…" : "connecting…");
    try {
      const res = await fetch("/v1/runs/" + state.runId + "/events", {
        headers: authHeaders({ Accept: "text/event-stream", "Last-Event-ID": String(state.lastSeq) }),
        signal: ctrl.signal,
        cache: "no-store",
      });
      if (res.status === 401 || res.status === 404) {
        const body = await res.json().catch(() => null);
        showError(body && body.error ? body.error.code + ": " + body.error.message : "HTTP " + res.status);
        setConn("");
        return;
      }
      if (!res.ok || !res.body) throw new Error("HTTP " + res.status);
      setConn("live");
      failures = 0;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
          const ev = parseBlock(block);
          if (ev.retry != null && !Number.isNaN(ev.retry)) state.retryMs = ev.retry;
          if (ev.event === "reconnect") { reconnectAsked = true; ctrl.abort(); break; }
          if (ev.id == null || ev.data == null) continue;
          const seq = Number(ev.id);
          if (seq <= state.lastSeq) continue;
          state.lastSeq = seq;
          $("conn").dataset.lastSeq = String(seq);
          apply(JSON.parse(ev.data));
        }
        if (ctrl.signal.aborted) break;
      }
    } catch (err) {
      if (gen !== state.generation) return;
      failures += 1;
    }
    if (gen !== state.generation || state.finished) break;
    // A stream that closed without progress (and was not asked to
    // reconnect) counts as a failure, so a broken proxy cannot make us spin.
    if (!reconnectAsked && state.lastSeq === before && failures === 0) failures = 1;
    const delay = failures ? Math.min(state.retryMs * failures, 15000) : 0;
    setConn("disconnected; retrying in " + Math.round(delay / 1000) + " s (after seq " + state.lastSeq + ")");
    await new Promise((r) => { setTimeout(r, delay); window.addEventListener("online", r, { once: true }); });
  }
  if (gen === state.generation) setConn(state.finished ? "done · " + state.lastSeq + " events" : "");
}

// ---------------------------------------------------------------- cancel

$("cancel").addEventListener("click", async () => {
  if (!state.runId) return;
  $("cancel").disabled = true;
  try {
    const res = await api("/v1/runs/" + state.runId + "/cancel", { method: "POST" });
    const body = await res.json();
    if (!state.finished) setStatus(body.status === "cancelled" ? "cancelled" : "cancelling");
  } catch (err) {
    showError(err.message);
    $("cancel").disabled = false;
  }
});

setChat(sessionStorage.getItem(CHAT_NAME) || "");
renderKeyState();
loadRecent();
