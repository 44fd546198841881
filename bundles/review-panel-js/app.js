// review-panel in JavaScript: a developer makes a change, then a security, a tests and a style
// reviewer review it in parallel; the developer revises until all three approve. The same
// workflow as bundles/review-panel (Rust): same roles, prompts, schemas and routing.

import { define, Next } from "uncaged-workflow";

const REVIEWERS = ["security-reviewer", "tests-reviewer", "style-reviewer"];

const reviewSchema = {
  type: "object",
  required: ["approved"],
  properties: {
    approved: { type: "boolean" },
    comments: { type: "array", items: { type: "string" } },
  },
  examples: [
    { approved: false, comments: ["Needs another look"] },
    { approved: true, comments: [] },
  ],
};

const roles = [
  {
    name: "developer",
    description: "Makes the change, or addresses every reviewer's comments",
    systemPrompt:
      "You are the developer. Make the change the task asks for. If reviewers left comments, address every one of them. Report what you changed.",
    extractPrompt: "Summarise the change and list the files changed.",
    schema: {
      type: "object",
      required: ["summary"],
      properties: {
        summary: { type: "string" },
        files_changed: { type: "array", items: { type: "string" } },
      },
      examples: [{ summary: "Validated the input and added tests", files_changed: ["src/input.rs", "tests/input.rs"] }],
    },
  },
  ...[
    ["security-reviewer", "security: untrusted input, secrets, injection"],
    ["tests-reviewer", "tests: is every change covered, do the tests prove it"],
    ["style-reviewer", "style: naming, structure, comments, consistency"],
  ].map(([name, focus]) => ({
    name,
    description: `Reviews the latest change for ${focus}`,
    systemPrompt: `You are a reviewer on a panel of three. Review the developer's latest change for ${focus}, and only that. Approve it, or say exactly what must change.`,
    extractPrompt: "Did the reviewer approve? List the requested changes.",
    schema: reviewSchema,
  })),
];

function moderator(thread) {
  const last = thread.last();
  if (!last) return Next.role("developer");
  if (last.role === "developer") return Next.parallel(REVIEWERS);
  // The last round's three reviews are the thread's last three steps.
  const reviews = thread.steps.slice(-REVIEWERS.length);
  if (reviews.map((s) => s.role).join() !== REVIEWERS.join()) {
    return Next.fail(1, `unexpected step \`${last.role}\` in thread`);
  }
  if (reviews.every((s) => s.meta.approved === true)) {
    return Next.done(`all three reviewers approved after ${thread.count("developer")} round(s)`);
  }
  return Next.role("developer");
}

export const workflow = define({
  description:
    "Review panel: a developer makes a change, then a security, a tests and a style reviewer review it in parallel; the developer revises until all three approve.",
  roles,
  moderator,
  maxRounds: 12,
});
