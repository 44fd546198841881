// A client of the tasks of protocol 2025-11-25, on the official TypeScript SDK (npm
// `@modelcontextprotocol/sdk` 1.x, which negotiates 2025-11-25): over Streamable HTTP with a
// bearer token, or over stdio by starting a command, it runs the steps of a plan and prints
// what each got as one JSON line.
//
//   node ts_tasks_client.mjs http URL TOKEN PLAN_JSON
//   node ts_tasks_client.mjs stdio COMMAND ARGS_JSON ENV_JSON PLAN_JSON
//
// A plan's step is one of:
//   {"op": "tools"}                                  the tools, each with its execution
//   {"op": "task", "tool", "args", "answers"?, "cancel"?}
//        calls the tool as a task (callToolStream), answering each elicitation with the next
//        of `answers` ({"answer": …} or a decision object), or cancelling the task once it
//        works when `cancel` is set; prints the messages' types, the task and the result
//   {"op": "start", "tool", "args"}   calls the tool as a task and leaves at once (the client
//                                     goes away: the task is picked up by another)
//   {"op": "list"}                                   tasks/list
//   {"op": "get", "task"}                            tasks/get of a task id
//   {"op": "result", "task", "answers"?}             tasks/result of a task id, answering as
//                                                    "task" does
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeModules = process.env.MCP_NODE_MODULES ?? path.join(here, "../../target/mcp-node/node_modules");
const require = createRequire(path.join(nodeModules, "x.js"));
const sdk = (p) => import(require.resolve(`@modelcontextprotocol/sdk/${p}`));
const { Client } = await sdk("client/index.js");
const { CallToolResultSchema, ElicitRequestSchema } = await sdk("types.js");

const [way, ...rest] = process.argv.slice(2);
let transport;
let plan;
if (way === "http") {
  const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
  const [url, token, steps] = rest;
  transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  plan = JSON.parse(steps);
} else {
  const { StdioClientTransport } = await sdk("client/stdio.js");
  const [command, args, env, steps] = rest;
  transport = new StdioClientTransport({ command, args: JSON.parse(args), env: JSON.parse(env), stderr: "ignore" });
  plan = JSON.parse(steps);
}
const client = new Client(
  { name: "ts-tasks-client", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
const answers = [];
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  const given = answers.shift();
  asked.push({ message: request.params.message, meta: request.params._meta ?? null, answered: given !== undefined });
  if (given === undefined) return { action: "decline" };
  return { action: "accept", content: given };
});
await client.connect(transport);
const say = (line) => console.log(JSON.stringify(line));
say({ protocol: transport.protocolVersion ?? null, capabilities: client.getServerCapabilities() });
for (const step of plan) {
  try {
    if (step.op === "tools") {
      const tools = await client.listTools();
      say({ tools: tools.tools.map((t) => ({ name: t.name, execution: t.execution ?? null })) });
    } else if (step.op === "task") {
      answers.splice(0, answers.length, ...(step.answers ?? []));
      asked.length = 0;
      const stream = client.experimental.tasks.callToolStream(
        { name: step.tool, arguments: step.args ?? {} },
        CallToolResultSchema,
        { task: { ttl: 60000 }, timeout: 120000 },
      );
      const seen = [];
      let task = null;
      let result = null;
      let error = null;
      for await (const message of stream) {
        seen.push(message.type === "taskStatus" ? `status:${message.task.status}` : message.type);
        if (message.type === "taskCreated") {
          task = message.task;
          if (step.cancel) await client.experimental.tasks.cancelTask(task.taskId);
        }
        if (message.type === "result") result = message.result;
        if (message.type === "error") error = String(message.error);
      }
      say({ seen, task, result, error, asked: [...asked] });
    } else if (step.op === "start") {
      const stream = client.experimental.tasks.callToolStream(
        { name: step.tool, arguments: step.args ?? {} },
        CallToolResultSchema,
        { task: { ttl: 60000 } },
      );
      for await (const message of stream) {
        if (message.type === "taskCreated") {
          say({ task: message.task });
          break;
        }
      }
    } else if (step.op === "result") {
      answers.splice(0, answers.length, ...(step.answers ?? []));
      say(await client.experimental.tasks.getTaskResult(step.task, CallToolResultSchema, { timeout: 120000 }));
    } else if (step.op === "list") {
      say(await client.experimental.tasks.listTasks());
    } else if (step.op === "get") {
      say(await client.experimental.tasks.getTask(step.task));
    } else {
      say({ error: `unknown op ${step.op}` });
    }
  } catch (e) {
    say({ error: `${e?.name}: ${e?.message}` });
  }
}
await client.close();
