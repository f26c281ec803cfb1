"use strict";
// ragspec document Q&A page: uploads, streamed answers (server-sent events over fetch), citations.

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

// -- API key: asked for once when the server answers 401, kept in sessionStorage (this tab only)
const KEY_STORE = "ragspec-api-key";

async function api(url, options = {}) {
  const key = sessionStorage.getItem(KEY_STORE);
  const headers = { ...(options.headers || {}) };
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(url, { ...options, headers });
  if (response.status === 401) {
    sessionStorage.removeItem(KEY_STORE);
    $("key-form").hidden = false;
    $("api-key").focus();
  }
  return response;
}

$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORE, key);
  $("api-key").value = "";
  $("key-form").hidden = true;
  loadSession();
});

async function errorBody(response) {
  // {message, code}: the server's {"error": ..., "code": ...}, or the status text.
  try {
    const body = await response.json();
    return { message: body.error || body.detail || response.statusText, code: body.code };
  } catch {
    return { message: response.statusText };
  }
}

const EMPTY = { documents: [], chunks: 0, skipped: [], notices: [], preloaded: false, preloaded_documents: [] };

function showSession(info) {
  const list = $("doc-list");
  const preloaded = info.documents.length ? [] : info.preloaded_documents || [];
  list.replaceChildren(...[...info.documents, ...preloaded].map((d) => el("li", { title: d }, d.split("/").pop())));
  if (info.documents.length) {
    const update = info.update
      ? ` Last indexing: ${info.update.files}; ${info.update.embedded} passages embedded in ${info.update.seconds.toFixed(1)} s` +
        (info.update.rebuilt ? ` (rebuilt: ${info.update.rebuilt})` : "") + "."
      : "";
    $("doc-status").textContent = `${info.documents.length} document(s), ${info.chunks} passages indexed.${update}`;
    $("doc-status").className = "muted";
  } else {
    $("doc-status").textContent = info.preloaded
      ? `Using the server's preloaded index${preloaded.length ? ` (${preloaded.length} document(s))` : ""}.`
      : "No documents yet.";
  }
  $("skipped-box").hidden = info.skipped.length === 0;
  $("skipped-list").replaceChildren(...info.skipped.map((s) => el("li", {}, `${s.path}: ${s.reason}`)));
  $("notice-list").replaceChildren(...(info.notices || []).map((n) => el("li", {}, n)));
  if (info.expired) setStatus(info.message, true);
}

function setStatus(text, isError = false) {
  $("doc-status").textContent = text;
  $("doc-status").className = isError ? "error" : "muted";
}

async function send(url, options, button) {
  button.disabled = true;
  try {
    const response = await api(url, options);
    if (!response.ok) {
      const error = await errorBody(response);
      if (error.code === "session_expired") showSession(EMPTY);
      setStatus(`Error ${response.status}: ${error.message}`, true);
      return;
    }
    showSession(await response.json());
  } catch (e) {
    setStatus(`Error: ${e}`, true);
  } finally {
    button.disabled = false;
  }
}

// -- indexing progress: the POST names a random id, and /api/progress?id= is polled until it returns
function progressId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16)); // (crypto.randomUUID needs a secure context)
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function duration(s) {
  if (s < 60) return `${Math.ceil(s)} s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s - 60 * m)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

function mib(n) {
  return `${(n / 2 ** 20).toFixed(1)} MiB`;
}

function progressLine(p) {
  // p is retrievers.SyncProgress.as_dict(): counts per stage, rate (passages/s when embedding) and eta_s.
  const eta = p.eta_s == null ? "" : ` · about ${duration(p.eta_s)} left`;
  if (p.stage === "scan") return `checking files ${p.files_done}/${p.files_total}`;
  if (p.stage === "chunk") {
    return `reading files ${p.files_done}/${p.files_total} · ${mib(p.bytes_done)} of ${mib(p.bytes_total)} · ` +
      `${p.chunks_done} passages found${eta}`;
  }
  if (p.stage === "embed") {
    const rate = p.rate == null ? "" : ` · ${p.rate.toFixed(1)} passages/s`;
    return `embedding passages ${p.chunks_done}/${p.chunks_total}${rate}${eta}`;
  }
  if (p.stage === "save") return "saving the index";
  return "starting";
}

async function sendWithProgress(url, options, button, label) {
  const id = progressId();
  let running = true;
  setStatus(`${label}…`);
  const timer = setInterval(async () => {
    try {
      const response = await api(`/api/progress?id=${id}`);
      const p = response.ok ? await response.json() : null;
      if (running && p && p.active) setStatus(`${label}: ${progressLine(p)}`);
    } catch {
      // a missed poll only delays the next line
    }
  }, 500);
  try {
    await send(`${url}?progress=${id}`, options, button);
  } finally {
    running = false;
    clearInterval(timer);
  }
}

$("upload-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const files = $("files").files;
  if (!files.length) return setStatus("Choose one or more files first.", true);
  const form = new FormData();
  for (const f of files) form.append("files", f, f.name);
  sendWithProgress("/api/documents", { method: "POST", body: form }, $("upload-btn"), `Indexing ${files.length} file(s)`);
});

$("folder-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const path = $("folder").value.trim();
  if (!path) return;
  sendWithProgress("/api/folder", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ path }),
  }, $("folder-btn"), `Indexing ${path}`);
});

$("new-chat-btn").addEventListener("click", () => {
  $("conversation").replaceChildren();
  send("/api/conversation", { method: "DELETE" }, $("new-chat-btn"));
});

$("clear-btn").addEventListener("click", () => {
  $("conversation").replaceChildren();
  send("/api/documents", { method: "DELETE" }, $("clear-btn"));
});

// -- passages ---------------------------------------------------------------------------------
function openPassage(citation, button) {
  document.querySelectorAll(".citation.active").forEach((b) => b.classList.remove("active"));
  if (button) button.classList.add("active");
  $("passage-title").textContent = `[${citation.number}] ${citation.title || citation.source.split("/").pop()}`;
  $("passage-source").textContent = [citation.source, citation.location].filter(Boolean).join(" · ");
  // The sentences the answer drew from (citation.quote, cut with "…" when long) marked in the passage.
  const quote = (citation.quote || "").replace(/…$/, "");
  const at = quote ? citation.text.indexOf(quote) : -1;
  $("passage-text").replaceChildren(...(at < 0 ? [citation.text] : [
    citation.text.slice(0, at), el("mark", {}, quote), citation.text.slice(at + quote.length)]));
  $("passage").hidden = false;
}
$("passage-close").addEventListener("click", () => { $("passage").hidden = true; });

function renderAnswer(node, html, citations) {
  // The answer's Markdown as the server rendered and sanitized it (apps/web/markdown.py), with the
  // [n] markers that name a citation turned into buttons that open it.
  const byNumber = new Map(citations.map((c) => [c.number, c]));
  node.innerHTML = html;
  node.classList.add("markdown");
  const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  const texts = [];
  while (walker.nextNode()) texts.push(walker.currentNode);
  for (const textNode of texts) {
    if (textNode.parentElement.closest("code, pre")) continue;
    const parts = textNode.data.split(/(\[\d+\])/);
    if (parts.length === 1) continue;
    textNode.replaceWith(...parts.map((part) => {
      const m = /^\[(\d+)\]$/.exec(part);
      const c = m && byNumber.get(Number(m[1]));
      return c ? el("button", { class: "cite-ref", type: "button", onclick: () => openPassage(c) }, part) : part;
    }));
  }
}

// -- asking -----------------------------------------------------------------------------------
function* parseEvents(buffer) {
  // Yields [event, data] for every complete "event: x\ndata: y\n\n" block; returns the rest.
  let end;
  while ((end = buffer.indexOf("\n\n")) >= 0) {
    const block = buffer.slice(0, end);
    buffer = buffer.slice(end + 2);
    let event = "message", data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) event = line.slice(7);
      else if (line.startsWith("data: ")) data += line.slice(6);
    }
    yield [event, JSON.parse(data)];
  }
  return buffer;
}

function statsLine(s) {
  // s is the generation's stats (ragspec's GenerationStats.reported()): figures an engine did not count
  // (tokens per forward behind vLLM; acceptance where nothing was drafted) are absent, never shown as zeros.
  const parts = [`<b>${s.decode_tokens_per_s.toFixed(1)} tokens/s</b>`];
  if (s.acceptance_rate !== undefined) parts.push(`acceptance ${(100 * s.acceptance_rate).toFixed(0)}%`);
  if (s.tokens_per_forward !== undefined) parts.push(`${s.tokens_per_forward.toFixed(2)} tokens/forward`);
  parts.push(`${s.new_tokens} tokens in ${s.wall_s.toFixed(1)} s`);
  return parts.join(" · ");
}

async function ask(question) {
  const answer = el("div", { class: "answer streaming" });
  const stats = el("div", { class: "stats" }, "waiting for the model…");
  const citeList = el("ul", { class: "citations" });
  const turn = el("div", { class: "turn" }, el("div", { class: "question" }, question), answer, citeList, stats);
  $("conversation").append(turn);
  turn.scrollIntoView({ block: "end" });

  // Stop: the page drops the connection; the server sees the client leave and stops generating.
  const controller = new AbortController();
  const stop = $("stop-btn");
  const onStop = () => controller.abort();
  stop.addEventListener("click", onStop);
  stop.hidden = false;
  let text = "", tokens = 0;
  try {
    await readAnswer(question, answer, stats, citeList, controller.signal, (delta) => { text += delta; tokens += 1; });
  } catch (e) {
    if (e.name !== "AbortError") throw e;
    if (!answer.classList.contains("streaming")) return;  // stopped after the answer was complete: keep it
    answer.classList.remove("streaming");
    answer.textContent = text;
    stats.replaceChildren(el("span", { class: "stopped" }, `stopped after ${tokens} token(s)`));
  } finally {
    stop.removeEventListener("click", onStop);
    stop.hidden = true;
  }
}

async function readAnswer(question, answer, stats, citeList, signal, onToken) {
  const response = await api("/api/ask", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ question }), signal,
  });
  if (!response.ok) {
    const error = await errorBody(response);
    if (error.code === "session_expired") showSession(EMPTY);
    answer.classList.remove("streaming");
    answer.classList.add("error");
    answer.textContent = `Error ${response.status}: ${error.message}`;
    stats.textContent = "";
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = parseEvents(buffer);
    let step;
    while (!(step = events.next()).done) {
      const [event, data] = step.value;
      if (event === "queued") stats.textContent = `queued: ${data.position} answer(s) ahead`;
      else if (event === "token") {
        text += data.text;
        onToken(data.text);
        answer.textContent = text;
        const perForward = data.tokens_per_forward === undefined
          ? `≈ ${data.tokens_per_step.toFixed(2)}` : data.tokens_per_forward.toFixed(2);
        const acceptance = data.acceptance === undefined ? "" : ` · acceptance ${(100 * data.acceptance).toFixed(0)}%`;
        stats.innerHTML = `streaming… <b>${data.tokens_per_s.toFixed(1)} tokens/s</b>${acceptance} · ` +
          `${data.tokens} tokens · ${perForward} tokens/forward`;
      } else if (event === "done") {
        answer.classList.remove("streaming");
        renderAnswer(answer, data.html, data.citations);
        citeList.replaceChildren(...data.citations.map((c) => {
          const label = [c.title || c.source.split("/").pop(), c.location].filter(Boolean).join(" · ");
          const b = el("button", { class: "citation", type: "button" }, el("b", {}, `[${c.number}]`), label);
          b.addEventListener("click", () => openPassage(c, b));
          return el("li", {}, b);
        }));
        if (data.supported === false) {
          citeList.append(el("li", { class: "unsupported" },
            (data.note || "I don't know: no passage backs this answer, so it may be a guess.") + " Check it against your documents."));
        }
        stats.innerHTML = statsLine(data.stats);
      } else if (event === "error") {
        answer.classList.remove("streaming");
        stats.innerHTML = "";
        stats.append(el("span", { class: "error" }, data.message));
      }
    }
    buffer = step.value;
  }
  answer.classList.remove("streaming");
}

$("ask-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  $("question").value = "";
  $("ask-btn").disabled = true;
  try {
    await ask(question);
  } finally {
    $("ask-btn").disabled = false;
    $("question").focus();
  }
});

function loadSession() {
  api("/api/session").then((r) => (r.ok ? r.json().then(showSession) : null)).catch(() => {});
}

loadSession();
