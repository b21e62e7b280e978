#!/usr/bin/env bash
# Stage 2: a "property" of relaxed structure $FLOW_ARRAY_INDEX, from stage 1's result (this
# job was submitted --after group:relax, so every relaxation has ended when it starts).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../shell/flow.sh
source "$FLOW_BASH_API"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

i="$FLOW_ARRAY_INDEX"
dir="$(results_dir)"
read -r _ a <"$dir/relax-$i.txt"
b="$(awk -v a="$a" 'BEGIN { printf "%.4f\n", 2 * a * a }')"
printf '%s %s %s\n' "$i" "$a" "$b" >"$dir/props-$i.txt"
flow_succeed "structure $i: B=$b"
