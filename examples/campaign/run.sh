#!/usr/bin/env bash
# A two-stage campaign with a collection step, on a local workspace:
#
#   examples/campaign/run.sh [WORKSPACE]      (default: ./campaign-ws, made if missing)
#
# relax 8 structures (group relax), then compute a property of each once every
# relaxation has ended (group props, --after group:relax), then collect them
# (--after group:props). The stages source lib.sh from beside them, so they are
# submitted with --bundle: the engine stores this directory and runs them inside it.
# On a cluster, replace `flow run` by managers in allocations (`flow scale`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ws="${1:-campaign-ws}"
[ -d "$ws/.flow" ] || flow init "$ws" >/dev/null
export FLOW_WORKSPACE="$ws"

flow submit --group relax --bundle "$here" --array 1-8 "$here/relax.sh" >/dev/null
flow submit --group props --bundle "$here" --after group:relax --array 1-8 "$here/props.sh" >/dev/null
flow submit --group collect --bundle "$here" --after group:props "$here/collect.sh" >/dev/null
flow status --by group
flow run --workers 2 -q
flow groups
cat "$ws/results/summary.txt"
