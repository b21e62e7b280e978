# shellcheck shell=bash
# The launcher of a bash program (docs/protocol.md §9). The manager starts the program's
# own bash on it (bash PROGRAM ARGS...) with BASH_ENV naming this file: bash sources it
# before it reads the program, so one process is launcher and program, with no /bin/sh
# and no env(1) in between. It opens the output files, writes context.json if asked,
# enters the workdir and waits for the gate (stdin, a pipe) exactly as the /bin/sh
# launcher does; a gate that closes unopened ends it before the program's first line.
# shellcheck disable=SC2153,SC2154 # the _FLOW_GATE_* variables come from the manager
exec 9<&- # the descriptor this file was read from (launcher.py GATE_FD)
exec >>"$_FLOW_GATE_OUT" 2>>"$_FLOW_GATE_ERR" || exit 126
if [[ -n $_FLOW_GATE_CTX ]]; then
    printf %s "$FLOW_LAUNCH_CONTEXT" >"$_FLOW_GATE_CTX" || exit 126
fi
cd -- "$_FLOW_GATE_CWD" || exit 126
# TMOUT=0: a TMOUT of the environment must not time the gate out
TMOUT=0 read -r _ || exit 125
# the checks the /bin/sh launcher makes before its exec, on the program bash reads next
if [[ ! -e $0 ]]; then
    echo "not_found $0" >"$_FLOW_GATE_FAIL"
    echo "flow: the program $0 was not found" >&2
    exit 127
elif [[ ! -f $0 || ! -x $0 ]]; then
    echo "not_executable $0" >"$_FLOW_GATE_FAIL"
    echo "flow: the program $0 is not an executable file" >&2
    exit 126
fi
exec </dev/null
unset BASH_ENV FLOW_LAUNCH_CONTEXT _FLOW_GATE_OUT _FLOW_GATE_ERR _FLOW_GATE_CTX _FLOW_GATE_CWD _FLOW_GATE_FAIL
