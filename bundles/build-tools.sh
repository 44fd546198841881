#!/usr/bin/env bash
# Installs the Python and JavaScript component toolchains into the project's own folders when
# missing (target/py-venv, target/js-tools), from PyPI and npm, at pinned versions.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPONENTIZE_PY=0.25.1
# The JavaScript tools are those the `new --lang js` scaffold pins (its package.json and
# package-lock.json): what the tests build with is what a new project installs.
# componentize-js 0.23 runs its WIT splicer on preview2-shim 0.17; 0.26 gives it no filesystem.
JS_PINS=runtime/templates/js

if [ ! -x target/py-venv/bin/componentize-py ] || \
   ! target/py-venv/bin/componentize-py --version 2>/dev/null | grep -q "$COMPONENTIZE_PY"; then
  python3 -m venv target/py-venv
  target/py-venv/bin/pip install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY"
fi

stamp=$(cat "$JS_PINS/package.json" "$JS_PINS/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ "$(cat target/js-tools/.installed 2>/dev/null)" != "$stamp" ]; then
  rm -rf target/js-tools
  mkdir -p target/js-tools
  for file in package.json package-lock.json; do
    sed 's/{{name}}/js-tools/' "$JS_PINS/$file" > "target/js-tools/$file"
  done
  (cd target/js-tools && npm ci --no-audit --no-fund --silent)
  echo "$stamp" > target/js-tools/.installed
fi
