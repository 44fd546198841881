"""An MCP server over stdio for the durable-agent tests, written with the official Python SDK.

Its tools stand for what real tools do: `append` writes a line to a ledger file (a side effect,
not safe to repeat: the crash tests count its lines), `read` reads it back (read-only, safe to
repeat), `slow` takes its time, `big` returns a huge result, `die` kills the server in the
middle of a call, and `environment` tells which variables the server was given. After its
first `append`, the server adds a tool `late`: a durable agent must not offer it to a call that
started before.

The ledger is the file the LEDGER_FILE variable names; each start of the server adds its
process id to `<ledger>.starts`. A file next to it named
`<ledger>.hang`, holding an entry, makes the `append` of that entry hang after writing, until
killed: a call cut in the middle.
"""

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("ledger")
LEDGER = os.environ["LEDGER_FILE"]
with open(LEDGER + ".starts", "a") as starts:
    starts.write(f"{os.getpid()}\n")


def late() -> str:
    """A tool added after the server started."""
    return "late"


@server.tool(description="Appends an entry to the ledger, once per call")
async def append(entry: str) -> str:
    with open(LEDGER, "a") as ledger:
        ledger.write(entry + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    if not any(t.name == "late" for t in server._tool_manager.list_tools()):
        server.add_tool(late, name="late")
    try:
        with open(LEDGER + ".hang") as hang:
            if hang.read().strip() == entry:
                await asyncio.sleep(3600)
    except FileNotFoundError:
        pass
    return f"appended {entry}"


@server.tool(description="Reads the ledger", annotations=ToolAnnotations(readOnlyHint=True))
def read() -> str:
    try:
        with open(LEDGER) as ledger:
            return ledger.read()
    except FileNotFoundError:
        return ""


@server.tool(description="Waits the given number of seconds")
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"waited {seconds}s"


@server.tool(description="Returns a result of the given number of mebibytes")
def big(mebibytes: int) -> str:
    return "x" * (mebibytes << 20)


@server.tool(description="Kills this server in the middle of the call")
def die() -> str:
    os._exit(3)


@server.tool(description="The names of this server's environment variables",
             annotations=ToolAnnotations(readOnlyHint=True))
def environment() -> str:
    return "\n".join(sorted(os.environ))


if __name__ == "__main__":
    server.run("stdio")
