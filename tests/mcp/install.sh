#!/usr/bin/env bash
# Installs the MCP servers the durable-agent tests run into the project's own folders when
# missing or out of date: the official Python SDK and mcp-server-time (PyPI) into
# target/mcp-venv, @modelcontextprotocol/server-filesystem (npm) into target/mcp-node, at the
# versions tests/mcp pins.
set -euo pipefail
cd "$(dirname "$0")/../.."

pins=tests/mcp
stamp=$(cat "$pins/requirements.txt" | sha256sum | cut -d' ' -f1)
if [ "$(cat target/mcp-venv/.installed 2>/dev/null)" != "$stamp" ]; then
  rm -rf target/mcp-venv
  python3 -m venv target/mcp-venv
  target/mcp-venv/bin/pip install --quiet --disable-pip-version-check -r "$pins/requirements.txt"
  echo "$stamp" > target/mcp-venv/.installed
fi

stamp=$(cat "$pins/package.json" "$pins/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ "$(cat target/mcp-node/.installed 2>/dev/null)" != "$stamp" ]; then
  rm -rf target/mcp-node
  mkdir -p target/mcp-node
  cp "$pins/package.json" "$pins/package-lock.json" target/mcp-node/
  (cd target/mcp-node && npm ci --no-audit --no-fund --silent)
  echo "$stamp" > target/mcp-node/.installed
fi
