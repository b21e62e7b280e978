#!/usr/bin/env bash
# Stage 1 of the campaign: "relax" structure $FLOW_ARRAY_INDEX. A few Newton steps on the
# toy energy E(a) = (a - a_eq)^2 from a guess; writes results/relax-<i>.txt.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../shell/flow.sh
source "$FLOW_BASH_API"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

i="$FLOW_ARRAY_INDEX"
eq="$(equilibrium "$i")"
a="$(awk -v eq="$eq" 'BEGIN { a = 4.0; for (k = 0; k < 60; k++) a -= (a - eq) / 2; printf "%.6f\n", a }')"
printf '%s %s\n' "$i" "$a" >"$(results_dir)/relax-$i.txt"
flow_succeed "structure $i relaxed to a=$a"
