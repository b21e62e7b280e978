#!/usr/bin/env bash
# A three-step workflow: prepare an input, compute from it, collect the result.
#
#   flow submit --step prepare --param n=100 examples/three_step.sh && flow run
#
# The steps share files through $FLOW_WORKDIR, which persists across the steps of a job
# (the default --workdir persistent); the result goes to the job directory.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../shell/flow.sh
source "$FLOW_BASH_API"

flow_steps prepare compute collect

step_prepare() {
    local n
    flow_param -v n n 10
    printf '%s\n' "$n" >"$FLOW_WORKDIR/input.txt"
    flow_advance compute "input written (n=$n)"
}

step_compute() {
    local n i sum=0
    read -r n <"$FLOW_WORKDIR/input.txt"
    for ((i = 1; i <= n; i++)); do
        sum=$((sum + i * i))
    done
    printf '%s\n' "$sum" >"$FLOW_WORKDIR/sum.txt"
    flow_advance collect "sum computed"
}

step_collect() {
    local n sum
    read -r n <"$FLOW_WORKDIR/input.txt"
    read -r sum <"$FLOW_WORKDIR/sum.txt"
    printf 'n,sum_of_squares\n%s,%s\n' "$n" "$sum" >"$FLOW_JOB_DIR/result.csv"
    flow_succeed "sum of squares 1..$n = $sum"
}

flow_main "$@"
