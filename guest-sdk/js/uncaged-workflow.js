// Write uncaged-workflow bundles in JavaScript: roles as data, a moderator, one `define` call.
//
// The same model as the Rust SDK (guest-sdk/src) and the Python helper, on contract 0.3.0:
// each call of the host's `next()` runs the moderator, asks the agents the host bound to the
// chosen role or roles (`Next.parallel([...])`: all at once, the host runs them concurrently),
// extracts each role's meta with the host's extractor, and yields the steps together. The
// helper keeps the thread's steps itself; the host hands them over once. A thread started with
// recorded steps continues after them (resume, fork); it ends with return code 2 once it would
// hold more than `maxRounds` steps. Time comes from the host (`now`), never a guest clock.
//
//   // app.js
//   import { define, Next } from "uncaged-workflow";
//   export const workflow = define({
//     description: "Says the prompt back, once.",
//     roles: [{ name: "echo", description: "Repeats the prompt", schema: { type: "object" } }],
//     moderator: (thread) => (thread.steps.length === 0 ? Next.role("echo") : Next.done("echoed")),
//   });
//
// Build: jco componentize app.js --wit wit --world-name bundle --disable all -o app.wasm

import { agents, extract, now } from "uncaged:workflow/host@0.3.0";

export const RETURN_OK = 0;
export const RETURN_FAILED = 1;
export const RETURN_MAX_ROUNDS = 2;

/** A moderator's decision. */
export const Next = {
  role: (name) => ({ roles: [name] }),
  /** Run every role of `names` at once (a parallel group), e.g. three reviewers. */
  parallel: (names) => ({ roles: [...names] }),
  done: (summary) => ({ returnCode: RETURN_OK, summary }),
  fail: (returnCode, summary) => ({ returnCode, summary }),
};

/** The thread so far, as the moderator sees it. */
class ThreadContext {
  constructor(threadId, prompt, steps, maxRounds, triggerData) {
    this.threadId = threadId;
    this.prompt = prompt;
    this.steps = steps;
    this.maxRounds = maxRounds;
    this.triggerData = triggerData;
  }
  last() {
    return this.steps[this.steps.length - 1];
  }
  lastOf(role) {
    return [...this.steps].reverse().find((s) => s.role === role);
  }
  count(role) {
    return this.steps.filter((s) => s.role === role).length;
  }
}

const meta = (text) => {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
};

const toWit = (step) => ({
  role: step.role,
  content: step.content,
  meta: JSON.stringify(step.meta),
  timestamp: step.timestamp,
});

const errorText = (e) => {
  const payload = e && e.payload;
  if (!payload) return String(e);
  switch (payload.tag) {
    case "unavailable":
      return `unavailable: ${payload.val}`;
    case "timeout":
      return `timed out: ${payload.val}`;
    case "invalid-schema":
      return `invalid schema: ${payload.val}`;
    default:
      return String(payload.val);
  }
};

/**
 * Makes `definition` — `{ description, roles, moderator, maxRounds = 10, inputSchema }`, each
 * role `{ name, description, systemPrompt, extractPrompt, schema }` — the exported `workflow`.
 * `inputSchema`, a JSON Schema, says what data a thread starts with (`thread.triggerData`):
 * the host validates every start against it and shows it to callers; without one a thread
 * takes any data.
 */
export function define(definition) {
  const maxRounds = definition.maxRounds ?? 10;
  const roles = definition.roles.map((r) => ({
    name: r.name,
    description: r.description ?? "",
    systemPrompt: r.systemPrompt ?? "",
    extractPrompt: r.extractPrompt ?? "",
    schema: r.schema ?? { type: "object" },
  }));

  function advance(thread) {
    const decision = definition.moderator(thread);
    if (decision.roles === undefined) {
      return { returnCode: decision.returnCode, summary: decision.summary };
    }
    const names = decision.roles;
    if (names.length === 0) return { returnCode: RETURN_FAILED, summary: "moderator chose unknown role ``" };
    if (thread.steps.length + names.length > thread.maxRounds) {
      return {
        returnCode: RETURN_MAX_ROUNDS,
        summary: `reached max rounds (${thread.maxRounds}) before the workflow finished; next: \`${names.join("`, `")}\``,
      };
    }
    const chosen = [];
    for (const name of names) {
      const role = roles.find((r) => r.name === name);
      if (!role) return { returnCode: RETURN_FAILED, summary: `moderator chose unknown role \`${name}\`` };
      chosen.push(role);
    }
    const answers = agents(chosen.map((role) => ({ role: role.name, input: undefined })));
    const steps = [];
    for (const [i, role] of chosen.entries()) {
      const answer = answers[i];
      if (answer.tag === "err") {
        return {
          returnCode: RETURN_FAILED,
          summary: `agent for role \`${role.name}\` failed: ${errorText({ payload: answer.val })}`,
        };
      }
      const content = answer.val;
      let extracted;
      try {
        extracted = extract({ schema: JSON.stringify(role.schema), prompt: role.extractPrompt, content });
      } catch (e) {
        return {
          returnCode: RETURN_FAILED,
          summary: `could not extract the meta of role \`${role.name}\`: ${errorText(e)}`,
        };
      }
      steps.push({ role: role.name, content, meta: meta(extracted), timestamp: now() });
    }
    return { steps };
  }

  class Thread {
    constructor(input, options) {
      this.thread = new ThreadContext(
        options.threadId,
        input.prompt,
        input.steps.map((s) => ({ role: s.role, content: s.content, meta: meta(s.meta), timestamp: s.timestamp })),
        options.maxRounds,
        input.triggerData === undefined || input.triggerData === null ? undefined : meta(input.triggerData),
      );
      this.finished = null;
    }
    next() {
      if (this.finished === null) {
        const outcome = advance(this.thread);
        if (outcome.steps) {
          this.thread.steps.push(...outcome.steps);
          return { tag: "outputs", val: outcome.steps.map(toWit) };
        }
        this.finished = outcome;
      }
      return { tag: "done", val: this.finished };
    }
  }

  return {
    descriptor: () => ({
      description: definition.description,
      roles: roles.map((r) => ({ ...r, schema: JSON.stringify(r.schema) })),
      defaultMaxRounds: maxRounds,
      inputSchema: definition.inputSchema === undefined ? undefined : JSON.stringify(definition.inputSchema),
    }),
    Thread,
  };
}
