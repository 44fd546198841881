// {{name}}: an uncaged-workflow bundle. One role answers the prompt; edit the roles and the
// moderator to make it yours.

import { define, Next } from "./uncaged-workflow.js";

export const workflow = define({
  description: "An assistant answers the prompt once.",
  maxRounds: 4,
  roles: [
    {
      name: "assistant",
      description: "Answers the prompt",
      systemPrompt: "You are a helpful assistant. Answer the user's prompt.",
      extractPrompt: "Put the answer in `answer`.",
      schema: {
        type: "object",
        required: ["answer"],
        properties: { answer: { type: "string" } },
        examples: [{ answer: "Hello!" }],
      },
    },
  ],
  moderator: (thread) => {
    const last = thread.last();
    return last ? Next.done(`answered: ${last.meta.answer ?? ""}`) : Next.role("assistant");
  },
});
