# shellcheck shell=bash
# httk_flow bash runner API, the part that spawns and joins children: flow.sh sources it
# beside itself (through flow-more.sh) the first time flow_spawn, flow_wait or
# flow_children is called (do not source it yourself). It defines nothing unless flow.sh
# has the same version. See docs/bash-api.md.
# shellcheck disable=SC2154 # the state of an attempt lives in flow.sh

_FLOW_CHILDREN_VERSION=0.1.0
[[ ${_FLOW_API_VERSION-} == "$_FLOW_CHILDREN_VERSION" ]] || return 3

# the children's part of the attempt's state, made when first needed
_flow_children="" # children.jsonl lines of this attempt's flow_spawn calls
_flow_nspawn=0    # flow_spawn calls so far (numbers the default labels c1, c2, ...)
declare -gA _flow_labels=()

# flow_spawn [--tag T] [--step S] [--param K=V]... [--priority N] [--label L] [--program P]
#            [--cpus N] [--gpus N] [--mem SIZE] [--resource NAME=N]...
# Define a child job; flow_wait registers them all when this attempt ends. What the
# child holds (--cpus ...) defaults to the parent's, one option at a time.
_flow_do_spawn() {
    local _flow_tag="" _flow_s="" _flow_prio="" _flow_label="" _flow_prog="" _flow_opt
    local _flow_params="" _flow_k _flow_v _flow_q _flow_line _flow_f=flow_spawn
    local _flow_cpus="" _flow_gpus="" _flow_mem="" _flow_res=""
    local -A _flow_seen=() _flow_rseen=()
    _flow_nspawn=$((_flow_nspawn + 1))
    if _flow_has_outcome; then
        _flow_misuse $_flow_f "called after this attempt published its outcome"
        return 2
    fi
    while (($#)); do
        _flow_opt=$1
        case $_flow_opt in
        --tag | --step | --param | --priority | --label | --program | --cpus | --gpus | --mem | --resource)
            if (($# < 2)); then
                _flow_misuse $_flow_f "option $_flow_opt needs a value"
                return 2
            fi
            _flow_v=$2
            shift 2
            ;;
        --tag=* | --step=* | --param=* | --priority=* | --label=* | --program=* | --cpus=* | --gpus=* | --mem=* | --resource=*)
            _flow_v=${_flow_opt#*=}
            _flow_opt=${_flow_opt%%=*}
            shift
            ;;
        *)
            _flow_misuse $_flow_f "unknown argument '$_flow_opt' (options: --tag --step --param --priority --label --program --cpus --gpus --mem --resource)"
            return 2
            ;;
        esac
        case $_flow_opt in
        --tag)
            if ! _flow_valid tag "$_flow_v"; then
                _flow_misuse $_flow_f "tag '$_flow_v' is not valid (1-64 letters, digits, '_', '+' and '-', starting with a letter or digit)"
                return 2
            fi
            _flow_tag=$_flow_v
            ;;
        --step)
            if ! _flow_valid ident "$_flow_v"; then
                _flow_misuse $_flow_f "step name '$_flow_v' is not valid (1-64 letters, digits and '_', not starting with a digit)"
                return 2
            fi
            _flow_s=$_flow_v
            ;;
        --param)
            if [[ $_flow_v != *=* ]]; then
                _flow_misuse $_flow_f "--param needs KEY=VALUE, got '$_flow_v'"
                return 2
            fi
            _flow_k=${_flow_v%%=*}
            if ! _flow_valid ident "$_flow_k"; then
                _flow_misuse $_flow_f "param key '$_flow_k' is not valid (1-64 letters, digits and '_', not starting with a digit)"
                return 2
            fi
            if [[ -n ${_flow_seen[$_flow_k]-} ]]; then
                _flow_misuse $_flow_f "param '$_flow_k' is given twice"
                return 2
            fi
            _flow_seen[$_flow_k]=1
            _flow_json_quote _flow_q "${_flow_v#*=}"
            _flow_params+=${_flow_params:+,}"\"$_flow_k\":$_flow_q"
            ;;
        --priority)
            if ! _flow_valid priority "$_flow_v"; then
                _flow_misuse $_flow_f "priority '$_flow_v' is not an integer in 0-999"
                return 2
            fi
            _flow_prio=$((10#$_flow_v))
            ;;
        --label)
            if ! _flow_valid label "$_flow_v"; then
                _flow_misuse $_flow_f "label '$_flow_v' is not valid (1-128 letters, digits and '_.+-', starting with a letter or digit)"
                return 2
            fi
            _flow_label=$_flow_v
            ;;
        --program)
            if [[ -z $_flow_v ]]; then
                _flow_misuse $_flow_f "--program needs a path"
                return 2
            fi
            [[ $_flow_v == /* ]] || _flow_v=$PWD/$_flow_v
            if [[ ! -f $_flow_v || ! -x $_flow_v ]]; then
                _flow_misuse $_flow_f "program '$_flow_v' is not an executable file"
                return 2
            fi
            _flow_prog=$_flow_v
            ;;
        --cpus | --gpus)
            # digits here; the manager checks their range, as it reads the rest
            if ! _flow_valid count "$_flow_v"; then
                _flow_misuse $_flow_f "$_flow_opt '$_flow_v' is not a whole number"
                return 2
            fi
            _flow_q=${_flow_v%%[!0]*} # JSON numbers have no leading zeros
            _flow_q=${_flow_v#"$_flow_q"}
            if [[ $_flow_opt == --cpus ]]; then
                _flow_cpus=${_flow_q:-0}
            else
                _flow_gpus=${_flow_q:-0}
            fi
            ;;
        --mem)
            # a size such as 4G (or bare megabytes) that the manager reads
            if [[ -z $_flow_v ]]; then
                _flow_misuse $_flow_f "--mem needs a size such as 4G, 512M or 2048 (megabytes)"
                return 2
            fi
            _flow_json_quote _flow_mem "$_flow_v"
            ;;
        --resource)
            if [[ $_flow_v != *=* ]]; then
                _flow_misuse $_flow_f "--resource needs NAME=N, got '$_flow_v'"
                return 2
            fi
            _flow_k=${_flow_v%%=*}
            if ! _flow_valid label "$_flow_k"; then
                _flow_misuse $_flow_f "resource name '$_flow_k' is not valid (1-128 letters, digits and '_.+-', starting with a letter or digit)"
                return 2
            fi
            _flow_v=${_flow_v#*=}
            if ! _flow_valid count "$_flow_v"; then
                _flow_misuse $_flow_f "--resource $_flow_k=$_flow_v: '$_flow_v' is not a whole number"
                return 2
            fi
            if [[ -n ${_flow_rseen[$_flow_k]-} ]]; then
                _flow_misuse $_flow_f "resource '$_flow_k' is given twice"
                return 2
            fi
            _flow_rseen[$_flow_k]=1
            _flow_q=${_flow_v%%[!0]*}
            _flow_q=${_flow_v#"$_flow_q"}
            _flow_res+=${_flow_res:+,}"\"$_flow_k\":${_flow_q:-0}"
            ;;
        esac
    done
    if [[ -z $_flow_prog ]] && ((${#_flow_steps_list[@]})) && [[ -z ${_flow_declared[${_flow_s:-main}]-} ]]; then
        _flow_misuse $_flow_f "the child would start at step '${_flow_s:-main}', which is not declared with flow_steps (declared: ${_flow_steps_list[*]}); pass --step"
        return 2
    fi
    _flow_label=${_flow_label:-c$_flow_nspawn}
    if [[ -n ${_flow_labels[$_flow_label]-} ]]; then
        _flow_misuse $_flow_f "label '$_flow_label' is used twice in this attempt"
        return 2
    fi
    # shellcheck disable=SC2004 # an associative array (flow.sh declares it)
    _flow_labels[$_flow_label]=1
    _flow_line="{\"label\":\"$_flow_label\""
    [[ -z $_flow_tag ]] || _flow_line+=",\"tag\":\"$_flow_tag\""
    [[ -z $_flow_s ]] || _flow_line+=",\"step\":\"$_flow_s\""
    [[ -z $_flow_params ]] || _flow_line+=",\"params\":{$_flow_params}"
    [[ -z $_flow_prio ]] || _flow_line+=",\"priority\":$_flow_prio"
    if [[ -n $_flow_prog ]]; then
        _flow_json_quote _flow_q "$_flow_prog"
        _flow_line+=",\"program\":$_flow_q"
    fi
    [[ -z $_flow_cpus ]] || _flow_line+=",\"cpus\":$_flow_cpus"
    [[ -z $_flow_gpus ]] || _flow_line+=",\"gpus\":$_flow_gpus"
    [[ -z $_flow_mem ]] || _flow_line+=",\"mem\":$_flow_mem"
    [[ -z $_flow_res ]] || _flow_line+=",\"resources\":{$_flow_res}"
    _flow_children+=$_flow_line$'}\n'
    return 0
}

# flow_wait STEP [--all-succeeded|--all-done|--any-succeeded] [--on-impossible STEP]
# End this attempt: register the spawned children and continue at STEP once the join holds.
_flow_do_wait() {
    local _flow_s=${1-} _flow_mode=all_succeeded _flow_imp="" _flow_extra _flow_f=flow_wait
    if (($# < 1)); then
        _flow_misuse $_flow_f "usage: flow_wait STEP [--all-succeeded|--all-done|--any-succeeded] [--on-impossible STEP]"
    else
        shift
        _flow_check_step $_flow_f "$_flow_s" || true
    fi
    while (($#)); do
        case $1 in
        --all-succeeded) _flow_mode=all_succeeded ;;
        --all-done) _flow_mode=all_done ;;
        --any-succeeded) _flow_mode=any_succeeded ;;
        --on-impossible)
            if (($# < 2)); then
                _flow_misuse $_flow_f "--on-impossible needs a step"
                break
            fi
            _flow_imp=$2
            _flow_check_step $_flow_f "$_flow_imp" || true
            shift
            ;;
        *)
            _flow_misuse $_flow_f "unknown argument '$1'"
            break
            ;;
        esac
        shift
    done
    if [[ -z $_flow_children ]]; then
        _flow_misuse $_flow_f "no children were spawned: a join over nothing can never be decided; call flow_spawn before flow_wait"
    fi
    _flow_extra=",\"step\":\"$_flow_s\",\"join\":\"$_flow_mode\""
    [[ -z $_flow_imp ]] || _flow_extra+=",\"on_impossible\":\"$_flow_imp\""
    _flow_more_outcome $_flow_f wait "" "$_flow_extra"
}

# flow_children: after a join, one line per child: LABEL ID STATE PATH
_flow_do_children() {
    local _flow_file=${FLOW_CONTROL_DIR-}/children _flow_line
    if [[ ! -f $_flow_file ]]; then
        _flow_say 'flow_children: no children file in this attempt; it exists in the step that follows a flow_wait\n'
        return 1
    fi
    while IFS= read -r _flow_line || [[ -n $_flow_line ]]; do
        printf '%s\n' "$_flow_line"
    done <"$_flow_file"
    return 0
}
