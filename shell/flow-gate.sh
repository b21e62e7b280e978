# shellcheck shell=bash
# The bash launcher (docs/protocol.md §9), sourced as BASH_ENV before the program's first
# line. Each job parses every character here, so the why is in launcher.py.
# shellcheck disable=SC2153,SC2154 # the _FLOW_GATE_* variables come from the manager
exec 9<&- >>"$_FLOW_GATE_OUT" 2>>"$_FLOW_GATE_ERR" || exit 126
[[ -z $_FLOW_GATE_CTX ]] || printf %s "$FLOW_LAUNCH_CONTEXT" >"$_FLOW_GATE_CTX" || exit 126
cd -- "$_FLOW_GATE_CWD" || exit 126
TMOUT=0 read -r _ _flow_c || exit 125
[[ -z $_flow_c ]] || export FLOW_CPU_LIST=$_flow_c
if [[ -f $0 && -x $0 ]]; then
    exec </dev/null
    unset BASH_ENV FLOW_LAUNCH_CONTEXT _FLOW_GATE_OUT _FLOW_GATE_ERR _FLOW_GATE_CTX _FLOW_GATE_CWD _FLOW_GATE_FAIL _flow_c
    return
fi
# a program the /bin/sh launcher would not execute: bash parses this only then
if [[ -e $0 ]]; then
    echo "not_executable $0" >"$_FLOW_GATE_FAIL"
    echo "flow: the program $0 is not an executable file" >&2
    exit 126
fi
echo "not_found $0" >"$_FLOW_GATE_FAIL"
echo "flow: the program $0 was not found" >&2
exit 127
