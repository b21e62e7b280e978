# shellcheck shell=bash
# httk_flow bash runner API (docs/bash-api.md). Every job parses each character here: the
# plain path only, terse; flow-more.sh beside it has the rest and the why.

[[ -z ${_FLOW_API_LOADED-} ]] || return 0
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 402)); then
    printf 'flow.sh: needs bash 4.2 or newer (this is %s)\n' "$BASH_VERSION" >&2 || true
    return 2
fi
_FLOW_API_VERSION=0.1.0
_FLOW_API_LOADED=1 _FLOW_API_FILE=${BASH_SOURCE[0]}
[[ $_FLOW_API_FILE == /* ]] || _FLOW_API_FILE=$PWD/$_FLOW_API_FILE
# a name's characters, a plain message's (no \ or "): listed, as [a-z] may match others
_FLOW_WORD=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_
_FLOW_PLAIN="]$_FLOW_WORD"$' !#$%&\'()*+,./:;<=>?@[^`{|}~-'
_flow_published=0 _flow_error="" _flow_step="" _flow_in_err=0 _flow_main_pid="" _flow_more_api="" _flow_steps_list=()
declare -gA _flow_declared=()

# _flow_more NAME ARGS...: _flow_more_NAME of flow-more.sh
_flow_more() {
    [[ $_flow_more_api == 1 ]] || _flow_load || return
    "_flow_more_$1" "${@:2}" || return
}

# read flow-more.sh of this version, else publish a fail in place: nothing else could
_flow_load() {
    local _flow_m=${_FLOW_API_FILE%/*}/flow-more.sh
    # shellcheck source-path=SCRIPTDIR source=flow-more.sh
    if [[ -z $_flow_more_api && -f $_flow_m ]] && { _FLOW_MORE_VERSION=""; source "$_flow_m"; } && [[ $_FLOW_MORE_VERSION == "$_FLOW_API_VERSION" ]]; then
        _flow_more_api=1
        return 0
    fi
    [[ -z $_flow_more_api ]] || return 2
    _flow_more_api=0 _flow_m="flow: cannot load $_flow_m (version ${_FLOW_MORE_VERSION:-unknown}) for flow.sh (version $_FLOW_API_VERSION): the two ship together and one job never mixes versions (was httk_flow upgraded while it ran?)"
    printf '%s\n' "$_flow_m" >&2 || true
    _flow_m=${FLOW_STEP:+step $FLOW_STEP: }${_flow_error:-$_flow_m} _flow_error=""
    flow_fail "${_flow_m//[!$_FLOW_PLAIN]/?}" protocol_error || true
    _flow_error=$_flow_m
    return 2
}

_flow_ident() { [[ $1 == [!0123456789]* && $1 != *[!$_FLOW_WORD]* && ${#1} -le 64 ]]; }

# _flow_outcome FUNC ACTION MESSAGE EXTRA [NARGS]: outcome.line made O_EXCL (set -C)
_flow_outcome() {
    local _flow_fd _flow_o=$-
    if [[ $_flow_published == 1 || -n $_flow_error || ${5-1} == 0 || ${FLOW_DURABLE-0} == 1 || -o posix || $3 == *[!$_FLOW_PLAIN]* ||
        ! -d ${FLOW_CONTROL_DIR-} || -e $FLOW_CONTROL_DIR/outcome.line || -e $FLOW_CONTROL_DIR/outcome.ready ]]; then
        _flow_more outcome "$@"
        return
    fi
    set -C
    { exec {_flow_fd}>"$FLOW_CONTROL_DIR/outcome.line"; } 2>/dev/null || _flow_fd=""
    [[ $_flow_o == *C* ]] || set +C
    if [[ -z $_flow_fd ]]; then
        _flow_more not_created "$2"
    elif printf '{"action":"%s","message":"%s"%s}\n' "$2" "$3" "$4" >&"$_flow_fd"; then
        exec {_flow_fd}>&-
        _flow_published=1
    else
        exec {_flow_fd}>&-
        _flow_more not_written
    fi
}

# the ERR trap: under set -e, in the step's shell; FUNCNAME[1] read before a call
_flow_on_err() {
    [[ $- == *e* && $_flow_in_err == 0 && $BASHPID == "$_flow_main_pid" ]] || return 0
    _flow_more on_err "$@" "${FUNCNAME[1]-main}" || true
}

flow_steps() {
    local _flow_s
    for _flow_s; do
        _flow_ident "$_flow_s" || _flow_more steps "$_flow_s" || return
        [[ -n ${_flow_declared[$_flow_s]-} ]] || _flow_steps_list+=("$_flow_s")
        _flow_declared[$_flow_s]=1
    done
    (($#)) || _flow_more steps || return
}

flow_main() {
    local _flow_s=${FLOW_STEP-} _flow_rc
    if [[ -z ${FLOW_CONTROL_DIR-} || -z $_flow_s || -z ${_flow_declared[$_flow_s]-} || -n $_flow_error ]] || ! declare -F "step_$_flow_s" >/dev/null; then
        _flow_more main
        return
    fi
    _flow_step=$_flow_s _flow_main_pid=$BASHPID
    set -E
    trap '_flow_on_err "$?" "$LINENO" "$BASH_COMMAND" "${PIPESTATUS[*]}"' ERR
    "step_$_flow_s" "$@"
    _flow_rc=$?
    trap - ERR
    [[ $_flow_published == 1 || -e $FLOW_CONTROL_DIR/outcome.line ]] || _flow_more main_end "$_flow_rc"
}

flow_succeed() { _flow_outcome flow_succeed succeed "$*" ""; }

flow_fail() {
    if (($# == 1)) || [[ $# == 2 && -n $2 && $2 != *[!$_FLOW_WORD.:+-]* && ${#2} -le 64 ]]; then
        _flow_outcome flow_fail fail "$1" "${2+,\"code\":\"$2\"}"
    else
        _flow_more fail "$@"
    fi
}

flow_advance() {
    if [[ -n ${1-} && -n ${_flow_declared[$1]-} ]]; then
        _flow_outcome flow_advance advance "${*:2}" ",\"step\":\"$1\""
    else
        _flow_more advance "$@"
    fi
}

flow_retry() { _flow_outcome flow_retry retry "$*" "" $#; }

flow_pause() { _flow_outcome flow_pause pause "$*" "" $#; }

# here: a $(flow_param KEY) subshell would read flow-more.sh each time
flow_param() {
    local _flow_out="" _flow_var
    if [[ ${1-} == -v ]] && (($# > 2)) && _flow_ident "$2"; then
        _flow_out=$2
        shift 2
    fi
    _flow_var=FLOW_PARAM_${1-}
    if ! { (($# == 1 || $# == 2)) && _flow_ident "$1"; }; then
        _flow_more param ${_flow_out:+-v "$_flow_out"} "$@" || return
    elif [[ -n ${!_flow_var+set} || $# == 2 ]]; then
        # shellcheck disable=SC2059 # the format is %s, after -v VAR if given
        printf ${_flow_out:+-v "$_flow_out"} '%s' "${!_flow_var-$2}"
    else
        printf 'flow_param: parameter %s is not set and no default was given\n' "$1" >&2 || true
        return 1
    fi
}

flow_is_restart() { [[ ${FLOW_IS_RESTART-0} == 1 ]]; }

flow_is_unclean_restart() { [[ ${FLOW_UNCLEAN_RESTART-0} == 1 ]]; }

flow_log() { printf '%(%Y-%m-%dT%H:%M:%S)T flow[%s %s]: %s\n' -1 "${FLOW_STEP-?}" "${FLOW_ATTEMPT_ID-?}" "$*" >&2 || true; }

# in flow-children.sh
flow_spawn() { _flow_more lazy flow_spawn "$@"; }
flow_wait() { _flow_more lazy flow_wait "$@"; }
flow_children() { _flow_more lazy flow_children; }
