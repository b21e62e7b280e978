#!/usr/bin/env bash
# A long computation that checkpoints to its persistent workdir and, when restarted
# (its node died, its manager was killed, a drain stopped it), continues from the
# checkpoint instead of starting over.
#
#   flow submit --workdir persistent --param iterations=100 examples/restartable.sh
#
# $FLOW_WORKDIR survives attempts only with --workdir persistent (the default).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../shell/flow.sh
source "$FLOW_BASH_API"

flow_steps main

step_main() {
    local total delay i=0 acc=0 ckpt=$FLOW_WORKDIR/checkpoint
    flow_param -v total iterations 20
    flow_param -v delay delay 0.1
    if flow_is_restart && [[ -f $ckpt ]]; then
        read -r i acc <"$ckpt"
        flow_log "restarted (unclean: $FLOW_UNCLEAN_RESTART); continuing from iteration $i"
        printf 'attempt %s resumed at %s\n' "$FLOW_ATTEMPT_ID" "$i" >>"$FLOW_WORKDIR/resumes.log"
    fi
    while ((i < total)); do
        sleep "$delay" # stands for one expensive iteration
        acc=$((acc + i))
        i=$((i + 1))
        # write-then-rename: a kill between the two leaves the previous checkpoint whole
        printf '%s %s\n' "$i" "$acc" >"$ckpt.tmp"
        mv -f "$ckpt.tmp" "$ckpt"
    done
    printf '%s\n' "$acc" >"$FLOW_JOB_DIR/result.txt"
    flow_succeed "sum of 0..$((total - 1)) = $acc"
}

flow_main "$@"
