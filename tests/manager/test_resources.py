"""Resources with real managers and real jobs: packing, binding, GPUs, the worker default.

Every job script stamps its own start and end (with what it was given) into a file of
its own; concurrency is measured from those stamps, never from the manager's word.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from httk_flow.protocol.resources import Request
from httk_flow.protocol.states import State

from .support import FLOW, Managers, job, log_of, submit, write_script

#: stamps "start T CPUS CPU_LIST GPUS PID" and "end T" into $STAMPS/<job id>.<attempt>
STAMP = r"""
f="$STAMPS/$FLOW_JOB_ID.$FLOW_ATTEMPT_ID"
g="${CUDA_VISIBLE_DEVICES-unset}"
[ -n "$g" ] || g=none
echo "start $(date +%s.%N) $FLOW_CPUS ${FLOW_CPU_LIST:--} $g $$" >> "$f"
grep Cpus_allowed_list /proc/self/status | tr -d '\t' >> "$f"
sleep "${NAP:-0.4}"
echo "end $(date +%s.%N)" >> "$f"
publish '{"action":"succeed"}'
"""


def _stamps(d: Path) -> list[dict[str, object]]:
    out = []
    for f in sorted(d.iterdir()):
        lines = f.read_text().splitlines()
        if len(lines) < 2:  # its job is still writing its first lines: not ended
            out.append({"job": f.name.split(".")[0], "end": None})
            continue
        start = lines[0].split()
        end = [x for x in lines if x.startswith("end ")]
        out.append(
            {
                "job": f.name.split(".")[0],
                "start": float(start[1]),
                "end": float(end[0].split()[1]) if end else None,
                "cpus": int(start[2]),
                "cpu_list": start[3],
                "gpus": [] if start[4] in ("none", "unset") else start[4].split(","),
                "gpu_env": start[4],
                "allowed": lines[1].split(":", 1)[1],
            }
        )
    return out


def _peak(stamps: list[dict[str, object]], what: str) -> int:
    """The most of `what` held at one instant, from the jobs' own stamps."""
    events: list[tuple[float, int]] = []
    for s in stamps:
        n = s[what] if what == "cpus" else len(s[what])  # type: ignore[arg-type]
        events += [(s["start"], n), (s["end"], -n)]  # type: ignore[list-item]
    peak = cur = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        cur += d
        peak = max(peak, cur)
    return peak


@pytest.fixture
def stamps(tmp_path: Path) -> Path:
    d = tmp_path / "stamps"
    d.mkdir()
    return d


def test_four_cpus_hold_four_one_cpu_jobs_or_one_four_cpu_job(
    root: str, scripts: Path, managers: Managers, stamps: Path
) -> None:
    prog = write_script(scripts, "job.sh", STAMP)
    small = submit(root, prog, 8)
    big = submit(root, prog, 2, resources=Request(cpus=4))
    rc = managers.run(root, "--cpus", "4", workers=16, env={"STAMPS": str(stamps)})
    assert rc == 0, log_of(managers.procs[-1])
    got = _stamps(stamps)
    assert sorted(s["job"] for s in got) == sorted(small + big)
    assert _peak(got, "cpus") <= 4
    assert _peak(got, "cpus") == 4  # it did pack four 1-CPU jobs at once
    for b in (s for s in got if s["job"] in big):
        assert b["cpus"] == 4
        overlapping = [
            s
            for s in got
            if s is not b and s["start"] < b["end"] and b["start"] < s["end"]  # type: ignore[operator]
        ]
        assert overlapping == [], f"a 4-CPU job shared the manager's 4 CPUs: {overlapping}"


def test_cpu_ids_are_disjoint_and_bind_pins_each_attempt(
    root: str, scripts: Path, managers: Managers, stamps: Path
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to pin two attempts apart")
    prog = write_script(scripts, "job.sh", STAMP)
    submit(root, prog, 6)
    rc = managers.run(root, "--cpus", "2", "--bind", "cpus", workers=8, env={"STAMPS": str(stamps)})
    assert rc == 0, log_of(managers.procs[-1])
    got = _stamps(stamps)
    assert len(got) == 6
    mask = sorted(os.sched_getaffinity(0))[:2]
    for s in got:
        # pinned: the kernel's own list for the attempt is the one CPU it was given
        assert s["allowed"] == s["cpu_list"], s
        assert int(str(s["cpu_list"])) in mask
    for a in got:
        for b in got:
            if a is not b and a["start"] < b["end"] and b["start"] < a["end"]:  # type: ignore[operator]
                assert a["cpu_list"] != b["cpu_list"], (a, b)


def test_gpu_ids_are_disjoint_and_jobs_without_gpus_see_none(
    root: str, scripts: Path, managers: Managers, stamps: Path, tmp_path: Path
) -> None:
    prog = write_script(scripts, "job.sh", STAMP)
    one = submit(root, prog, 4, resources=Request(gpus=1))
    two = submit(root, prog, 2, resources=Request(gpus=2))
    none = submit(root, prog, 2)
    env = {
        "STAMPS": str(stamps),
        "CUDA_VISIBLE_DEVICES": "3,5,7",
        "FLOW_DEVICE_LEDGER_DIR": str(tmp_path / "ledger"),
    }
    rc = managers.run(root, "--cpus", "8", workers=8, env=env)
    assert rc == 0, log_of(managers.procs[-1])
    got = {s["job"]: s for s in _stamps(stamps)}
    for j in one:
        assert len(got[j]["gpus"]) == 1 and set(got[j]["gpus"]) <= {"3", "5", "7"}  # type: ignore[arg-type]
    for j in two:
        assert len(got[j]["gpus"]) == 2 and set(got[j]["gpus"]) <= {"3", "5", "7"}  # type: ignore[arg-type]
    for j in none:
        assert got[j]["gpu_env"] == "none"  # CUDA_VISIBLE_DEVICES is empty: it sees no GPU
    _assert_gpus_disjoint(list(got.values()))
    assert _peak(list(got.values()), "gpus") <= 3


def _assert_gpus_disjoint(got: list[dict[str, object]]) -> None:
    for a in got:
        for b in got:
            if a is b or a["end"] is None or b["end"] is None:
                continue
            if a["start"] < b["end"] and b["start"] < a["end"]:  # type: ignore[operator]
                shared = set(a["gpus"]) & set(b["gpus"])  # type: ignore[call-overload]
                assert not shared, f"GPU {shared} held twice at once: {a} {b}"


#: a 1-GPU job that notes a conflict if another live attempt holds its GPU, then sleeps
HOLDER = r"""
f="$STAMPS/$FLOW_JOB_ID.$FLOW_ATTEMPT_ID"
g="$CUDA_VISIBLE_DEVICES"
echo "start $(date +%s.%N) $FLOW_CPUS - $g $$" >> "$f"
echo "Cpus_allowed_list:-" >> "$f"
# alive, and not a zombie waiting for the test's reaper to collect it
h=$(cat "$STAMPS/../gpu-$g" 2>/dev/null)
if [ -n "$h" ] && grep -Eqs '^State:[[:space:]]+[RSDTtWI]' "/proc/$h/status"; then
    echo "$FLOW_JOB_ID got GPU $g held by $h ($(grep -s '^State' "/proc/$h/status"), \
$(tr '\0' ' ' < "/proc/$h/cmdline" 2>/dev/null))" >> "$STAMPS/../conflicts"
fi
echo $$ > "$STAMPS/../gpu-$g"
if [ "$(bump main)" -eq 1 ]; then sleep 30; else sleep 0.3; fi
echo "end $(date +%s.%N)" >> "$f"
publish '{"action":"succeed"}'
"""


def test_gpus_stay_disjoint_across_a_manager_kill_and_recovery(
    root: str, scripts: Path, managers: Managers, stamps: Path, tmp_path: Path
) -> None:
    """A manager killed with kill -9 leaves its GPU attempts running; the next manager on
    the node gives new work only GPUs they do not hold, then recovers them."""
    prog = write_script(scripts, "hold.sh", HOLDER)
    first = submit(root, prog, 2, resources=Request(gpus=1))
    env = {
        "STAMPS": str(stamps),
        "CUDA_VISIBLE_DEVICES": "0,1,2",
        "FLOW_DEVICE_LEDGER_DIR": str(tmp_path / "ledger"),
    }
    a = managers.start(root, "--cpus", "4", command="serve", workers=4, env=env)
    wait_for(lambda: len(list(stamps.iterdir())) >= 2 or a.poll() is not None, 30)
    assert a.poll() is None, log_of(a)
    held = {s["gpus"][0] for s in _stamps(stamps)}  # type: ignore[index]
    a.send_signal(signal.SIGKILL)
    a.wait()
    later = submit(root, prog, 3, resources=Request(gpus=1))
    # a manager "on another host" would not kill the orphans; this one is on their node:
    # it must not hand their GPUs to new work while they live, then it recovers them
    rc = managers.run(root, "--cpus", "4", workers=4, env=env, timeout=90)
    assert rc == 0, log_of(managers.procs[-1])
    conflicts = tmp_path / "conflicts"
    assert not conflicts.exists(), conflicts.read_text()
    got = _stamps(stamps)
    assert {s["job"] for s in got} == set(first + later)
    assert len(held) == 2


def test_two_managers_on_one_node_never_share_a_gpu(
    root: str, scripts: Path, managers: Managers, stamps: Path, tmp_path: Path
) -> None:
    prog = write_script(scripts, "job.sh", STAMP)
    submit(root, prog, 8, resources=Request(gpus=1))
    env = {
        "STAMPS": str(stamps),
        "CUDA_VISIBLE_DEVICES": "0,1",
        "FLOW_DEVICE_LEDGER_DIR": str(tmp_path / "ledger"),
        "NAP": "0.6",
    }
    ps = [managers.start(root, "--cpus", "2", workers=2, env=env) for _ in range(2)]
    for p in ps:
        assert p.wait(90) == 0, log_of(p)
    got = _stamps(stamps)
    assert len(got) == 8
    _assert_gpus_disjoint(got)
    assert _peak(got, "gpus") <= 2


def test_a_large_job_reserves_what_it_needs_after_waiting(
    root: str, scripts: Path, managers: Managers, stamps: Path
) -> None:
    """With a 1-CPU job running, a 2-CPU job does not fit; with --reserve-after 0 the
    small jobs behind it may not take the CPU that frees, so it starts next."""
    prog = write_script(scripts, "job.sh", STAMP)
    [first] = submit(root, prog, 1, priority=9)
    env = {"STAMPS": str(stamps), "NAP": "1"}
    p = managers.start(
        root, "--cpus", "2", "--reserve-after", "0s", command="serve", workers=4, env=env
    )
    wait_for(lambda: any(stamps.iterdir()) or p.poll() is not None, 20)
    [big] = submit(root, prog, 1, priority=8, resources=Request(cpus=2))
    # registered (ready, seen by the manager) before the small ones exist, so it is the
    # best candidate that does not fit when they come
    wait_for(lambda: job(root, big).state is State.READY or p.poll() is not None, 20)
    time.sleep(0.3)
    small = submit(root, prog, 6, priority=1)
    wait_for(lambda: len(list(stamps.iterdir())) == 8 or p.poll() is not None, 60, 0.1)
    wait_for(lambda: all(s["end"] for s in _stamps(stamps)), 30, 0.1)
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    got = {s["job"]: s for s in _stamps(stamps)}
    assert got[big]["start"] >= got[first]["end"]  # type: ignore[operator]
    # no small job started before the big one: the free CPU was kept for it
    assert all(got[s]["start"] >= got[big]["start"] for s in small), (got[big], got)


def test_small_jobs_backfill_while_a_large_one_cannot_fit(
    root: str, scripts: Path, managers: Managers, stamps: Path
) -> None:
    """Without a reservation yet (the default 60 s), small jobs use the CPU a large job
    cannot."""
    prog = write_script(scripts, "job.sh", STAMP)
    [first] = submit(root, prog, 1, priority=9)
    env = {"STAMPS": str(stamps), "NAP": "1.5"}
    p = managers.start(root, "--cpus", "2", command="serve", workers=4, env=env)
    wait_for(lambda: any(stamps.iterdir()) or p.poll() is not None, 20)
    [big] = submit(root, prog, 1, priority=8, resources=Request(cpus=2))
    small = submit(root, prog, 2, priority=1)
    wait_for(lambda: len(list(stamps.iterdir())) == 4 or p.poll() is not None, 60, 0.1)
    wait_for(lambda: all(s["end"] for s in _stamps(stamps)), 30, 0.1)
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    got = {s["job"]: s for s in _stamps(stamps)}
    # the first small job ran beside the first job, before the big one could start
    assert min(got[s]["start"] for s in small) < got[first]["end"]  # type: ignore[operator]
    assert got[big]["start"] >= got[first]["end"]  # type: ignore[operator]


def test_a_job_larger_than_the_manager_is_left_with_the_reason(
    root: str, scripts: Path, managers: Managers, stamps: Path
) -> None:
    prog = write_script(scripts, "job.sh", STAMP)
    submit(root, prog, 1, resources=Request(gpus=8))
    submit(root, prog, 1)
    rc = managers.run(root, "--cpus", "2", "--gpus", "4", workers=2, env={"STAMPS": str(stamps)})
    assert rc == 4
    log = log_of(managers.procs[-1])
    assert (
        "stopped with work left: 1 ready job asks more than this manager has (needs 8 "
        "GPUs; this manager has 4; start one with more: --cpus, --gpus, --mem, --resource)"
    ) in log
    assert len(list(stamps.iterdir())) == 1


def test_the_default_worker_count_follows_the_affinity_mask(
    root: str, scripts: Path, stamps: Path
) -> None:
    """Under `taskset -c 0` a manager has one CPU, so it runs one job at a time."""
    prog = write_script(scripts, "job.sh", STAMP)
    submit(root, prog, 4)
    env = {**os.environ, "STAMPS": str(stamps), "NAP": "0.3"}
    env.pop("SLURM_CPUS_ON_NODE", None)
    env.pop("SLURM_JOB_CPUS_PER_NODE", None)
    cpu = str(min(os.sched_getaffinity(0)))
    out = subprocess.run(
        ["taskset", "-c", cpu, *FLOW, "run", "-w", root, "--quiet"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode()
    got = _stamps(stamps)
    assert len(got) == 4
    assert _peak(got, "cpus") == 1
    assert {s["cpu_list"] for s in got} == {cpu}


def test_slurm_granted_cpus_bound_the_default(root: str, scripts: Path, stamps: Path) -> None:
    """A batch system that granted one CPU on a larger node: the manager has one."""
    prog = write_script(scripts, "job.sh", STAMP)
    submit(root, prog, 3)
    env = {**os.environ, "STAMPS": str(stamps), "NAP": "0.3", "SLURM_CPUS_ON_NODE": "1"}
    t0 = time.time()
    out = subprocess.run(
        [*FLOW, "run", "-w", root, "--quiet"], env=env, capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    got = _stamps(stamps)
    assert len(got) == 3 and _peak(got, "cpus") == 1
    assert time.time() - t0 >= 0.9


def test_a_resource_request_reaches_job_json_and_the_environment(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    env_out = tmp_path / "env"
    prog = write_script(
        scripts,
        "env.sh",
        f'env | grep -E "^(FLOW_(CPUS|CPU_LIST|GPUS|MEM|RESOURCE_)|OMP_NUM_THREADS|'
        f'CUDA_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES)" | sort > {env_out}\n'
        'publish \'{"action":"succeed"}\'\n',
    )
    out = subprocess.run(
        [
            *FLOW,
            "submit",
            "-w",
            root,
            "--cpus",
            "2",
            "--gpus",
            "1",
            "--mem",
            "1536M",
            "--resource",
            "licence=1",
            "--resource",
            "scratch-gb=100",
            prog,
        ],
        capture_output=True,
        check=True,
    )
    jid = out.stdout.decode().split()[-1]
    rc = managers.run(
        root,
        "--cpus",
        "2",
        "--gpus",
        "4,",
        "--mem",
        "2G",
        "--resource",
        "licence=1",
        "--resource",
        "scratch-gb=200",
        workers=2,
        env={"FLOW_DEVICE_LEDGER_DIR": str(tmp_path / "ledger")},
    )
    assert rc == 0, log_of(managers.procs[-1])
    assert env_out.read_text().splitlines() == [
        "CUDA_VISIBLE_DEVICES=4",
        "FLOW_CPUS=2",
        f"FLOW_CPU_LIST={','.join(str(c) for c in _two_cpus())}",
        "FLOW_GPUS=4",
        "FLOW_MEM=1536",
        "FLOW_RESOURCE_LICENCE=1",
        "FLOW_RESOURCE_SCRATCH_GB=100",
        "OMP_NUM_THREADS=2",
        "ROCR_VISIBLE_DEVICES=4",
    ]
    show = subprocess.run(
        [*FLOW, "show", "-w", root, jid, "--json"], capture_output=True, check=True
    )
    doc = orjson.loads(show.stdout)
    assert doc["resources"] == {
        "cpus": 2,
        "gpus": 1,
        "mem": 1536 << 20,
        "custom": {"licence": 1, "scratch-gb": 100},
    }


def _two_cpus() -> list[int]:
    mask = sorted(os.sched_getaffinity(0))
    return mask[:2] if len(mask) >= 2 else [mask[0]]


def test_status_names_a_job_too_large_for_every_live_manager(
    root: str, scripts: Path, managers: Managers, stamps: Path, tmp_path: Path
) -> None:
    prog = write_script(scripts, "job.sh", STAMP)
    submit(root, prog, 1, resources=Request(gpus=8, cpus=2))
    p = managers.start(
        root,
        "--cpus",
        "2",
        "--gpus",
        "4",
        "--mem",
        "2G",
        command="serve",
        workers=2,
        env={"STAMPS": str(stamps), "FLOW_DEVICE_LEDGER_DIR": str(tmp_path / "ledger")},
    )

    def managers_json() -> dict[str, object]:
        out = subprocess.run(
            [*FLOW, "managers", "-w", root, "--json"], capture_output=True, check=True
        )
        return orjson.loads(out.stdout)  # type: ignore[no-any-return]

    wait_for(lambda: managers_json()["managers"] or p.poll() is not None, 20)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    status = subprocess.run(
        [*FLOW, "status", "-w", root], capture_output=True, text=True, env=env, check=True
    )
    assert (
        "blocked: 1 job: needs 8 GPUs; the live manager has 4; start one with `flow serve --gpus 8`"
    ) in status.stdout, status.stdout
    [m] = managers_json()["managers"]  # type: ignore[misc]
    assert m["inventory"] == {"cpus": 2, "gpus": ["0", "1", "2", "3"], "mem": 2 << 30, "custom": {}}
    assert m["in_use"] == {"cpus": 0, "gpus": [], "mem": 0, "custom": {}}
    table = subprocess.run(
        [*FLOW, "managers", "-w", root], capture_output=True, text=True, env=env, check=True
    )
    header, row = table.stdout.splitlines()[:2]
    assert "IN USE" in header
    assert "0/2 CPUs, 0/4 GPUs" in row
    assert len(list(stamps.iterdir())) == 0
