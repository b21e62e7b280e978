"""What one manager has to give its attempts: CPUs, GPUs, memory and site resources.

Each defaults from the environment the manager really runs in (its affinity mask, the
batch system's allocation, the cgroup's memory limit), never from the machine's size:
on a 128-core node where the batch system granted 4 CPUs a manager has 4.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from httk_flow.errors import UsageError
from httk_flow.protocol.resources import (
    MAX_COUNT,
    NO_GRANT,
    Grant,
    Offer,
    Request,
    parse_resource,
    parse_size,
)

#: the variables GPU runtimes read to know which devices a process may use
CUDA_DEVICES = "CUDA_VISIBLE_DEVICES"
ROCR_DEVICES = "ROCR_VISIBLE_DEVICES"
HIP_DEVICES = "HIP_VISIBLE_DEVICES"
ONEAPI_DEVICES = "ZE_AFFINITY_MASK"
#: where GPU ids may come from, in the order they are believed
GPU_VARIABLES = (CUDA_DEVICES, ROCR_DEVICES, HIP_DEVICES, ONEAPI_DEVICES)
#: one entry per GPU the NVIDIA driver knows on this node
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"


@dataclass(frozen=True)
class Inventory:
    #: how many CPUs attempts may hold at once
    cpus: int
    #: the CPU ids this process may run on (its affinity mask, as far as `cpus` uses it);
    #: fewer than `cpus` when the user oversubscribes with --cpus
    cpu_ids: tuple[int, ...]
    gpus: tuple[str, ...] = ()
    #: bytes attempts may hold at once (their stated --mem)
    mem: int = 0
    custom: tuple[tuple[str, int], ...] = ()
    #: where each figure came from, for `flow managers` and the start line
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def offer(self) -> Offer:
        return Offer(self.cpus, self.gpus, self.mem, self.custom)

    def lacks(self, need: Request) -> str | None:
        """Why a request can never fit here, even with nothing running (None: it can)."""
        return self.offer.lacks(need)

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "cpu_ids": list(self.cpu_ids),
            "gpus": list(self.gpus),
            "mem": self.mem,
            "custom": dict(self.custom),
        }

    def describe(self) -> str:
        return self.offer.describe()


def detect(
    *,
    cpus: int | None = None,
    gpus: str | None = None,
    mem: str | None = None,
    resources: tuple[str, ...] = (),
    environ: Mapping[str, str] = os.environ,
    grant: Grant = NO_GRANT,
    affinity: Callable[[], set[int]] | None = None,
    read_text: Callable[[str], str | None] | None = None,
) -> Inventory:
    """The manager's inventory: each figure from its flag, else from where it runs (its
    affinity mask, `grant`: what the batch system it runs in granted, the environment)."""
    read = read_text or _read_text
    sources: list[tuple[str, str]] = []
    mask = sorted((affinity or _affinity)())
    granted, why = grant.cpus, grant.source("cpus")
    if granted is not None and granted < len(mask):
        # the batch system granted fewer CPUs than the mask shows (no CPU binding there)
        mask = mask[:granted]
    if cpus is not None:
        if not 1 <= cpus <= MAX_COUNT:
            raise UsageError(f"must be from 1 to {MAX_COUNT}", obj=f"--cpus {cpus}")
        ncpu, src = cpus, "--cpus"
        ids = tuple(mask[:cpus])
    else:
        ncpu, ids = len(mask), tuple(mask)
        src = why if granted is not None and granted <= len(mask) else "the affinity mask"
    sources.append(("cpus", src))
    gpu_ids, gsrc = _gpus(gpus, environ, grant, read)
    sources.append(("gpus", gsrc))
    if mem is not None:
        mbytes, msrc = parse_size(mem, "--mem"), "--mem"
    else:
        mbytes, msrc = _memory(grant, read)
    sources.append(("mem", msrc))
    custom: dict[str, int] = {}
    for item in resources:
        name, n = parse_resource(item, "--resource")
        if name in custom:
            raise UsageError(f"resource {name!r} is given twice", obj=f"--resource {item!r}")
        custom[name] = n
    return Inventory(
        cpus=ncpu,
        cpu_ids=ids,
        gpus=gpu_ids,
        mem=mbytes,
        custom=tuple(sorted(custom.items())),
        sources=tuple(sources),
    )


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def parse_gpu_flag(text: str) -> tuple[str, ...] | int:
    """--gpus: a count (`4`) or a list of ids (`0,1`, `2,` for the one GPU with id 2)."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    ids = tuple(x.strip() for x in t.split(",") if x.strip())
    if not ids or any(not x.replace("-", "").replace("_", "").isalnum() for x in ids):
        raise UsageError(
            f"{text!r} is neither a count nor a list of GPU ids",
            obj="--gpus",
            hint="write a count (--gpus 4) or ids (--gpus 0,1; one id: --gpus 2,)",
        )
    if len(set(ids)) != len(ids):
        raise UsageError(f"{text!r} names a GPU twice", obj="--gpus")
    return ids


def _id_list(value: str) -> tuple[str, ...]:
    if value.strip() in ("", "NoDevFiles", "none", "-1"):
        return ()
    return tuple(x.strip() for x in value.split(",") if x.strip())


def _gpus(
    flag: str | None,
    environ: Mapping[str, str],
    grant: Grant,
    read: Callable[[str], str | None],
) -> tuple[tuple[str, ...], str]:
    found: tuple[str, ...] = ()
    src = "none found"
    for var in GPU_VARIABLES:
        if var in environ:
            found, src = _id_list(environ[var]), var
            break
    else:
        if grant.gpus is not None:
            found, src = grant.gpus, grant.source("gpus")
    if src == "none found":
        listing = read(NVIDIA_GPUS_DIR)
        if listing:
            found = tuple(str(i) for i in range(len(listing.split())))
            src = "the NVIDIA driver"
    if flag is None:
        return found, src
    wanted = parse_gpu_flag(flag)
    if isinstance(wanted, int):
        if wanted <= len(found):
            return found[:wanted], "--gpus"
        # more than were found: the user knows the node (or is testing); number them
        return tuple(str(i) for i in range(wanted)), "--gpus"
    return wanted, "--gpus"


def _memory(grant: Grant, read: Callable[[str], str | None]) -> tuple[int, str]:
    if grant.mem is not None:
        return grant.mem, grant.source("mem")
    limit = _cgroup_limit(read)
    machine = _machine_memory()
    if limit is not None and (machine == 0 or limit < machine):
        return limit, "the cgroup limit"
    return machine, "the machine"


def _cgroup_limit(read: Callable[[str], str | None]) -> int | None:
    """The memory limit of this process's cgroup (v2 memory.max, v1 limit_in_bytes)."""
    text = read("/proc/self/cgroup") or ""
    limits: list[int] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            base, leaf = "/sys/fs/cgroup", "memory.max"
        elif "memory" in controllers.split(","):
            base, leaf = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        else:
            continue
        # the limit may be set on an ancestor (a batch job's cgroup above its step's)
        path = path.rstrip("/")
        while True:
            value = read(f"{base}{path}/{leaf}")
            if value and value.strip().isdigit():
                n = int(value.strip())
                if 0 < n < (1 << 60):  # v1 says "no limit" with a huge number
                    limits.append(n)
            if not path:
                break
            path = path.rsplit("/", 1)[0]
    return min(limits) if limits else None


def _machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def _read_text(path: str) -> str | None:
    try:
        if os.path.isdir(path):
            return " ".join(sorted(os.listdir(path)))
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return None
