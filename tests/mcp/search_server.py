"""An MCP server over Streamable HTTP for the durable-agent tests, written with the official
Python SDK. Every request must carry `Authorization: Bearer <SEARCH_TOKEN>` (the variable in
this server's environment), else it is refused with 401: a durable agent's binding sends the
header from its own variable. It listens on 127.0.0.1 on a port the system picks, printed on
stdout as `port N`, and runs until killed.
"""

import asyncio
import os
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from starlette.responses import JSONResponse

server = MCPServer("search")
TOKEN = os.environ["SEARCH_TOKEN"]


@server.tool(description="Searches the documents", annotations=ToolAnnotations(readOnlyHint=True))
def search(query: str) -> str:
    return f"3 documents match {query!r}"


def main() -> None:
    app = server.streamable_http_app()

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"port {sock.getsockname()[1]}", flush=True)
    # The app's lifespan (which runs its session manager) is entered here, around the server.
    uv = uvicorn.Server(uvicorn.Config(guarded, log_level="warning", lifespan="off"))

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            await uv.serve(sockets=[sock])

    asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
