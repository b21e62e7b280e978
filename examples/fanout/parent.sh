#!/usr/bin/env bash
# Fan-out and join: spawn N children (param n, default 50), each computing from its own
# parameter into its own job directory; once all succeeded, aggregate their results into
# one CSV in the parent's workdir.
#
#   flow submit --step spawn --param n=50 examples/fanout/parent.sh && flow run
#
# The children run this same program, starting at step `point`.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../shell/flow.sh
source "$FLOW_BASH_API"

flow_steps spawn point aggregate

step_spawn() {
    local n i
    flow_param -v n n 50
    for ((i = 1; i <= n; i++)); do
        flow_spawn --label "p$i" --step point --param x="$i"
    done
    flow_wait aggregate --all-succeeded
}

# one child: x squared, and the number of Collatz steps from x down to 1
step_point() {
    local x v steps=0
    flow_param -v x x
    v=$x
    while ((v > 1)); do
        if ((v % 2)); then v=$((3 * v + 1)); else v=$((v / 2)); fi
        steps=$((steps + 1))
    done
    printf '%s,%s,%s\n' "$x" "$((x * x))" "$steps" >"$FLOW_JOB_DIR/result.csv"
    flow_succeed "x=$x"
}

step_aggregate() {
    local label id state path row out=$FLOW_WORKDIR/results.csv count=0
    printf 'label,x,square,collatz_steps\n' >"$out.tmp"
    while read -r label id state path; do
        if [[ $state != succeeded ]]; then
            flow_fail "child $label ($id) ended $state" child_failed
            return
        fi
        read -r row <"$path/result.csv"
        printf '%s,%s\n' "$label" "$row" >>"$out.tmp"
        count=$((count + 1))
    done < <(flow_children)
    mv -f "$out.tmp" "$out"
    flow_succeed "aggregated $count children into $out"
}

flow_main "$@"
