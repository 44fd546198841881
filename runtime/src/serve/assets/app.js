// The web view of uncaged-workflow: a page per hash route, fetched from the HTTP API
// (/api/v1, the one other systems call, with this page's CSRF token as its session) and
// refreshed when /api/events says what it shows has changed.
//
// Everything shown comes from bundles, agents and poll commands: untrusted text. It is only
// ever put in the page as text (textContent, text nodes, SVG <text>), never parsed as HTML,
// and the only links built are to this page's own routes.
"use strict";

const CSRF = document.querySelector('meta[name="csrf"]').content;
const THREAD_ID = /^[0-9A-HJKMNP-TV-Z]{26}$/;
const STATUSES = ["running", "waiting", "paused", "interrupted", "completed", "failed", "killed"];

// ---------------------------------------------------------------- building the page, as text

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else node.setAttribute(key, shown(value));
  }
  append(node, children);
  return node;
}

// Text a bundle, an agent or a poll wrote is shown as the CLI shows it: control characters
// and the invisible ones that reorder or hide text (bidirectional overrides, zero-width
// characters) escaped as \u{…}; line breaks and tabs kept.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/g;
function shown(text) {
  return String(text).replace(HIDDEN, (c) => "\\u{" + c.codePointAt(0).toString(16) + "}");
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(shown(child)));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = shown(text);
  return node;
}

function threadLink(id, label) {
  if (!THREAD_ID.test(String(id))) return document.createTextNode(String(id));
  return el("a", { href: "#/thread/" + id, class: "mono" }, label || id);
}

function badge(status) {
  const known = STATUSES.includes(status) ? status : "";
  return el("span", { class: "badge " + known }, status);
}

function cut(text, max) {
  const s = String(text ?? "");
  return s.length > max ? s.slice(0, max) + "…" : s;
}

// Tokens in and out, and the cost where a price is configured.
function usageText(u) {
  const cached = u.cachedTokens ? ` (${u.cachedTokens} cached)` : "";
  const cost = typeof u.costUsd === "number" ? `, $${u.costUsd.toFixed(4)}` : "";
  return `${u.inputTokens} tokens in${cached}, ${u.outputTokens} out${cost}`;
}

function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "-";
}

function duration(ms) {
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " m " + Math.round(s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " m";
}

function ago(ms, now) {
  return duration(Math.max(0, (now || Date.now()) - ms)) + " ago";
}

function notice(text, error) {
  const box = document.getElementById("notice");
  box.textContent = shown(text);
  box.className = error ? "error" : "";
  box.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { box.hidden = true; }, error ? 8000 : 3000);
}

// ---------------------------------------------------------------- talking to the server

const API = "/api/v1";

async function get(path) {
  const response = await fetch(API + path, { headers: { accept: "application/json", "x-uncaged-csrf": CSRF } });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error?.message || response.statusText);
  return body;
}

async function post(path, body) {
  const response = await fetch(API + path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-uncaged-csrf": CSRF },
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error?.message || response.statusText);
  return answer;
}

// A page of HTML the server renders (an eval's report: every text in it escaped there), as
// nodes; parsed inertly, so nothing in it runs.
async function getHtml(path) {
  const response = await fetch(API + path, { headers: { accept: "text/html", "x-uncaged-csrf": CSRF } });
  const text = await response.text();
  if (!response.ok) throw new Error(JSON.parse(text).error?.message || response.statusText);
  const parsed = new DOMParser().parseFromString(text, "text/html");
  return [...parsed.body.childNodes].map((n) => document.adoptNode(n));
}

function act(id, action, body) {
  return post(`/threads/${id}/${action}`, body);
}

// ---------------------------------------------------------------- routes

let events = null;
let rendering = 0;
// The text a model is writing for the thread on the page, as /api/events sends it (`delta`):
// shown as it grows, gone once the thread's next step lands.
let liveText = { thread: null, steps: -1, role: "", turn: 0, text: "" };
let filters = { workflow: "", status: "" };

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean);
  if (parts[0] === "thread" && THREAD_ID.test(parts[1] || "")) return { view: "thread", id: parts[1] };
  if (parts[0] === "workflows") return { view: "workflows" };
  if (parts[0] === "schedules") return { view: "schedules" };
  if (parts[0] === "evals") return { view: "evals" };
  if (parts[0] === "eval" && THREAD_ID.test(parts[1] || "")) return { view: "eval", id: parts[1] };
  return { view: "threads" };
}

async function render() {
  const current = route();
  const key = location.hash || "#/";
  const ticket = ++rendering;
  for (const a of document.querySelectorAll("header nav a")) {
    const nav = { thread: "threads", eval: "evals" }[current.view] || current.view;
    a.classList.toggle("current", a.dataset.nav === nav);
  }
  let content;
  try {
    if (current.view === "thread") content = await threadView(current.id);
    else if (current.view === "workflows") content = await workflowsView();
    else if (current.view === "schedules") content = await schedulesView();
    else if (current.view === "evals") content = await evalsView();
    else if (current.view === "eval") content = await evalView(current.id);
    else content = await threadsView();
  } catch (e) {
    content = el("div", { class: "panel" }, el("strong", {}, "Could not load this view: "), e.message);
  }
  // A slower earlier render must not replace a newer one.
  if (ticket !== rendering) return;
  const view = document.getElementById("view");
  // Keep open what the reader opened.
  const open = new Set([...view.querySelectorAll("details[open]")].map((d) => d.dataset.key));
  const scroll = window.scrollY;
  // …and what they were typing: an answer, or the text of a decision about a tool call.
  const typed = new Map([...view.querySelectorAll("textarea[id]")].map((t) => [t.id, t.value]));
  view.replaceChildren(content);
  if (view.dataset.route === key) {
    for (const box of view.querySelectorAll("textarea[id]")) if (typed.get(box.id)) box.value = typed.get(box.id);
  }
  view.dataset.route = key;
  for (const d of view.querySelectorAll("details")) if (open.has(d.dataset.key)) d.open = true;
  window.scrollTo(0, scroll);
}

function listen() {
  const current = route();
  if (events) events.close();
  const query = current.view === "thread" ? "?thread=" + current.id : "";
  events = new EventSource("/api/events" + query);
  const live = document.getElementById("live");
  events.addEventListener("open", () => live.classList.add("on"));
  events.addEventListener("error", () => live.classList.remove("on"));
  events.addEventListener("change", () => render());
  events.addEventListener("delta", (e) => {
    const delta = JSON.parse(e.data);
    if (liveText.thread !== delta.thread || liveText.role !== delta.role || liveText.turn !== delta.turn) {
      liveText = { thread: delta.thread, steps: liveText.thread === delta.thread ? liveText.steps : -1, role: delta.role, turn: delta.turn, text: "" };
    }
    liveText.text += delta.text;
    const box = document.getElementById("live-text");
    if (box) box.replaceChildren(liveBox());
    else render();
  });
}

// The live text's box: whose it is, and what it says so far.
function liveBox() {
  return el("div", {},
    el("div", { class: "muted" }, el("strong", {}, liveText.role), ` is writing (turn ${liveText.turn})…`),
    el("pre", { class: "content" }, liveText.text));
}

window.addEventListener("hashchange", () => { render(); listen(); });
window.addEventListener("DOMContentLoaded", () => { render(); listen(); });

// ---------------------------------------------------------------- evals

async function evalsView() {
  const evals = await get("/evals");
  const now = Date.now();
  const rows = evals.slice().reverse().map((e) => el("tr", { "data-eval": e.id },
    el("td", { class: "mono" }, el("a", { href: "#/eval/" + e.id }, e.id)),
    el("td", {}, e.workflow),
    el("td", { class: "text" }, cut(e.against, 100)),
    el("td", {}, e.threads),
    el("td", {}, ago(e.created, now)),
    el("td", {}, e.finished ? "finished" : "running or cut short")));
  return el("div", {},
    el("h1", {}, "Evals"),
    el("p", { class: "muted" }, "Recorded threads run again on a changed workflow, prompt or agent (`uncaged-workflow eval`), newest first."),
    evals.length === 0 ? el("p", { class: "muted" }, "No evals.") :
      el("table", {}, el("thead", {}, el("tr", {}, ["Eval", "Workflow", "On", "Threads", "Made", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)));
}

async function evalView(id) {
  return el("div", {}, await getHtml(`/evals/${id}/html`));
}

// ---------------------------------------------------------------- threads

async function threadsView() {
  const query = new URLSearchParams();
  if (filters.workflow) query.set("workflow", filters.workflow);
  if (filters.status) query.set("status", filters.status);
  const [page, workflows] = await Promise.all([get("/threads?" + query), get("/workflows")]);
  const threads = page.threads;
  const select = (name, options) => el("select", {
    "aria-label": name,
    on: { change: (e) => { filters[name] = e.target.value; render(); } },
  }, el("option", { value: "" }, "all"), options.map((o) => el("option", { value: o, selected: filters[name] === o }, o)));
  const now = Date.now();
  const rows = threads.map((t) => el("tr", { "data-thread": t.threadId },
    el("td", {}, threadLink(t.threadId)),
    el("td", {}, t.name),
    el("td", {}, badge(t.status), t.waitingFor ? el("span", { class: "muted" }, " waiting for " + cut(t.waitingFor, 40)) : null),
    el("td", {}, t.steps),
    el("td", {}, ago(t.timestamp, now)),
    el("td", {}, t.schedule || t.startedBy || "-"),
    el("td", { class: "text" }, cut(t.prompt, 100)),
  ));
  return el("div", {},
    el("h1", {}, "Threads"),
    el("div", { class: "filters" },
      el("label", {}, "Workflow ", select("workflow", workflows.map((w) => w.name))),
      el("label", {}, "Status ", select("status", STATUSES)),
      el("span", { class: "muted" }, `${threads.length} thread(s), newest first`)),
    threads.length === 0 ? el("p", { class: "muted" }, "No threads.") :
      el("table", { id: "threads" },
        el("thead", {}, el("tr", {}, ["Thread", "Workflow", "Status", "Steps", "Started", "Started by", "Prompt"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)));
}

// ---------------------------------------------------------------- workflows and schedules

async function workflowsView() {
  const workflows = await get("/workflows");
  return el("div", {},
    el("h1", {}, "Workflows"),
    workflows.length === 0 ? null : startForm(workflows),
    workflows.length === 0 ? el("p", { class: "muted" }, "No workflows: `uncaged-workflow add NAME FILE`.") :
      workflows.map((w) => el("div", { class: "panel" },
        el("h2", {}, w.name, " ", el("span", { class: "mono muted" }, w.hash), w.declarative ? " · YAML" : "",
          " ", el("span", { class: "phase muted", "data-phase": w.phase }, w.phase)),
        el("p", {}, w.description),
        el("table", {},
          el("thead", {}, el("tr", {}, el("th", {}, "Role"), el("th", {}, "Description"))),
          el("tbody", {}, w.roles.map((r) => el("tr", {}, el("td", {}, r.name), el("td", { class: "text" }, r.description))))),
        el("p", { class: "muted" }, "Current since ", when(w.since),
          w.history.length ? ` · earlier versions: ${w.history.map((v) => v[0]).join(", ")}` : " · no earlier versions"))));
}

// Starts a thread through the API, as any other system would, and opens it. A workflow that
// declares its input gets a field per property of its schema (typed as the schema says, the
// required ones marked); the server validates the data and names the field it refuses.
function startForm(workflows) {
  const workflow = el("select", { id: "start-workflow", "aria-label": "workflow" },
    workflows.map((w) => el("option", { value: w.name }, w.name)));
  const prompt = el("textarea", { id: "start-prompt", rows: 3, placeholder: "What the thread should do", "aria-label": "prompt" });
  const fields = el("div", { id: "start-data" });
  let read = () => undefined;
  const showFields = () => {
    const chosen = workflows.find((w) => w.name === workflow.value);
    fields.replaceChildren();
    read = inputFields(fields, chosen && chosen.inputSchema);
  };
  workflow.addEventListener("change", showFields);
  showFields();
  const button = el("button", {
    id: "start",
    on: {
      click: async () => {
        button.disabled = true;
        try {
          const body = { workflow: workflow.value, prompt: prompt.value };
          const data = read();
          if (data !== undefined) body.data = data;
          const started = await post("/threads", body);
          notice("Started thread " + started.id);
          location.hash = "#/thread/" + started.id;
        } catch (e) {
          notice(e.message, true);
        } finally {
          button.disabled = false;
        }
      },
    },
  }, "Start a thread");
  return el("div", { class: "panel start" }, el("h2", {}, "Start a thread"),
    el("label", {}, "Workflow ", workflow), prompt, fields, button);
}

// The fields of an input schema's top-level properties, added to `box`; returns what reads
// them as the thread's data (undefined when the workflow declares no input). A property the
// form cannot type (an object, an array, a union) is a JSON field.
function inputFields(box, schema) {
  if (!schema || typeof schema !== "object") return () => undefined;
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const readers = [];
  for (const [name, property] of Object.entries(schema.properties || {})) {
    const p = property && typeof property === "object" ? property : {};
    const id = "start-data-" + name.replace(/[^A-Za-z0-9_-]/g, "_");
    let input;
    let value;
    if (Array.isArray(p.enum) && p.enum.every((v) => typeof v === "string")) {
      input = el("select", { id }, required.has(name) ? null : el("option", { value: "" }, ""),
        p.enum.map((v) => el("option", { value: v }, v)));
      value = () => input.value === "" ? undefined : input.value;
    } else if (p.type === "boolean") {
      input = el("input", { id, type: "checkbox" });
      value = () => input.checked;
    } else if (p.type === "integer" || p.type === "number") {
      input = el("input", { id, type: "number", step: p.type === "integer" ? "1" : "any" });
      value = () => input.value === "" ? undefined : Number(input.value);
    } else if (p.type === "string") {
      input = el("input", { id, type: "text" });
      value = () => input.value === "" ? undefined : input.value;
    } else {
      input = el("textarea", { id, rows: 2, placeholder: "JSON" });
      value = () => {
        if (input.value.trim() === "") return undefined;
        try { return JSON.parse(input.value); } catch (e) { throw new Error(`${name}: not JSON: ${e.message}`); }
      };
    }
    const label = name + (required.has(name) ? " *" : "");
    box.append(el("label", { class: "field", title: typeof p.description === "string" ? p.description : null },
      label + " ", input));
    readers.push([name, value]);
  }
  return () => {
    const data = {};
    for (const [name, value] of readers) {
      const v = value();
      if (v !== undefined) data[name] = v;
    }
    return data;
  };
}

async function schedulesView() {
  const schedules = await get("/schedules");
  const trigger = (t, workflow) => t.type === "cron"
    ? `cron ${t.expression} (${t.timezone || "UTC"})`
    : t.type === "webhook" ? `webhook POST /hooks/${workflow}`
    : `poll ${t.command.join(" ")} every ${duration(t.everyMs)} (${t.diff})`;
  const now = Date.now();
  return el("div", {},
    el("h1", {}, "Schedules"),
    schedules.length === 0 ? el("p", { class: "muted" }, "No schedules: `uncaged-workflow schedule add`.") :
      el("table", {},
        el("thead", {}, el("tr", {}, ["Schedule", "Workflow", "Trigger", "Next firing", "Fired", "Last fired", "State"].map((h) => el("th", {}, h)))),
        el("tbody", {}, schedules.map((s) => el("tr", {},
          el("td", {}, s.name),
          el("td", {}, s.workflow),
          el("td", { class: "mono text" }, cut(trigger(s.trigger, s.workflow), 120)),
          el("td", {}, s.next ? when(s.next) : "-"),
          el("td", {}, s.fired),
          el("td", {}, s.lastFired ? ago(s.lastFired, now) : "-"),
          el("td", { class: "text" }, s.paused ? "paused" : s.lastError ? "failing: " + cut(s.lastError, 200) : "active"))))));
}

// ---------------------------------------------------------------- one thread

async function threadView(id) {
  const t = await get("/threads/" + id);
  const start = t.start;
  const now = t.now;
  const head = el("div", {},
    el("h1", {}, "Thread ", el("span", { class: "mono" }, start.threadId), " ", badge(t.status)),
    el("div", { class: "panel" },
      el("div", {}, el("strong", {}, start.name), " ", el("span", { class: "mono muted" }, start.hash)),
      el("div", {}, el("span", { class: "muted" }, "Prompt: "), cut(start.parameters.prompt, 2000)),
      start.schedule ? el("div", { class: "muted" }, `Started by schedule ${start.schedule.name} (${cut(start.schedule.firing, 200)})`) : null,
      start.startedBy ? el("div", { class: "muted", id: "started-by" }, `Started by ${start.startedBy.via} ${start.startedBy.caller}${start.startedBy.client ? ` (${cut(start.startedBy.client, 80)})` : ""}`) : null,
      start.forkedFrom ? el("div", { class: "muted" }, "Forked from ", threadLink(start.forkedFrom.threadId), ` at step ${start.forkedFrom.step}`) : null,
      (t.upgrades || []).length ? el("div", { class: "muted", id: "upgrades" },
        t.upgrades.map((u) => el("div", {}, `Upgraded from ${u.from} to ${u.to} after step ${u.atStep}`))) : null,
      (t.retries || []).length ? el("div", { class: "muted", id: "retries" },
        t.retries.map((r) => el("div", {}, `Retried after step ${r.retry.fromStep} (it had failed: ${cut(r.retry.reason, 200)}) `, when(r.timestamp)))) : null,
      start.parent ? el("div", { class: "muted", id: "parent" }, "Child of ", threadLink(start.parent.threadId), ` (its step ${cut(start.parent.role, 80)})`) : null,
      t.children && t.children.length ? el("div", { class: "muted", id: "children" }, "Child threads: ",
        t.children.map((c, i) => el("span", {}, i ? ", " : "", threadLink(c.threadId), ` ${cut(c.name, 80)} `, badge(c.status)))) : null,
      el("div", { class: "muted" }, "Started ", when(start.timestamp)),
      t.usage ? el("div", { class: "muted", id: "usage" }, "Usage: ", usageText(t.usage)) : null,
      (t.notifications || []).length ? el("div", { class: "muted", id: "notifications" },
        t.notifications.map((n) => el("div", {}, `Notified (${n.kind}) through ${cut(n.channel, 80)}${n.recipient ? " to " + cut(n.recipient, 120) : ""}: ${n.state}, ${n.attempts} attempt(s)${n.lastError ? " — " + cut(n.lastError, 200) : ""}`))) : null,
      (t.decisions || []).length ? el("div", { class: "muted", id: "decisions" },
        t.decisions.map((d) => el("div", {}, `Step ${d.step + 1}: ${d.decision} by ${cut(d.by.who, 120)} through ${cut(d.by.via, 80)} `, when(d.timestamp)))) : null,
      working(t, now),
      actions(t)));
  return el("div", {},
    head,
    el("div", { class: "grid" },
      el("div", {}, el("h2", {}, "Routing"), graph(t)),
      el("div", {}, el("h2", {}, "Timeline"), timeline(t))),
    el("h2", {}, "Steps"),
    t.steps.length === 0 ? el("p", { class: "muted" }, "No steps yet.") : t.steps.map((s) => step(t, s)),
    inProgress(t),
    live(t),
    ending(t),
    el("h2", {}, "Debug log"),
    log(t));
}

// The turns and tool calls of the calls the thread has not answered yet.
function inProgress(t) {
  const loops = (t.inProgress || []).filter((l) => l.turns.length);
  if (!loops.length) return null;
  return el("div", { class: "panel", id: "in-progress" },
    el("div", { class: "muted" }, "In progress"),
    loops.map((l) => turns(l.turns, "in-progress-" + l.step + "-" + l.seq)));
}

// The model's text as it is written, while the thread runs (its step replaces it).
function live(t) {
  if (liveText.thread !== t.start.threadId) return null;
  if (liveText.steps !== t.steps.length) {
    if (liveText.steps !== -1) liveText.text = "";
    liveText.steps = t.steps.length;
  }
  if (!liveText.text || t.status !== "running") return null;
  return el("div", { class: "panel", id: "live-text" }, liveBox());
}

// A durable agent's turns: what the model said, and each tool call with where it stands.
function turns(list, key) {
  return el("details", { class: "turns", "data-key": key },
    el("summary", {}, `${list.length} model turn${list.length === 1 ? "" : "s"}, `,
      `${list.reduce((n, turn) => n + turn.toolCalls.length, 0)} tool calls`),
    list.map((turn) => el("div", { class: "turn" },
      el("div", { class: "muted" }, `Turn ${turn.turn} · ${duration(turn.durationMs)}${turn.usage ? " · " + usageText(turn.usage) : ""}`),
      turn.content ? el("pre", { class: "content" }, cut(turn.content, 4000)) : null,
      turn.toolCalls.length ? el("table", { class: "tool-calls" }, el("tbody", {}, turn.toolCalls.map((c) => el("tr", { "data-call": c.id },
        el("td", { class: "mono" }, cut(c.tool, 120)),
        el("td", { class: "mono text" }, cut(c.arguments, 400)),
        el("td", {}, el("span", { class: "call " + c.status }, c.status), c.durationMs !== undefined ? " " + duration(c.durationMs) : ""),
        el("td", { class: "text" }, c.result !== undefined ? el("pre", {}, cut(c.result, 1000)) : null,
          c.cutFrom ? el("div", { class: "muted" }, `cut from ${c.cutFrom} bytes`) : null))))) : null)));
}

function working(t, now) {
  if (t.working && t.working.waitingFor) {
    const role = t.working.role ? el("strong", {}, t.working.role) : "A request";
    return el("div", { id: "working" }, role, " waits for its turn in provider limit ",
      el("strong", { class: "mono" }, cut(t.working.waitingFor, 80)));
  }
  if (t.working && t.working.role) {
    const agent = t.working.agent ? ` (${cut(t.working.agent, 80)})` : "";
    const where = t.working.pid ? ` in worker ${t.working.pid}` : "";
    const since = t.working.workingSince || t.working.since;
    return el("div", { id: "working" }, el("strong", {}, t.working.role), ` is working${agent}${where}, for ${duration(Math.max(0, now - since))}`);
  }
  if (t.status === "waiting" && waitsOnChild(t)) {
    return el("div", { id: "working" }, el("strong", {}, t.paused.role || "?"), " runs child thread ", threadLink(t.paused.call.child));
  }
  if (t.status === "waiting" && t.paused && toolWait(t)) {
    const wait = toolWait(t);
    const why = wait.why === "approve" ? "to approve a call to " : "to decide about a cut call to ";
    return el("div", { id: "working" }, "Waiting for a person ", why, el("strong", { class: "mono" }, wait.tool));
  }
  if (t.status === "waiting" && t.paused) {
    return el("div", { id: "working" }, "Waiting for a person to answer for ", el("strong", {}, t.paused.role || "?"));
  }
  return null;
}

// The tool call a waiting thread's durable agent waits on a decision about, if any.
function toolWait(t) {
  return t.paused && t.paused.call && t.paused.call.tool ? t.paused.call.tool : null;
}

// Whether a waiting thread waits on a child workflow's thread (which answers, not a person).
function waitsOnChild(t) {
  return !!(t.paused && t.paused.call && t.paused.call.child);
}

function actions(t) {
  const id = t.start.threadId;
  const run = (action, body, label) => async (event) => {
    event.target.disabled = true;
    try {
      const answer = await act(id, action, body && body());
      notice(label(answer));
      if (action === "fork" && answer.thread) location.hash = "#/thread/" + answer.thread;
    } catch (e) {
      notice(`${action}: ${e.message}`, true);
    } finally {
      event.target.disabled = false;
      render();
    }
  };
  const buttons = [];
  if (t.status === "running") {
    buttons.push(el("button", { id: "pause", on: { click: run("pause", null, () => "The thread pauses after its current step.") } }, "Pause"));
  }
  if (!["completed", "failed", "killed"].includes(t.status)) {
    buttons.push(el("button", { id: "kill", class: "danger", on: { click: run("kill", null, () => "Killed.") } }, "Kill"));
  }
  if (t.status === "paused" || t.status === "interrupted") {
    buttons.push(el("button", { id: "resume", on: { click: run("resume", null, () => "Resumed.") } }, "Resume"));
  }
  buttons.push(el("button", { id: "fork", on: { click: run("fork", null, (a) => "Forked into " + a.thread) } }, "Fork all steps"));
  const box = el("div", { class: "actions" }, buttons);
  const wait = toolWait(t);
  if (t.status === "waiting" && wait) {
    // The call, its arguments and what the model said before it: a person decides.
    const text = el("textarea", { id: "decision-text", placeholder: wait.why === "approve" ? "Why not (the model is told)" : "What the model is given instead of the result" });
    const decide = (decision, label, needsText) => el("button", { id: decision + "-call", on: { click: run("answer", () => needsText ? { decision, text: text.value } : { decision }, () => label) } }, decision[0].toUpperCase() + decision.slice(1));
    const choices = wait.why === "approve"
      ? [decide("approve", "Approved; the call is made.", false), decide("deny", "Denied; the model is told why.", true)]
      : [decide("redo", "The call is made again.", false), decide("skip", "Skipped; the model is given your text.", true)];
    return el("div", {}, box,
      el("div", { class: "panel", id: "tool-wait" },
        el("div", {}, wait.why === "approve" ? "The agent asks to call " : "A crash cut this call, which may not be safe to repeat: ",
          el("strong", { class: "mono" }, wait.tool)),
        wait.reasoning ? el("pre", { class: "content" }, wait.reasoning) : null,
        el("div", { class: "muted" }, "Arguments"),
        el("pre", { class: "mono", id: "tool-arguments" }, wait.arguments),
        text, el("div", { class: "actions" }, choices)));
  }
  if (t.status === "waiting" && !waitsOnChild(t)) {
    const text = el("textarea", { id: "answer-text", placeholder: t.expected ? "JSON like " + t.expected : "Your answer" });
    const send = el("button", { id: "answer", on: { click: run("answer", () => ({ text: text.value }), () => "Answered; the thread continues.") } }, "Answer");
    const hint = t.expected ? el("p", { class: "muted" }, "The answer holds JSON like ", el("code", {}, t.expected)) : null;
    return el("div", {}, box, el("label", {}, "Answer for ", el("strong", {}, t.paused.role || "?")), hint, text, send);
  }
  return box;
}

// Statuses of the routing's nodes, from the thread's steps.
function nodeStatuses(t) {
  const status = new Map();
  for (const s of t.steps) {
    if (s.role === "$status" && s.meta && typeof s.meta.step === "string") {
      status.set(s.meta.step, s.meta.status === "skipped" ? "skipped" : "failed");
    } else if (s.role !== "$user" && s.role !== "$status") {
      status.set(s.role, "done");
    }
  }
  if (t.working && t.working.role) status.set(t.working.role, "running");
  if (t.status === "waiting" && t.paused && t.paused.role) status.set(t.paused.role, "waiting");
  return status;
}

function graph(t) {
  const routing = t.routing || {};
  let nodes = [];
  let edges = [];
  if (routing.kind === "declared" && routing.routing && routing.routing.graph) {
    const seen = new Set();
    for (const node of routing.routing.graph) {
      seen.add(node.from);
      for (const tr of node.transitions) {
        seen.add(tr.to);
        edges.push({ from: node.from, to: tr.to, label: tr.condition || "" });
      }
    }
    nodes = [...seen];
  } else if (routing.kind === "declared" && routing.routing && routing.routing.steps) {
    nodes = routing.routing.steps.steps.map((s) => s.id);
    for (const s of routing.routing.steps.steps) for (const d of s.depends_on) edges.push({ from: d, to: s.id });
  } else if (routing.kind === "taken") {
    const seen = new Set(["$START"]);
    for (const e of routing.edges) { seen.add(e.from); seen.add(e.to); edges.push({ from: e.from, to: e.to, count: e.count, taken: true }); }
    if (t.end) { seen.add("$END"); edges.push({ from: routing.last, to: "$END", taken: true }); }
    // The role at work, where the thread is going now.
    const next = t.working && t.working.role;
    if (next && !t.end) { seen.add(next); edges.push({ from: routing.last, to: next }); }
    nodes = [...seen];
  }
  if (nodes.length === 0) return el("p", { class: "muted" }, "No routing to draw.");
  // Transitions the thread took (consecutive roles), for a declared graph.
  const roles = ["$START", ...t.steps.filter((s) => !s.role.startsWith("$")).map((s) => s.role), ...(t.end ? ["$END"] : [])];
  const took = new Set();
  for (let i = 1; i < roles.length; i++) took.add(roles[i - 1] + "\u0000" + roles[i]);

  // Layers: the longest path from a root, ignoring edges that close a loop.
  const layer = new Map();
  const incoming = new Map(nodes.map((n) => [n, []]));
  for (const e of edges) if (incoming.has(e.to)) incoming.get(e.to).push(e.from);
  const order = breadthFirst(nodes, edges);
  for (const n of order) {
    let depth = 0;
    for (const from of incoming.get(n) || []) {
      if (order.indexOf(from) < order.indexOf(n) && layer.has(from)) depth = Math.max(depth, layer.get(from) + 1);
    }
    layer.set(n, n === "$END" ? Infinity : depth);
  }
  const finite = [...layer.values()].filter(Number.isFinite);
  const last = finite.length ? Math.max(...finite) : 0;
  if (layer.get("$END") === Infinity) layer.set("$END", last + 1);
  const rows = [];
  for (const n of order) (rows[layer.get(n)] ||= []).push(n);

  const W = 150, H = 34, GX = 24, GY = 46, PAD = 20;
  const widest = Math.max(...rows.filter(Boolean).map((r) => r.length));
  const width = PAD * 2 + widest * W + (widest - 1) * GX;
  const height = PAD * 2 + rows.length * H + (rows.length - 1) * GY;
  const at = new Map();
  rows.forEach((row, y) => {
    if (!row) return;
    const rowWidth = row.length * W + (row.length - 1) * GX;
    row.forEach((n, x) => at.set(n, { x: (width - rowWidth) / 2 + x * (W + GX), y: PAD + y * (H + GY) }));
  });
  const status = nodeStatuses(t);
  const root = svg("svg", { class: "graph", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": "routing graph" });
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 8, markerHeight: 8, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8890a8" }));
  defs.append(marker);
  root.append(defs);
  for (const e of edges) {
    const a = at.get(e.from), b = at.get(e.to);
    if (!a || !b) continue;
    const taken = e.taken || took.has(e.from + "\u0000" + e.to);
    let d;
    if (b.y > a.y) {
      d = `M ${a.x + W / 2} ${a.y + H} C ${a.x + W / 2} ${a.y + H + GY / 2}, ${b.x + W / 2} ${b.y - GY / 2}, ${b.x + W / 2} ${b.y}`;
    } else {
      // A loop back up: around the right side.
      const side = Math.max(a.x, b.x) + W + 14;
      d = `M ${a.x + W} ${a.y + H / 2} C ${side} ${a.y + H / 2}, ${side} ${b.y + H / 2}, ${b.x + W} ${b.y + H / 2}`;
    }
    const path = svg("path", { d, class: "edge" + (taken ? " taken" : ""), "marker-end": "url(#arrow)" });
    if (e.label) path.append(svg("title", {}, e.label));
    root.append(path);
    if (e.count > 1) root.append(svg("text", { class: "count", x: (a.x + b.x) / 2 + W / 2 + 4, y: (a.y + b.y + H) / 2 + 4 }, "×" + e.count));
  }
  for (const n of order) {
    const p = at.get(n);
    const terminal = n === "$START" || n === "$END";
    const cls = "node " + (terminal ? "terminal" : status.get(n) || "pending");
    const g = svg("g", { class: cls, "data-node": n, transform: `translate(${p.x} ${p.y})` });
    g.append(svg("rect", { width: W, height: H }));
    g.append(svg("text", { x: W / 2, y: H / 2 + 4, "text-anchor": "middle" }, cut(n, 20)));
    g.append(svg("title", {}, n + (status.get(n) ? " · " + status.get(n) : "")));
    root.append(g);
  }
  return root;
}

function breadthFirst(nodes, edges) {
  const out = new Map(nodes.map((n) => [n, []]));
  for (const e of edges) if (out.has(e.from)) out.get(e.from).push(e.to);
  const hasIncoming = new Set(edges.map((e) => e.to));
  const roots = nodes.includes("$START") ? ["$START"] : nodes.filter((n) => !hasIncoming.has(n));
  const order = [];
  const seen = new Set();
  const queue = [...roots];
  while (queue.length) {
    const n = queue.shift();
    if (seen.has(n)) continue;
    seen.add(n);
    order.push(n);
    for (const next of out.get(n) || []) if (!seen.has(next)) queue.push(next);
  }
  for (const n of nodes) if (!seen.has(n)) order.push(n);
  // `$END` last, whatever reached it first.
  const end = order.indexOf("$END");
  if (end >= 0) { order.splice(end, 1); order.push("$END"); }
  return order;
}

function timeline(t) {
  if (t.steps.length === 0) return el("p", { class: "muted" }, "No steps yet.");
  const begin = t.start.timestamp;
  const finish = Math.max(t.end ? t.end.timestamp : 0, ...t.steps.map((s) => s.timestamp), begin + 1);
  const span = finish - begin;
  return el("div", { class: "timeline panel" }, t.steps.map((s) => el("div", { class: "row" },
    el("div", { class: "label", title: `#${s.index} ${s.role}` }, `#${s.index} ${cut(s.role, 24)}`),
    el("div", { class: "track" }, (() => {
      const bar = el("div", { class: "bar" + (s.role === "$status" ? " status" : "") });
      bar.style.left = ((s.began - begin) / span) * 100 + "%";
      bar.style.width = (Math.max(s.durationMs, 0) / span) * 100 + "%";
      return bar;
    })()),
    el("div", { class: "dur" }, duration(s.durationMs)))));
}

function step(t, s) {
  const group = s.group ? ` · parallel steps ${s.group.first}-${s.group.first + s.group.size - 1}` : "";
  const fork = el("button", {
    class: "fork-here",
    on: { click: async (e) => {
      e.preventDefault();
      try {
        const answer = await act(t.start.threadId, "fork", { at: s.index });
        notice("Forked into " + answer.thread);
        location.hash = "#/thread/" + answer.thread;
      } catch (err) { notice("fork: " + err.message, true); }
    } },
  }, "Fork after this step");
  return el("details", { class: "step" + (s.group ? " group" : ""), "data-key": "step-" + s.index, "data-step": s.index },
    el("summary", {}, el("strong", {}, `#${s.index} ${cut(s.role, 64)}`), ` · ${duration(s.durationMs)} · ${when(s.timestamp)}${group}${s.usage ? " · " + usageText(s.usage) : ""}`),
    el("div", {},
      s.turns && s.turns.length ? turns(s.turns, "turns-" + s.index) : null,
      el("div", { class: "muted" }, "Content"),
      el("pre", { class: "content" }, s.content),
      el("div", { class: "muted" }, "Meta"),
      el("pre", { class: "meta" }, JSON.stringify(s.meta, null, 2)),
      fork));
}

function ending(t) {
  if (!t.end) return null;
  const end = t.end;
  return el("div", {},
    el("h2", {}, "End"),
    el("div", { class: "panel end " + end.status, id: "end" },
      badge(end.status), ` return code ${end.returnCode}${end.endedBy ? ", ended by the " + end.endedBy : ""} · ${when(t.end.timestamp)}`,
      el("pre", {}, end.summary)));
}

function log(t) {
  if (!t.log || t.log.length === 0) return el("p", { class: "muted" }, "Nothing logged.");
  return el("div", { class: "log" }, el("table", {},
    el("tbody", {}, t.log.map((line) => el("tr", {},
      el("td", { class: "mono" }, new Date(line.timestamp).toLocaleTimeString()),
      el("td", {}, line.level),
      el("td", { class: "mono" }, cut(line.tag, 40)),
      el("td", { class: "text" }, el("pre", {}, line.content)))))));
}
