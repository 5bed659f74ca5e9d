"""Which user-namespace names did a cell create, rebind, mutate or delete?

A name counts as changed when it is new, bound to a different object, or bound to the
same object whose *content* changed (an in-place mutation such as ``xs.append(1)``).
Content is compared through a fingerprint: the sha256 of the value's pickle stream
(``digest.Digester(structural=False)``: the export's own pickler, each protocol-5 buffer
such as a numpy array hashed from memory on its own; modules by name). Fingerprints are
compared only inside this process, so equal content pickled differently costs a
redundant export, never a missed one. Two caveats, documented in docs/state-sync.md:

- a value that cannot be pickled is fingerprinted by its type and identity, so it is
  only seen as changed when rebound (the exporter names it in a warning);
- no buffer or pickle stream is hashed past ``MAX_FINGERPRINT_BYTES``: a larger array
  or ``bytearray`` is fingerprinted by identity plus evenly spaced sample blocks (a
  whole-array update is seen, a sparse in-place write may not be), a larger
  ``bytes``/``str`` by identity (exact: they are immutable), any other value whose
  pickle is larger by identity. ``mark_changed`` forces a name into the next export.

Names that Python, IPython and this helper own are not user state: dunder names
(``__name__``, ``__builtins__``), IPython's output and input history (``_``, ``__``,
``___``, ``_3``, ``_i``, ``_ii``, ``_iii``, ``_i3``, ``_ih``, ``_oh``, ``_dh``, ``In``,
``Out``), ``_exit_code``, ``exit``, ``quit``, ``get_ipython`` and ``_nbos_*``. Other names
starting with an underscore (``_tmp``) are the user's and are synchronised.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Set

from .digest import Digester, Unpicklable

# The most bytes of one value hashed after every cell (sha256 runs at about 1.7 GB/s
# on one core, so a value at the limit costs about 0.15 s per cell).
MAX_FINGERPRINT_BYTES = 256 * 1024 * 1024

_IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython", "_ih", "_oh", "_dh", "_exit_code"})
# `_`, `__`, `___`, `_i`, `_ii`, `_iii`, `_i12`, `_12`: IPython's history of inputs and outputs.
_IPYTHON_HISTORY = re.compile(r"_{1,3}|_i{1,3}|_i?[0-9]+")


def is_user_name(name: str) -> bool:
    """True for names that belong to the user, not to Python, IPython or this helper.

    Keys that are not identifiers (``globals()["a b"] = 1``, even non-strings) are not
    variables a cell can name, and are not user state."""
    if not isinstance(name, str) or not name.isidentifier():
        return False
    if name in _IPYTHON_NAMES or name.startswith("_nbos_"):
        return False
    if name.startswith("__") and name.endswith("__"):
        return False
    return _IPYTHON_HISTORY.fullmatch(name) is None


def fingerprint(value: Any) -> str:
    """A digest that changes when the value's content changes (within one process)."""
    if isinstance(value, types.ModuleType):
        # A module is state by name: re-importing it gives the same module.
        return "module:" + value.__name__
    digester = Digester(max_bytes=MAX_FINGERPRINT_BYTES, structural=False)
    try:
        digest = digester.digest(value)
    except Unpicklable:
        return f"unpicklable:{type(value).__module__}.{type(value).__qualname__}:{id(value):x}"
    return ("large:" if digester.identity_based else "sha256:") + digest.hex()


@dataclass
class CellChanges:
    """What one cell did to the user namespace."""

    changed: Set[str] = field(default_factory=set)
    deleted: Set[str] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not self.changed and not self.deleted


class NamespaceTracker:
    """Remembers fingerprints of the user namespace between cells.

    ``end_cell`` (run after every cell) compares the namespace with the previous cell's
    end and adds what changed to the changes *pending* for the next export; ``drain``
    hands those out (the exporter); ``rebaseline`` records names a follower applied, so
    they are not seen as changed by this replica.

    ``baseline=False`` starts from an empty baseline: every user name present counts as
    new at the first ``end_cell`` (used when the helper was not loaded at kernel start).

    ``hooked`` (set by the IPython extension, which calls ``cell_started`` before and
    ``end_cell`` after every cell) lets ``drain`` skip hashing the namespace again when
    no cell ran since the last ``end_cell``; without hooks ``drain`` always compares.
    """

    def __init__(self, namespace: Mapping[str, Any], *, baseline: bool = True):
        self._ns = namespace
        self._prints: Dict[str, str] = self._take() if baseline else {}
        self.last: CellChanges = CellChanges()
        self._pending: CellChanges = CellChanges()
        self.hooked = False
        self._fresh = False

    def cell_started(self) -> None:
        """A cell is about to run: the fingerprints are stale until its ``end_cell``."""
        self._fresh = False

    def _take(self) -> Dict[str, str]:
        return {k: fingerprint(v) for k, v in list(self._ns.items()) if is_user_name(k)}

    def end_cell(self) -> CellChanges:
        """Compares the namespace with the end of the previous cell and remembers it."""
        now = self._take()
        changed = {k for k, fp in now.items() if self._prints.get(k) != fp}
        deleted = set(self._prints) - set(now)
        self._prints = now
        self.last = CellChanges(changed=changed, deleted=deleted)
        self._add_pending(changed, deleted)
        self._fresh = True
        return self.last

    def _add_pending(self, changed: Set[str], deleted: Set[str]) -> None:
        self._pending.changed = (self._pending.changed - deleted) | changed
        self._pending.deleted = (self._pending.deleted - changed) | deleted

    def pending(self) -> CellChanges:
        """The changes not yet exported (a copy)."""
        return CellChanges(changed=set(self._pending.changed), deleted=set(self._pending.deleted))

    def drain(self) -> CellChanges:
        """Takes the changes since the last drain, including any since the last cell."""
        if not (self.hooked and self._fresh):
            self.end_cell()
        out, self._pending = self._pending, CellChanges()
        return out

    def restore(self, changes: CellChanges) -> None:
        """Puts drained changes back (an export that failed part way loses nothing)."""
        later = self._pending
        self._pending = CellChanges(changed=set(changes.changed), deleted=set(changes.deleted))
        self._add_pending(later.changed, later.deleted)

    def mark_changed(self, names: Iterable[str]) -> None:
        """Forces names into the next export (e.g. after a sparse write to a huge array)."""
        names = {n for n in names if is_user_name(n) and n in self._ns}
        self._add_pending(names, set())

    def rebaseline(self, names: Iterable[str]) -> None:
        """Takes the current values of ``names`` as known (applied from another replica)."""
        for name in names:
            if not is_user_name(name):
                continue
            self._pending.changed.discard(name)
            self._pending.deleted.discard(name)
            if name in self._ns:
                self._prints[name] = fingerprint(self._ns[name])
            else:
                self._prints.pop(name, None)
