#!/usr/bin/env bash
# Builds a Python or JavaScript bundle into a component against wit/.
#   bundles/build-bundle.sh python bundles/solve-issue-py target/bundles/solve_issue_py.wasm
#   bundles/build-bundle.sh js     bundles/solve-issue-js target/bundles/solve_issue_js.wasm
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lang="$1"; src="$2"; out="$3"
mkdir -p "$(dirname "$out")"
case "$lang" in
  python)
    "$root/target/py-venv/bin/componentize-py" -d "$root/wit" -w bundle componentize \
      -p "$root/guest-sdk/python" -p "$src" app -o "$out"
    ;;
  js)
    tools="$root/target/js-tools/node_modules/.bin"
    bundled="$(mktemp -d)/app.js"
    # One ES module with the helper inlined; host imports stay imports.
    "$tools/esbuild" "$src/app.js" --bundle --format=esm --platform=neutral \
      "--external:uncaged:workflow/*" "--alias:uncaged-workflow=$root/guest-sdk/js/uncaged-workflow.js" \
      --outfile="$bundled" --log-level=warning
    # Built without WASI clocks, random or stdio: time comes from the host's `now`.
    "$tools/componentize-js" "$bundled" --wit "$root/wit" -n bundle \
      -d stdio random clocks http fetch-event -o "$out"
    ;;
  *) echo "unknown language: $lang (python or js)" >&2; exit 64 ;;
esac
