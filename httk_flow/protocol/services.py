"""Service classes: a job's pool, required capabilities and resource request, named once
per distinct combination.

The class id travels in the marker name, so a manager skips jobs it cannot serve, packs
the ones it can into what it has free, and `flow status` reports the rest as blocked,
without opening a job file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol import layout
from httk_flow.protocol.fsio import atomic_write, fs
from httk_flow.protocol.names import to36
from httk_flow.protocol.resources import DEFAULT_REQUEST, Request
from httk_flow.protocol.workspace import Workspace

DEFAULT_POOL = "default"


@dataclass(frozen=True)
class ServiceClass:
    pool: str | None = None
    requires: tuple[str, ...] = ()
    need: Request = DEFAULT_REQUEST

    @property
    def id(self) -> str:
        if self.pool is None and not self.requires and self.need.is_default:
            return ""
        # a default request adds nothing: classes named before requests existed keep ids
        parts: list[object] = [self.pool, sorted(set(self.requires))]
        if not self.need.is_default:
            parts.append(self.need.to_json())
        canon = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
        return to36(int.from_bytes(hashlib.sha256(canon).digest()[:8], "big"))[:12]

    def describe(self) -> str:
        parts = [f"pool `{self.pool or DEFAULT_POOL}`"]
        if self.requires:
            parts.append("capabilities " + ", ".join(f"`{c}`" for c in sorted(self.requires)))
        if not self.need.is_default:
            parts.append(self.need.describe())
        return " with ".join(parts)

    def served_by(self, pools: tuple[str, ...], capabilities: tuple[str, ...]) -> bool:
        """Whether a manager offering `pools` and `capabilities` serves this class: the one
        rule of who serves a job (the claim pass uses it). A job without a pool is in the
        default pool, and a manager with no --pool serves the default pool only."""
        offered = pools or (DEFAULT_POOL,)
        return (self.pool or DEFAULT_POOL) in offered and set(self.requires) <= set(capabilities)


DEFAULT_CLASS = ServiceClass()


class ServiceRegistry:
    """.flow/classes/<id>.json, written once per class, cached per process."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.dir = layout.classes_dir(ws.root)
        self._cache: dict[str, ServiceClass] = {"": DEFAULT_CLASS}

    def publish(self, sc: ServiceClass) -> str:
        cid = sc.id
        if cid in self._cache:
            return cid
        path = layout.class_file(self.ws.root, cid)
        if not fs.exists(path):
            self.ws.ensure_dir(self.dir)
            doc: dict[str, object] = {"pool": sc.pool, "requires": sorted(set(sc.requires))}
            if not sc.need.is_default:
                doc["resources"] = sc.need.to_json()
            data = orjson.dumps(doc)
            atomic_write(path, data, durable=self.ws.policy.durable)
        self._cache[cid] = sc
        return cid

    def get(self, cid: str) -> ServiceClass | None:
        """The class of an id, or None when its file is missing or damaged."""
        sc = self._cache.get(cid)
        if sc is not None:
            return sc
        path = layout.class_file(self.ws.root, cid)
        try:
            d = orjson.loads(fs.read_bytes(path, 65536))
            pool = d.get("pool")
            req = d.get("requires", [])
            if (pool is not None and not isinstance(pool, str)) or not isinstance(req, list):
                return None
            need = Request.from_json(d.get("resources"), path)
            sc = ServiceClass(pool, tuple(str(r) for r in req), need)
        except (OSError, FlowError, orjson.JSONDecodeError, AttributeError):
            return None
        if sc.id != cid:
            return None
        self._cache[cid] = sc
        return sc
