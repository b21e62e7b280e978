# shellcheck shell=bash
# httk_flow bash runner API, the long way. bash parses every line of a sourced file at each
# start of a step (function bodies cost most, comments too), so flow.sh holds only the
# plain path: declare the steps, run one, read a parameter, publish one outcome in place.
# It sources this file beside itself the first time a call leaves that path: a misuse and
# its message, a message to escape, a wait or a durable workspace (the directory form), a
# step that ends without an outcome, the ERR trap's report, spawning (flow-children.sh,
# read from here). Do not source it yourself; it defines nothing unless flow.sh has the same version,
# and redefines none of flow.sh's functions: flow.sh's _flow_more NAME ARGS runs
# `_flow_more_NAME ARGS || return`, so a status reaches the caller as a plain function's
# would, while set -e and the ERR trap act there, not inside (as in a condition).
# See docs/bash-api.md.
#
# The attempt's state is flow.sh's: _flow_published (this process published an outcome),
# _flow_error (the first misuse: the step ends as a fail naming it), _flow_step (the step
# flow_main runs), _flow_in_err (guards the ERR trap against re-entry), _flow_main_pid
# (the shell that runs the step, flow_main's $BASHPID), _flow_more_api (this file: 1 read,
# 0 refused), _flow_declared and _flow_steps_list (the steps flow_steps declared).
#
# flow.sh is terse because every job parses each character of it (about 450 instructions a
# character of code, 130 of comment): its why is here. _FLOW_WORD and _FLOW_PLAIN list the
# characters of a name and of a message written as is (printable ASCII but \ and "): a
# range such as [a-z] may match others in some locales. _flow_outcome publishes in place
# with no process started (outcome.line made with O_EXCL, as set -C makes it) and takes
# the long way for anything else, and in posix mode, where a failed redirection of exec
# would end the shell. flow_param is there, not here: a first call in a $(flow_param KEY)
# subshell would read this file in that subshell, each time.
# shellcheck disable=SC2154 # the state of an attempt lives in flow.sh

_FLOW_MORE_VERSION=0.1.0
[[ ${_FLOW_API_VERSION-} == "$_FLOW_MORE_VERSION" ]] || return 3

#: every control character JSON forbids raw, except NUL (a bash string cannot hold it)
_FLOW_CTL=$'\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f'
_FLOW_RE_IDENT='^[A-Za-z_][A-Za-z0-9_]{0,63}$'
_FLOW_RE_TAG='^[A-Za-z0-9][A-Za-z0-9_+-]{0,63}$'
_FLOW_RE_LABEL='^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$'
_FLOW_RE_CODE='^[A-Za-z0-9_.:+-]{1,64}$'
_FLOW_RE_PRIORITY='^[0-9]{1,3}$'
_FLOW_RE_COUNT='^[0-9]+$'
_flow_children_api="" # flow-children.sh was read

# -- helpers -----------------------------------------------------------------------------

# _flow_valid KIND VALUE: is VALUE of the grammar (ident, tag, label, code, priority,
# count: digits)?
_flow_valid() {
    # byte-wise ranges: in other locales [a-z] may match accented or upper-case letters
    local LC_ALL=C _flow_re
    case $1 in
    ident) _flow_re=$_FLOW_RE_IDENT ;;
    tag) _flow_re=$_FLOW_RE_TAG ;;
    label) _flow_re=$_FLOW_RE_LABEL ;;
    code) _flow_re=$_FLOW_RE_CODE ;;
    priority) _flow_re=$_FLOW_RE_PRIORITY ;;
    count) _flow_re=$_FLOW_RE_COUNT ;;
    *) return 1 ;;
    esac
    [[ $2 =~ $_flow_re ]]
}

# _flow_json_quote VAR STRING: set VAR to STRING as a JSON string literal, quotes included.
_flow_json_quote() {
    # C locale: work on bytes, so UTF-8 passes through untouched and bad bytes do not
    # confuse the matcher
    local LC_ALL=C _flow_s=$2 _flow_i _flow_c _flow_hex
    case $_flow_s in
    *[\\\"]*)
        _flow_s=${_flow_s//\\/\\\\}
        _flow_s=${_flow_s//\"/\\\"}
        ;;
    esac
    if [[ $_flow_s == *[$_FLOW_CTL]* ]]; then
        _flow_s=${_flow_s//$'\n'/'\n'}
        _flow_s=${_flow_s//$'\t'/'\t'}
        _flow_s=${_flow_s//$'\r'/'\r'}
        for ((_flow_i = 0; _flow_i < 31; _flow_i++)); do
            [[ $_flow_s == *[$_FLOW_CTL]* ]] || break
            _flow_c=${_FLOW_CTL:_flow_i:1}
            if [[ $_flow_s == *"$_flow_c"* ]]; then
                printf -v _flow_hex '\\u%04x' "$((_flow_i + 1))"
                _flow_s=${_flow_s//"$_flow_c"/"$_flow_hex"}
            fi
        done
    fi
    printf -v "$1" '"%s"' "$_flow_s"
}

# _flow_say FORMAT ARGS...: a line on stderr; a closed or broken stderr never fails a step
_flow_say() {
    # shellcheck disable=SC2059 # the format is always one of ours
    printf "$@" >&2 || true
}

# _flow_misuse FUNC MESSAGE: report a misuse on stderr and remember the first one.
_flow_misuse() {
    _flow_say '%s: %s\n' "$1" "$2"
    if [[ -z $_flow_error ]]; then
        _flow_error="$1: $2"
    fi
    return 0
}

_flow_prefix() {
    # "step NAME: " when the step is known, for messages the manager records
    local _flow_s=${_flow_step:-${FLOW_STEP-}}
    if [[ -n $_flow_s ]]; then
        printf -v "$1" 'step %s: ' "$_flow_s"
    else
        printf -v "$1" ''
    fi
}

# _flow_again ACTION: say that a second outcome (ACTION) was published beside the first
# (the manager fails the job with a protocol error when it finds the note).
_flow_again() {
    if [[ -d $FLOW_CONTROL_DIR/outcome.ready ]]; then
        printf '%s\n' "$1" >>"$FLOW_CONTROL_DIR/outcome.ready/duplicate"
    else
        printf '%s\n' "$1" >>"$FLOW_CONTROL_DIR/outcome.duplicate"
    fi
}

# _flow_write ACTION MESSAGE EXTRA: publish one outcome (EXTRA: more ,"key":value fields).
_flow_write() {
    local _flow_ctl=${FLOW_CONTROL_DIR-} _flow_msg _flow_tmp _flow_files _flow_json _flow_noclobber="" _flow_fd
    if [[ -z $_flow_ctl || ! -d $_flow_ctl ]]; then
        _flow_say 'flow: FLOW_CONTROL_DIR %s is not an attempt directory; run this program through flow (flow submit, then flow run)\n' "${_flow_ctl:-(unset)}"
        return 2
    fi
    _flow_json_quote _flow_msg "$2"
    printf -v _flow_json '{"action":"%s","message":%s%s}' "$1" "$_flow_msg" "$3"
    # (in posix mode a failed redirection of exec ends the shell: the directory form then)
    if [[ $1 != wait && ${FLOW_DURABLE-0} != 1 && :$SHELLOPTS: != *:posix:* ]]; then
        # written in place (protocol.md §10), no process started: one line in a file
        # created exclusively (noclobber opens with O_EXCL: one publication owns it); the
        # manager takes it only when whole, that is ending in its newline (flow.sh's
        # _flow_outcome does the same for a plain message)
        if [[ -e $_flow_ctl/outcome.line || -e $_flow_ctl/outcome.ready ]]; then
            _flow_published=1
            _flow_again "$1"
            _flow_say 'flow: an outcome was already published (by a subshell?); this second one (%s) makes the job fail with a protocol error\n' "$1"
            return 1
        fi
        [[ $- == *C* ]] || _flow_noclobber=1
        set -C
        if ! { exec {_flow_fd}>"$_flow_ctl/outcome.line"; } 2>/dev/null; then
            [[ -z $_flow_noclobber ]] || set +C
            _flow_more_not_created "$1" || true
            return 1
        fi
        [[ -z $_flow_noclobber ]] || set +C
        if ! printf '%s\n' "$_flow_json" >&"$_flow_fd"; then
            exec {_flow_fd}>&-
            _flow_more_not_written || true
            return 1
        fi
        exec {_flow_fd}>&-
        _flow_published=1
        return 0
    fi
    # a wait (two files) or a durable workspace: built in a directory of its own, synced
    # when durable, and renamed into place as outcome.ready/
    _flow_tmp=$_flow_ctl/outcome.tmp.$BASHPID.$RANDOM$RANDOM
    if ! command mkdir -- "$_flow_tmp"; then
        _flow_say 'flow: cannot create %s; no outcome was published\n' "$_flow_tmp"
        return 1
    fi
    if ! printf '%s\n' "$_flow_json" >"$_flow_tmp/outcome.json"; then
        _flow_say 'flow: cannot write %s/outcome.json; no outcome was published\n' "$_flow_tmp"
        return 1
    fi
    _flow_files=("$_flow_tmp/outcome.json")
    if [[ $1 == wait ]]; then
        _flow_files+=("$_flow_tmp/children.jsonl")
        if ! printf '%s' "$_flow_children" >"$_flow_tmp/children.jsonl"; then
            _flow_say 'flow: cannot write %s/children.jsonl; no outcome was published\n' "$_flow_tmp"
            return 1
        fi
    fi
    if [[ ${FLOW_DURABLE-0} == 1 ]] && ! command sync -- "${_flow_files[@]}" "$_flow_tmp" "$_flow_ctl"; then
        _flow_say 'flow: cannot sync %s; no outcome was published\n' "$_flow_tmp"
        return 1
    fi
    # -T: never move the directory *into* an outcome.ready published meanwhile
    if ! command mv -T -- "$_flow_tmp" "$_flow_ctl/outcome.ready" 2>/dev/null; then
        if [[ -d $_flow_ctl/outcome.ready ]]; then
            _flow_published=1
            printf '%s\n' "$1" >>"$_flow_ctl/outcome.ready/duplicate"
            _flow_say 'flow: an outcome was already published (by a subshell?); this second one (%s) makes the job fail with a protocol error\n' "$1"
        else
            _flow_say 'flow: cannot publish %s as outcome.ready; no outcome was published\n' "$_flow_tmp"
        fi
        return 1
    fi
    _flow_published=1
    if [[ ${FLOW_DURABLE-0} == 1 ]]; then
        command sync -- "$_flow_ctl" || true
    fi
    return 0
}

# _flow_has_outcome: did this attempt publish an outcome (this process, or a subshell)?
_flow_has_outcome() {
    [[ $_flow_published == 1 || (-n ${FLOW_CONTROL_DIR-} && (-e $FLOW_CONTROL_DIR/outcome.line || -e $FLOW_CONTROL_DIR/outcome.ready)) ]]
}

# _flow_check_step FUNC STEP: is STEP a valid name, declared if flow_steps was used?
_flow_check_step() {
    if ! _flow_valid ident "$2"; then
        _flow_misuse "$1" "step name '$2' is not valid (1-64 letters, digits and '_', not starting with a digit)"
        return 1
    fi
    if ((${#_flow_steps_list[@]})) && [[ -z ${_flow_declared[$2]-} ]]; then
        _flow_misuse "$1" "step '$2' is not declared with flow_steps (declared: ${_flow_steps_list[*]})"
        return 1
    fi
    return 0
}

# -- the long way of flow.sh's functions -------------------------------------------------

# outcome FUNC ACTION MESSAGE EXTRA [NARGS]: _flow_outcome, whatever the case (NARGS 0:
# flow_retry or flow_pause without a reason).
_flow_more_outcome() {
    local _flow_p
    if [[ ${5-1} == 0 ]]; then
        _flow_misuse "$1" "usage: $1 REASON"
    fi
    if _flow_has_outcome; then
        if [[ -n ${FLOW_CONTROL_DIR-} ]]; then
            _flow_again "$2"
        fi
        _flow_say '%s: this attempt already published an outcome; a second one (%s) makes the job fail with a protocol error\n' "$1" "$2"
        return 1
    fi
    if [[ -n $_flow_error ]]; then
        # an earlier misuse wins over what the step meant to report
        _flow_prefix _flow_p
        if [[ $2 != fail || $_flow_error != "$1: "* ]]; then
            _flow_say '%s: publishing a fail instead of %s, because of: %s\n' "$1" "$2" "$_flow_error"
        fi
        _flow_write fail "$_flow_p$_flow_error" ',"code":"protocol_error"' || return
        return 2
    fi
    _flow_write "$2" "$3" "$4"
}

# not_created ACTION: outcome.line could not be created.
_flow_more_not_created() {
    if [[ -e $FLOW_CONTROL_DIR/outcome.line ]]; then
        _flow_published=1
        _flow_again "$1"
        _flow_say 'flow: an outcome was published at the same moment (by a subshell?); this second one (%s) makes the job fail with a protocol error\n' "$1"
    else
        _flow_say 'flow: cannot create %s/outcome.line; no outcome was published\n' "$FLOW_CONTROL_DIR"
    fi
    return 1
}

# not_written: outcome.line was created but could not be written (a full disk).
_flow_more_not_written() {
    # ours, cut short: gone, so that no part of it is read
    command rm -f -- "$FLOW_CONTROL_DIR/outcome.line"
    _flow_say 'flow: cannot write %s/outcome.line; no outcome was published\n' "$FLOW_CONTROL_DIR"
    return 1
}

# on_err STATUS LINE COMMAND PIPESTATUS WHERE: the ERR trap's report (WHERE: the function
# the command failed in), as a fail unless an outcome was published.
_flow_more_on_err() {
    local _flow_status=$1 _flow_line=$2 _flow_cmd=$3 _flow_ps=$4 _flow_where=$5
    local _flow_p _flow_msg
    if _flow_has_outcome; then
        return 0
    fi
    _flow_in_err=1
    _flow_prefix _flow_p
    if [[ -n $_flow_error ]]; then
        _flow_write fail "$_flow_p$_flow_error" ',"code":"protocol_error"' || true
    elif [[ $_flow_where == flow_main ]]; then
        _flow_msg="${_flow_p}step_$_flow_step returned status $_flow_status without publishing an outcome"
        _flow_write fail "$_flow_msg" ',"code":"protocol_error"' || true
    else
        if [[ $_flow_ps == *' '* ]]; then
            _flow_msg="${_flow_p}a pipeline failed with statuses $_flow_ps at line $_flow_line (near \`$_flow_cmd\`)"
        else
            _flow_msg="${_flow_p}command \`$_flow_cmd\` failed with status $_flow_status at line $_flow_line"
        fi
        if [[ $_flow_where != "step_$_flow_step" ]]; then
            _flow_msg+=" (in $_flow_where)"
        fi
        _flow_write fail "$_flow_msg" ',"code":"step_error"' || true
    fi
    _flow_in_err=0
    return 0
}

# steps NAME...: flow_steps, for no name or a bad one.
_flow_more_steps() {
    local _flow_s
    if (($# == 0)); then
        _flow_misuse flow_steps "needs at least one step name"
        return 2
    fi
    for _flow_s in "$@"; do
        if ! _flow_valid ident "$_flow_s"; then
            _flow_misuse flow_steps "step name '$_flow_s' is not valid (1-64 letters, digits and '_', not starting with a digit)"
            return 2
        fi
        if [[ -z ${_flow_declared[$_flow_s]-} ]]; then
            # shellcheck disable=SC2004 # an associative array (flow.sh declares it)
            _flow_declared[$_flow_s]=1
            _flow_steps_list+=("$_flow_s")
        fi
    done
    return 0
}

# main: flow_main before the step, when it cannot run it.
_flow_more_main() {
    local _flow_s=${FLOW_STEP-} _flow_h=""
    if [[ -z ${FLOW_CONTROL_DIR-} ]]; then
        _flow_say 'flow_main: FLOW_CONTROL_DIR is not set; run this program through flow (flow submit, then flow run)\n'
        return 2
    fi
    _flow_step=$_flow_s
    if [[ -z $_flow_s ]]; then
        _flow_misuse flow_main "FLOW_STEP is not set"
    elif ((${#_flow_steps_list[@]} == 0)); then
        _flow_misuse flow_main "no steps are declared; call flow_steps NAME... before flow_main"
    elif [[ -z ${_flow_declared[$_flow_s]-} ]]; then
        # main is no choice the author made: flow submit starts there without --step
        [[ $_flow_s != main ]] || _flow_h="; a job starts at step main unless flow submit --step names another: submit with --step ${_flow_steps_list[0]}, and continue this one with flow resume JOB --step ${_flow_steps_list[0]}"
        _flow_misuse flow_main "step '$_flow_s' is not declared with flow_steps (declared: ${_flow_steps_list[*]})$_flow_h"
    elif ! declare -F "step_$_flow_s" >/dev/null; then
        _flow_misuse flow_main "step '$_flow_s' is declared but no function step_$_flow_s is defined"
    fi
    # one of those, or an earlier misuse, is why flow.sh came here
    _flow_more_outcome flow_main fail "$_flow_error" ',"code":"protocol_error"'
}

# main_end STATUS: flow_main after a step that this process published no outcome of.
_flow_more_main_end() {
    local _flow_p
    if _flow_has_outcome; then
        return 0
    fi
    if [[ -n $_flow_error ]]; then
        _flow_more_outcome flow_main fail "$_flow_error" ',"code":"protocol_error"'
        return
    fi
    _flow_prefix _flow_p
    _flow_write fail "${_flow_p}step_$_flow_step returned (status $1) without publishing an outcome; end each step with flow_succeed, flow_fail, flow_advance, flow_wait, flow_retry or flow_pause" ',"code":"protocol_error"'
}

# fail MSG [CODE]: flow_fail, for a usage or a code that is not valid.
_flow_more_fail() {
    local _flow_extra=""
    if (($# < 1 || $# > 2)); then
        _flow_misuse flow_fail "usage: flow_fail MSG [CODE]"
    elif (($# == 2)); then
        if _flow_valid code "$2"; then
            _flow_extra=",\"code\":\"$2\""
        else
            _flow_misuse flow_fail "code '$2' is not valid (1-64 letters, digits and '_.:+-')"
        fi
    fi
    _flow_more_outcome flow_fail fail "${1-}" "$_flow_extra"
}

# advance STEP [MSG]: flow_advance, for a step that flow_steps did not declare.
_flow_more_advance() {
    local _flow_s=${1-}
    if (($# < 1)); then
        _flow_misuse flow_advance "usage: flow_advance STEP [MSG]"
    else
        shift
        _flow_check_step flow_advance "$_flow_s" || true
    fi
    _flow_more_outcome flow_advance advance "$*" ",\"step\":\"$_flow_s\""
}

# param [-v VAR] KEY [DEFAULT]: flow_param, for a misuse (flow.sh does the rest).
_flow_more_param() {
    local _flow_out="" _flow_var _flow_val
    if [[ ${1-} == -v ]]; then
        if (($# < 2)) || ! _flow_valid ident "$2"; then
            _flow_misuse flow_param "-v needs a variable name"
            return 2
        fi
        _flow_out=$2
        shift 2
    fi
    if (($# < 1 || $# > 2)); then
        _flow_misuse flow_param "usage: flow_param [-v VAR] KEY [DEFAULT]"
        return 2
    fi
    if ! _flow_valid ident "$1"; then
        _flow_misuse flow_param "param key '$1' is not valid (1-64 letters, digits and '_', not starting with a digit)"
        return 2
    fi
    _flow_var=FLOW_PARAM_$1
    if [[ -n ${!_flow_var+set} ]]; then
        _flow_val=${!_flow_var}
    elif (($# == 2)); then
        _flow_val=$2
    else
        _flow_say 'flow_param: parameter %s is not set and no default was given\n' "$1"
        return 1
    fi
    if [[ -n $_flow_out ]]; then
        printf -v "$_flow_out" '%s' "$_flow_val"
    else
        printf '%s' "$_flow_val"
    fi
}

# -- children: read on first use ---------------------------------------------------------
# few steps spawn: the first call of flow_spawn, flow_wait or flow_children sources
# flow-children.sh beside flow.sh (it defines _flow_do_*), and refuses it unless it has
# the same version.

# lazy FUNC ARGS...: FUNC (flow_spawn, ...) as _flow_do_* of flow-children.sh, which is
# sourced first if need be; a misuse (and for flow_wait, the fail) when it cannot be.
_flow_more_lazy() {
    if [[ -z $_flow_children_api ]]; then
        _FLOW_CHILDREN_VERSION=""
        # shellcheck source-path=SCRIPTDIR source=flow-children.sh
        if [[ -f ${_FLOW_API_FILE%/*}/flow-children.sh ]] && source "${_FLOW_API_FILE%/*}/flow-children.sh" && [[ $_FLOW_CHILDREN_VERSION == "$_FLOW_API_VERSION" ]]; then
            _flow_children_api=loaded
        else
            _flow_misuse "$1" "cannot load ${_FLOW_API_FILE%/*}/flow-children.sh (version ${_FLOW_CHILDREN_VERSION:-unknown}) for flow.sh (version $_FLOW_API_VERSION): the two ship together and one job never mixes versions (was httk_flow upgraded while it ran?)"
            [[ $1 != flow_wait ]] || _flow_more_outcome flow_wait fail "" "" || true
            return 2
        fi
    fi
    "_flow_do_${1#flow_}" "${@:2}" || return
}
