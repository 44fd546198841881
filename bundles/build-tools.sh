#!/usr/bin/env bash
# Installs the Python and JavaScript component toolchains into the project's own folders when
# missing (target/py-venv, target/js-tools), from PyPI and npm, at pinned versions.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPONENTIZE_PY=0.25.1
COMPONENTIZE_JS=0.23.0
# componentize-js 0.23 runs its WIT splicer on preview2-shim; 0.26 gives it no filesystem.
PREVIEW2_SHIM=0.17.2
ESBUILD=0.25.12

if [ ! -x target/py-venv/bin/componentize-py ] || \
   ! target/py-venv/bin/componentize-py --version 2>/dev/null | grep -q "$COMPONENTIZE_PY"; then
  python3 -m venv target/py-venv
  target/py-venv/bin/pip install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY"
fi

stamp="componentize-js@$COMPONENTIZE_JS preview2-shim@$PREVIEW2_SHIM esbuild@$ESBUILD"
if [ "$(cat target/js-tools/.installed 2>/dev/null)" != "$stamp" ]; then
  mkdir -p target/js-tools
  (cd target/js-tools && [ -f package.json ] || echo '{"private": true}' > package.json)
  (cd target/js-tools && npm install --no-audit --no-fund --silent \
    "@bytecodealliance/componentize-js@$COMPONENTIZE_JS" \
    "@bytecodealliance/preview2-shim@$PREVIEW2_SHIM" \
    "esbuild@$ESBUILD")
  echo "$stamp" > target/js-tools/.installed
fi
