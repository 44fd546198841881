"""An MCP server over Streamable HTTP that requires OAuth 2.1, for the durable-agent tests,
written with the official Python SDK's auth support: the SDK's authorization-server routes
(RFC 8414 metadata, RFC 7591 dynamic client registration, authorize with PKCE, token,
revoke) on the in-memory provider below, the SDK's RFC 9728 protected-resource metadata, and
its bearer middleware in front of /mcp.

The grant is given at once: there is no login page, the test plays the browser. Access
tokens live ACCESS_TTL seconds (so a run outlives one and must refresh it); while the file
named by REFUSE_REFRESH exists, every refresh is refused as a revoked grant. Each grant,
refresh and tool call is written to the file EVENTS, one JSON object a line. It listens on
127.0.0.1 on a port the system picks, printed on stdout as `port N`, and runs until killed.
"""

import asyncio
import json
import os
import secrets
import socket
import sys
import time

import uvicorn
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthToken

ACCESS_TTL = int(os.environ.get("ACCESS_TTL", "3600"))
REFUSE_REFRESH = os.environ.get("REFUSE_REFRESH", "")
EVENTS = os.environ["EVENTS"]
SCOPE = "issues:read"


def event(kind: str, **fields) -> None:
    with open(EVENTS, "a") as f:
        f.write(json.dumps({"event": kind, **fields}) + "\n")


class Provider:
    """Clients, codes and tokens, in memory."""

    def __init__(self) -> None:
        self.clients = {}
        self.codes = {}
        self.access = {}
        self.refresh = {}

    async def get_client(self, client_id):
        return self.clients.get(client_id)

    async def register_client(self, client_info):
        self.clients[client_info.client_id] = client_info
        event("registered", redirect_uris=[str(u) for u in client_info.redirect_uris or []])

    async def authorize(self, client, params):
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        event("authorized", scopes=params.scopes)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code):
        return self.codes.get(authorization_code)

    def issue(self, client_id, scopes, resource):
        access = secrets.token_urlsafe(32)
        refresh = secrets.token_urlsafe(32)
        self.access[access] = AccessToken(
            token=access,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + ACCESS_TTL,
            resource=resource,
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource
        )
        return OAuthToken(
            access_token=access,
            expires_in=ACCESS_TTL,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )

    async def exchange_authorization_code(self, client, authorization_code):
        self.codes.pop(authorization_code.code, None)
        event("token")
        return self.issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token):
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token, scopes):
        if REFUSE_REFRESH and os.path.exists(REFUSE_REFRESH):
            event("refresh-refused")
            raise TokenError("invalid_grant", "the grant was revoked")
        self.refresh.pop(refresh_token.token, None)
        event("refreshed")
        return self.issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token):
        found = self.access.get(token)
        if found is None or (found.expires_at and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token):
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = MCPServer(
        "tracker",
        auth_server_provider=Provider(),
        auth=AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]
            ),
            required_scopes=[SCOPE],
            validate_token_resource=False,
        ),
    )

    @server.tool(description="Lists the open issues")
    def open_issues() -> str:
        event("called")
        return "2 open issues: #7 crash on empty input, #9 slow start"

    app = server.streamable_http_app()
    print(f"port {sock.getsockname()[1]}", flush=True)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            await uv.serve(sockets=[sock])

    asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
