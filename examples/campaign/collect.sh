#!/usr/bin/env bash
# Stage 3: gather every property into results/summary.txt (submitted --after group:props).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../shell/flow.sh
source "$FLOW_BASH_API"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

dir="$(results_dir)"
{
    printf '# structure  a  B\n'
    sort -n "$dir"/props-*.txt
} >"$dir/summary.txt"
n="$(grep -vc '^#' "$dir/summary.txt")"
flow_succeed "collected $n structures into results/summary.txt"
