// A second MCP client for the tests, on the official TypeScript SDK (npm
// `@modelcontextprotocol/sdk`): over Streamable HTTP with a bearer token, it lists the tools and
// calls one, and prints what it got as one JSON line.
//
//   node ts_client.mjs URL TOKEN TOOL ARGUMENTS_JSON
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

// The SDK is installed under target/mcp-node (tests/mcp/install.sh), not beside this file.
const here = path.dirname(fileURLToPath(import.meta.url));
const nodeModules = process.env.MCP_NODE_MODULES ?? path.join(here, "../../target/mcp-node/node_modules");
const require = createRequire(path.join(nodeModules, "x.js"));
const { Client } = await import(require.resolve("@modelcontextprotocol/sdk/client/index.js"));
const { StreamableHTTPClientTransport } = await import(
  require.resolve("@modelcontextprotocol/sdk/client/streamableHttp.js")
);

const [url, token, tool, args] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "ts-test-client", version: "1.0.0" });
await client.connect(transport);
const tools = await client.listTools();
const progress = [];
const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, {
  onprogress: (p) => progress.push(p.message),
  timeout: 120000,
});
console.log(JSON.stringify({
  protocol: transport.protocolVersion ?? null,
  tools: tools.tools.map((t) => t.name),
  result,
  progress,
}));
await client.close();
