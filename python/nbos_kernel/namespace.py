"""Which user-namespace names did a cell create, rebind, mutate or delete?

A name counts as changed when it is new, bound to a different object, or bound to the
same object whose *content* changed (an in-place mutation such as ``xs.append(1)``).
Content is compared through a fingerprint: a digest of the object's pickled bytes
when it pickles, else of its type and identity (so an unpicklable object is only seen
as changed when rebound — the exporter names such objects in a warning).

Names that IPython and this helper own (``_``, ``__``, ``In``, ``Out``, ``_i3``,
``exit``, ``quit``, ``get_ipython``, anything starting with ``_``) are not user state.
"""

from __future__ import annotations

import hashlib
import pickle
import types
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Set

# Fingerprinting pickles the object; past this size we hash the type, the identity and
# the buffer length only, so the post-cell hook never stalls on a multi-GiB tensor.
MAX_FINGERPRINT_BYTES = 64 * 1024 * 1024

_IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def is_user_name(name: str) -> bool:
    """True for names that belong to the user, not to IPython or this helper."""
    return not name.startswith("_") and name not in _IPYTHON_NAMES


def fingerprint(value: Any) -> str:
    """A digest that changes when the value's content changes."""
    if isinstance(value, types.ModuleType):
        # A module is state by name: re-importing it gives the same module.
        return "module:" + value.__name__
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - anything may fail to pickle, and then identity is all we have
        return f"unpicklable:{type(value).__module__}.{type(value).__qualname__}:{id(value):x}"
    if len(data) > MAX_FINGERPRINT_BYTES:
        return f"large:{type(value).__qualname__}:{id(value):x}:{len(data)}"
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class CellChanges:
    """What one cell did to the user namespace."""

    changed: Set[str] = field(default_factory=set)
    deleted: Set[str] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not self.changed and not self.deleted


class NamespaceTracker:
    """Remembers fingerprints of the user namespace between cells."""

    def __init__(self, namespace: Mapping[str, Any]):
        self._ns = namespace
        self._prints: Dict[str, str] = self._take()
        self.last: CellChanges = CellChanges()

    def _take(self) -> Dict[str, str]:
        return {k: fingerprint(v) for k, v in list(self._ns.items()) if is_user_name(k)}

    def end_cell(self) -> CellChanges:
        """Compares the namespace with the end of the previous cell and remembers it."""
        now = self._take()
        changed = {k for k, fp in now.items() if self._prints.get(k) != fp}
        deleted = set(self._prints) - set(now)
        self._prints = now
        self.last = CellChanges(changed=changed, deleted=deleted)
        return self.last
