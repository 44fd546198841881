#!/usr/bin/env bash
# Builds {{name}}.wasm: esbuild inlines the helper into one module, componentize-js makes it a
# component without WASI clocks, random or stdio (time comes from the host).
set -euo pipefail
cd "$(dirname "$0")"
tools="${JS_TOOLS:-node_modules/.bin}"
mkdir -p build
"$tools/esbuild" app.js --bundle --format=esm --platform=neutral "--external:uncaged:workflow/*" \
  --outfile=build/app.js --log-level=warning
"$tools/componentize-js" build/app.js --wit wit -n bundle -d stdio random clocks http fetch-event -o {{name}}.wasm
