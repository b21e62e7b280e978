"""What of its inventory a manager has free, and the concrete resources of each attempt.

A request (CPUs, GPUs, memory, site resources) is packed into what is free; each attempt
gets its own CPU ids and GPU ids, told to it in its environment, and with `--bind cpus`
its process group is pinned to its CPUs before the gate opens (no process is started
for it). GPUs and pinned CPUs are also held in the node's DeviceLedger, so no two
attempts share one, even across a manager's death.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from httk_flow.errors import UsageError
from httk_flow.manager.devices import DeviceLedger
from httk_flow.manager.inventory import (
    CUDA_DEVICES,
    ONEAPI_DEVICES,
    ROCR_DEVICES,
    Inventory,
)
from httk_flow.protocol import layout
from httk_flow.protocol.resources import Offer, Request

#: seconds a job that does not fit lets smaller jobs past before it keeps back what it needs
RESERVE_AFTER = 60.0
#: variables that select GPUs, each set to the attempt's own devices (HIP's is unset: it
#: counts within what ROCR already selected, so the same ids would select others)
_GPU_SET = (CUDA_DEVICES, ROCR_DEVICES, ONEAPI_DEVICES)


@dataclass(frozen=True)
class Binding:
    """The concrete resources one attempt holds."""

    slots: tuple[int, ...]  # CPU slots of the inventory (0..cpus-1)
    cpu_ids: tuple[int, ...]  # the CPU ids they stand for
    gpus: tuple[str, ...] = ()
    mem: int = 0
    custom: tuple[tuple[str, int], ...] = ()
    pinned: bool = False
    #: what it holds in the node's ledger (gpu:ID, cpu:ID)
    ledger: tuple[str, ...] = ()

    def env(self, manager_has_gpus: bool, environ: Mapping[str, str]) -> dict[str, str]:
        """The attempt's resource variables (docs/bash-api.md, "Resources")."""
        env = {
            layout.ENV_CPUS: str(len(self.slots)),
            layout.ENV_CPU_LIST: ",".join(str(c) for c in self.cpu_ids),
            layout.ENV_GPUS: ",".join(self.gpus),
        }
        if "OMP_NUM_THREADS" not in environ:
            env["OMP_NUM_THREADS"] = str(len(self.slots))
        if self.mem:
            env[layout.ENV_MEM] = str(self.mem >> 20)
        for name, n in self.custom:
            env[layout.env_resource(name)] = str(n)
        if manager_has_gpus or self.gpus:
            # an attempt that asked for no GPU sees none, not every GPU of the node
            ids = ",".join(self.gpus)
            for var in _GPU_SET:
                env[var] = ids
        return env


class Slots:
    """The free part of an inventory; every take is given back once its attempt ends."""

    def __init__(
        self, inventory: Inventory, *, bind_cpus: bool = False, ledger: DeviceLedger | None = None
    ) -> None:
        inv = inventory
        if bind_cpus and inv.cpus > len(inv.cpu_ids):
            raise UsageError(
                f"cannot pin {inv.cpus} CPUs: this process may run on {len(inv.cpu_ids)}",
                obj="--bind cpus",
                hint=f"use --cpus {len(inv.cpu_ids)} or less, or drop --bind",
            )
        self.inventory = inv
        self.bind_cpus = bind_cpus
        self._ledger = ledger
        self._free_cpus = list(range(inv.cpus))
        self._free_gpus = list(inv.gpus)
        self.mem_free = inv.mem
        self._custom_free = dict(inv.custom)
        self.held = 0  # attempts holding a binding

    @property
    def ledger(self) -> DeviceLedger:
        if self._ledger is None:
            self._ledger = DeviceLedger()
        return self._ledger

    @property
    def free_cpus(self) -> int:
        return len(self._free_cpus)

    @property
    def free_gpus(self) -> int:
        return len(self._free_gpus)

    def fits(self, need: Request, reserved: Request | None = None) -> bool:
        """Whether `need` fits in what is free, leaving `reserved` for a job that waits."""
        r_cpus = reserved.cpus if reserved else 0
        r_gpus = reserved.gpus if reserved else 0
        r_mem = reserved.mem if reserved else 0
        if need.cpus > len(self._free_cpus) - r_cpus:
            return False
        if need.gpus and need.gpus > len(self._free_gpus) - r_gpus:
            return False
        if need.mem and need.mem > self.mem_free - r_mem:
            return False
        held = dict(reserved.custom) if reserved else {}
        return all(self._custom_free.get(k, 0) - held.get(k, 0) >= n for k, n in need.custom)

    def take(self, need: Request) -> Binding | None:
        """Concrete resources for one attempt, or None (not free, or held by another
        attempt on this node that outlived its manager)."""
        if not self.fits(need):
            return None
        slots = self._free_cpus[: need.cpus]
        gpus = self._free_gpus[: need.gpus]
        held: list[str] = []
        if need.gpus:
            got = self.ledger.acquire("gpu", need.gpus, self._free_gpus)
            if got is None:
                return None
            gpus = got
            held += [f"gpu:{g}" for g in got]
        cpu_ids = self._cpu_ids(slots)
        if self.bind_cpus:
            real = [str(self.inventory.cpu_ids[s]) for s in self._free_cpus]
            got = self.ledger.acquire("cpu", need.cpus, real)
            if got is None:
                self.ledger.release(held)
                return None
            by_real = {str(self.inventory.cpu_ids[s]): s for s in self._free_cpus}
            slots = [by_real[c] for c in got]
            cpu_ids = tuple(int(c) for c in got)
            held += [f"cpu:{c}" for c in got]
        for s in slots:
            self._free_cpus.remove(s)
        for g in gpus:
            self._free_gpus.remove(g)
        self.mem_free -= need.mem
        for k, n in need.custom:
            self._custom_free[k] -= n
        self.held += 1
        return Binding(
            tuple(slots), cpu_ids, tuple(gpus), need.mem, need.custom, self.bind_cpus, tuple(held)
        )

    def stand_in(self) -> Binding:
        """What a default request holds before its CPU is chosen (launched ahead): its
        environment names its CPU count, and the gate's line its CPU (launcher.py)."""
        return Binding((-1,), (), (), 0, (), False, ())

    def _cpu_ids(self, slots: list[int]) -> tuple[int, ...]:
        ids = self.inventory.cpu_ids
        if not ids:
            return tuple(slots)
        # oversubscribed (--cpus above the mask): slots share the CPUs there are
        return tuple(sorted({ids[s % len(ids)] for s in slots}))

    def attach(self, b: Binding, pid: int) -> None:
        """The attempt's process (its group's leader, still behind the gate) holds `b`:
        pinned to its CPUs, and named in the ledger as the holder of its devices."""
        if b.pinned:
            try:
                os.sched_setaffinity(pid, b.cpu_ids)
            except OSError:
                pass  # it exited already: the reap says why
        if b.ledger:
            self.ledger.attach(b.ledger, pid)

    def give(self, b: Binding) -> None:
        self._free_cpus.extend(b.slots)
        self._free_cpus.sort()
        order = {g: i for i, g in enumerate(self.inventory.gpus)}
        self._free_gpus = sorted([*self._free_gpus, *b.gpus], key=lambda g: order.get(g, 0))
        self.mem_free += b.mem
        for k, n in b.custom:
            self._custom_free[k] += n
        self.held -= 1
        if b.ledger:
            self.ledger.release(b.ledger)

    def in_use(self) -> Offer:
        """What attempts hold now, in the inventory's terms (for the heartbeat)."""
        inv = self.inventory
        free = set(self._free_gpus)
        return Offer(
            inv.cpus - len(self._free_cpus),
            tuple(g for g in inv.gpus if g not in free),
            inv.mem - self.mem_free,
            tuple((k, v - self._custom_free.get(k, 0)) for k, v in inv.custom),
        )
