#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-py (pip install componentize-py==0.25.1).
set -euo pipefail
cd "$(dirname "$0")"
"${COMPONENTIZE_PY:-componentize-py}" -d wit -w bundle componentize -p . app -o {{name}}.wasm
