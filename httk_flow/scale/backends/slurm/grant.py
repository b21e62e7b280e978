"""What Slurm granted the job this process runs in, on this node, read from the
environment srun and sbatch give every task (no command is run)."""

from __future__ import annotations

from collections.abc import Mapping

from httk_flow.protocol.resources import Grant


def _positive(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def grant_from(environ: Mapping[str, str]) -> Grant | None:
    """CPUs (SLURM_CPUS_ON_NODE, else the first figure of SLURM_JOB_CPUS_PER_NODE),
    memory (SLURM_MEM_PER_NODE, else SLURM_MEM_PER_CPU times the CPUs; megabytes) and
    GPU ids (SLURM_STEP_GPUS, else SLURM_JOB_GPUS); None outside a Slurm job."""
    sources: list[tuple[str, str]] = []
    cpus = _positive(environ.get("SLURM_CPUS_ON_NODE", ""))
    if cpus is not None:
        sources.append(("cpus", "Slurm (SLURM_CPUS_ON_NODE)"))
    else:
        # "4(x2),2": the first node's figure; a manager runs on each node of its job
        first = environ.get("SLURM_JOB_CPUS_PER_NODE", "").split(",")[0].split("(")[0]
        cpus = _positive(first)
        if cpus is not None:
            sources.append(("cpus", "Slurm (SLURM_JOB_CPUS_PER_NODE)"))
    mem = _positive(environ.get("SLURM_MEM_PER_NODE", ""))
    if mem is not None:
        mem <<= 20
        sources.append(("mem", "Slurm (SLURM_MEM_PER_NODE)"))
    else:
        per_cpu = _positive(environ.get("SLURM_MEM_PER_CPU", ""))
        if per_cpu is not None and cpus is not None:
            mem = (per_cpu << 20) * cpus
            sources.append(("mem", "Slurm (SLURM_MEM_PER_CPU)"))
    gpus: tuple[str, ...] | None = None
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if var in environ:
            gpus = tuple(g.strip() for g in environ[var].split(",") if g.strip())
            sources.append(("gpus", var))
            break
    if cpus is None and mem is None and gpus is None:
        return None
    return Grant(cpus=cpus, mem=mem, gpus=gpus, sources=tuple(sources))
