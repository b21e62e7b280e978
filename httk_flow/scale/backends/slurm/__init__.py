"""The Slurm backend: manager allocations as Slurm batch jobs.

The only place in httk_flow that names a batch system. Submits with `sbatch --parsable`
(token in the job name and the comment, `--signal=B:TERM@<drain>`), observes with
`squeue -t all` (and `scontrol show job` for jobs squeue no longer lists), finds a
submission by its token, and ends a manager with `scancel -b -s TERM` so it drains.
"""

from __future__ import annotations

from httk_flow.scale.backends.slurm.backend import SlurmBackend
from httk_flow.scale.backends.slurm.grant import grant_from
from httk_flow.scale.backends.slurm.single import SBATCH

BACKEND = SlurmBackend()
#: commands this backend adds to `flow` (plain descriptions the CLI builds)
COMMANDS = [SBATCH]
#: option names `flow scale` accepts for this backend's submission arguments
SUBMIT_ARG_FLAGS = ["--sbatch-arg"]
#: what Slurm granted the job this process runs in, on this node (from its environment)
GRANT = grant_from

__all__ = ["BACKEND", "COMMANDS", "GRANT", "SUBMIT_ARG_FLAGS", "SlurmBackend"]
