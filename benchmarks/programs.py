"""The programs both engines run, as text; runners() writes them under the temporary root.

For each workload one httk_flow bash-API runner and one reference bash-SDK runner that do
the same steps, plus REF_HAND: the reference's outcomes published by hand through its
documented rename protocol, so that no interpreter starts inside a job; HQ_API1, the same
shell work as FLOW_API1 for HyperQueue (no engine API); NOOP, a bare bash script file.
"""

from __future__ import annotations

import os

from harness import Bench

# -- the programs both engines run --------------------------------------------------------

FLOW_API1 = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main
step_main() { flow_succeed; }
flow_main "$@"
"""

#: HyperQueue's peer of FLOW_API1: the same shell work without an engine API. A bash
#: script file run as ./hq_api1.sh whose one step function writes a small outcome JSON with
#: printf into the task's own directory (HQ_TASK_DIR); HyperQueue takes the exit status.
#: FLOW_API1 also sources the API (function definitions, no process) and publishes its
#: outcome with one `mv` (a fork and exec): that difference is httk_flow's cost, measured.
HQ_API1 = """#!/usr/bin/env bash
steps=(main)
step_main() { printf '{"action":"%s","message":"%s"}\\n' succeed "" >"$HQ_TASK_DIR/outcome.json"; }
"step_${steps[0]}" "$@"
"""

#: the floor of a job that is a bash script file: `./noop.sh` (env, then bash, reading it)
NOOP = """#!/usr/bin/env bash
:
"""

FLOW_API2 = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main second
step_main() { flow_advance second; }
step_second() { flow_succeed; }
flow_main "$@"
"""

FLOW_FANOUT = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main child collect
step_main() {
    local n i
    flow_param -v n children 1
    for ((i = 1; i <= n; i++)); do flow_spawn --step child --label "c$i"; done
    flow_wait collect --all-succeeded
}
step_child() { flow_succeed; }
step_collect() { flow_succeed; }
flow_main "$@"
"""

#: the backlogs' program (first claim, RSS, status): it holds its worker, so that the
#: repetitions do not run the ready backlog down; a drain or stray_kill() ends it
FLOW_HOLD = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main
step_main() { sleep 900; flow_succeed; }
flow_main "$@"
"""

REF_SDK_HOLD = """#!/usr/bin/env bash
source "$HTTK_WORKFLOW_BASH_API"
httk_workflow_runner hold main
step_main() { sleep 900; httk_workflow_succeed; }
httk_workflow_main "$@"
"""

REF_SDK1 = """#!/usr/bin/env bash
source "$HTTK_WORKFLOW_BASH_API"
httk_workflow_runner noop main
step_main() { httk_workflow_succeed; }
httk_workflow_main "$@"
"""

REF_SDK2 = """#!/usr/bin/env bash
source "$HTTK_WORKFLOW_BASH_API"
httk_workflow_runner noop2 main second
step_main() { httk_workflow_advance second; }
step_second() { httk_workflow_succeed; }
httk_workflow_main "$@"
"""

#: the SDK's own way to make many calls in one interpreter start: httk_workflow_batch
REF_SDK_FANOUT = """#!/usr/bin/env bash
source "$HTTK_WORKFLOW_BASH_API"
httk_workflow_runner fanout main child collect
step_main() {
    local n i
    n=$(httk_workflow_parameter children)
    {
        for ((i = 1; i <= n; i++)); do echo "spawn c$i --step child"; done
        echo "gather collect"
    } | httk_workflow_batch
}
step_child() { httk_workflow_succeed; }
step_collect() { httk_workflow_succeed; }
httk_workflow_main "$@"
"""

#: the same steps publishing their outcomes by hand through the reference's documented
#: protocol: a draft outcome.tmp.<x>/ (outcome.json, and for a fan-out children/spawn.json
#: and children/jobs/<key>/job.json) renamed to outcome.ready/ in the attempt control
#: directory. No interpreter is started. The parameters in job.json pick the workload:
#: children=N spawns N children and waits on them, two_step=true advances once.
REF_HAND = r"""#!/usr/bin/env bash
set -e
if [ "${HTTK_WORKFLOW_DESCRIBE:-}" = 1 ]; then
    printf '{"format": "httk-workflow-runner-description", "format_version": 2, '
    printf '"steps": ["main", "second", "child", "collect"], "workflow": "noop-hand"}\n'
    exit 0
fi
ctx=$HTTK_WORKFLOW_CONTEXT
# the context is JSON with sorted keys: activation_id comes before the children and join
# lists, workspace_id after them (the greedy match takes the last one)
[[ $ctx =~ \"activation_id\":\"([^\"]+)\" ]] && act=${BASH_REMATCH[1]}
[[ $ctx =~ .*\"workspace_id\":\"([^\"]+)\" ]] && wsid=${BASH_REMATCH[1]}
key=${HTTK_WORKFLOW_JOB_DIR##*/}
job=${key##*--}
att=${HTTK_WORKFLOW_CONTROL_DIR##*/}
placement=${HTTK_WORKFLOW_JOB_DIR#"$HTTK_WORKFLOW_WORKSPACE_DIR"/}
placement=${placement%/*}
# never publish outside an attempt: an empty or unset variable would mean the root
control=${HTTK_WORKFLOW_CONTROL_DIR:?not inside an attempt}
tmp=$control/outcome.tmp.$(</proc/sys/kernel/random/uuid)
mkdir "$tmp"
head="\"format\":\"httk-workflow-outcome\",\"format_version\":2,\"job_id\":\"$job\""
head+=",\"activation_id\":\"$act\",\"attempt_id\":\"$att\""
case $HTTK_WORKFLOW_STEP in
child | collect | second) body='"action":"succeed"' ;;
main)
    definition=$(<"$HTTK_WORKFLOW_JOB_DIR/job.json")
    if [[ $definition =~ \"children\":([0-9]+) ]]; then
        n=${BASH_REMATCH[1]}
        mkdir -p "$tmp/children/jobs"
        spawn="" join=""
        for ((i = 1; i <= n; i++)); do
            id=$(</proc/sys/kernel/random/uuid)
            sid=$(</proc/sys/kernel/random/uuid)
            parent="{\"activation_id\":\"$act\",\"job_id\":\"$job\",\"job_key\":\"$key\""
            parent+=",\"placement\":\"$placement\",\"spawn_id\":\"$sid\""
            parent+=",\"workspace_id\":\"$wsid\"}"
            child=${definition/\"id\":\"$job\"/\"id\":\"$id\"}
            child=${child/\"initial_step\":\"main\"/\"initial_step\":\"child\"}
            child=${child/\"tag\":null/\"tag\":\"c$i\"}
            child=${child/\"parent\":null/\"parent\":$parent}
            mkdir "$tmp/children/jobs/c$i--$id"
            printf '%s' "$child" >"$tmp/children/jobs/c$i--$id/job.json"
            ref="\"workspace_id\":\"$wsid\",\"job_id\":\"$id\",\"job_key\":\"c$i--$id\""
            spawn+="${spawn:+,}{$ref,\"label\":\"c$i\",\"placement\":\"$placement\",\"spawn_id\":\"$sid\"}"
            join+="${join:+,}{$ref,\"placement_hint\":\"$placement\"}"
        done
        printf '{"format":"httk-workflow-spawn","format_version":2,"children":[%s]}' \
            "$spawn" >"$tmp/children/spawn.json"
        body="\"action\":\"wait\",\"next_step\":\"collect\""
        body+=",\"join\":{\"children\":[$join],\"condition\":\"all_succeeded\"}"
    elif [[ $definition =~ \"two_step\":true ]]; then
        body='"action":"advance","next_step":"second"'
    else
        body='"action":"succeed"'
    fi
    ;;
*) body='"action":"fail","failure":{"code":"unknown_step","message":"no such step"}' ;;
esac
printf '{%s,%s}\n' "$head" "$body" >"$tmp/outcome.json"
if [ "${HTTK_WORKFLOW_DURABLE:-0}" = 1 ]; then sync; fi
mv -T "$tmp" "$control/outcome.ready"
"""


#: the reference's documented bulk path (httk.workflow.scaffold.new_jobs: "the pattern for
#: a campaign of any size": the runner is described and published once), in one process;
#: placements jobs/00 .. jobs/ff, 256 directories like httk_flow's default shards
def runners(b: Bench) -> dict[str, str]:
    """The programs above, written once under the temporary directory (name -> path)."""
    done = getattr(b, "_versus_runners", None)
    if done is None:
        done = {}
        d = b.path("programs")
        os.makedirs(d)
        for name, text in (
            ("flow_api1", FLOW_API1),
            ("flow_hold", FLOW_HOLD),
            ("ref_sdk_hold", REF_SDK_HOLD),
            ("flow_api2", FLOW_API2),
            ("flow_fanout", FLOW_FANOUT),
            ("ref_sdk1", REF_SDK1),
            ("ref_sdk2", REF_SDK2),
            ("ref_sdk_fanout", REF_SDK_FANOUT),
            ("ref_hand", REF_HAND),
            ("hq_api1", HQ_API1),
            ("noop", NOOP),
        ):
            path = os.path.join(d, f"{name}.sh")
            with open(path, "w") as fh:
                fh.write(text)
            os.chmod(path, 0o755)
            done[name] = path
        b._versus_runners = done  # type: ignore[attr-defined]
    return done
