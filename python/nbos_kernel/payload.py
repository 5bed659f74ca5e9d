"""Pickling user values so that, on the other replica, they live in ITS namespace.

cloudpickle carries a function defined in a cell by value, together with a private copy
of the globals it reads, so ``f`` applied on a follower would keep seeing the ``xs``
of the moment it was pickled. :class:`NamespacePickler` instead pickles a function whose
globals are the user namespace (or any ``__main__`` namespace) with its code, defaults,
closure and attributes but *no* globals; :func:`load` rebuilds it with the receiving
namespace as its globals, so it looks names up live there, exactly as on the executor.
This applies wherever such a function is reached: a top-level function, a method of a
class defined in a cell, a lambda inside a list.

Classes defined in a cell travel by value (cloudpickle); cloudpickle gives each such
class a tracking id, and one process maps one id to one class object, so an instance
applied in a later cell is an instance of the class applied earlier (``isinstance``
holds on every replica).
"""

from __future__ import annotations

import copyreg
import pickle
import types
from typing import Any, BinaryIO, Mapping, Optional

import cloudpickle

__all__ = ["NamespacePickler", "dump", "load", "PROTOCOL"]

PROTOCOL = 5

# The namespace functions are rebuilt into while `load` runs (one load at a time: the
# kernel applies cells on its shell thread).
_target: Optional[dict] = None


def _main_namespace() -> dict:
    import __main__

    return __main__.__dict__


def _make_function(code: types.CodeType, name: str, ncells: int) -> types.FunctionType:
    namespace = _target if _target is not None else _main_namespace()
    closure = tuple(types.CellType() for _ in range(ncells)) if ncells else None
    return types.FunctionType(code, namespace, name, None, closure)


def _set_function_state(fn: types.FunctionType, state: dict) -> None:
    fn.__defaults__ = state["defaults"]
    fn.__kwdefaults__ = state["kwdefaults"]
    fn.__qualname__ = state["qualname"]
    fn.__module__ = state["module"]
    fn.__doc__ = state["doc"]
    fn.__annotations__ = state["annotations"]
    fn.__dict__.update(state["dict"])
    for index, value in state["closure"]:
        fn.__closure__[index].cell_contents = value
    return fn


class NamespacePickler(cloudpickle.Pickler):
    """A cloudpickle pickler (protocol 5) that sends namespace functions without globals.

    ``namespace``: the user namespace whose functions are rebound on load; ``None``
    means any function whose globals are a ``__main__`` namespace.
    """

    def __init__(self, file: Any, namespace: Optional[Mapping[str, Any]], buffer_callback=None):
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffer_callback)
        self._namespace = namespace

    def _is_namespace_function(self, obj: Any) -> bool:
        if type(obj) is not types.FunctionType:
            return False
        if self._namespace is not None:
            return obj.__globals__ is self._namespace
        return obj.__globals__.get("__name__") == "__main__"

    def reducer_override(self, obj: Any) -> Any:
        if self._is_namespace_function(obj):
            closure = []
            for index, cell in enumerate(obj.__closure__ or ()):
                try:
                    closure.append((index, cell.cell_contents))
                except ValueError:  # empty cell: stays empty
                    pass
            state = {
                "defaults": obj.__defaults__,
                "kwdefaults": obj.__kwdefaults__,
                "qualname": obj.__qualname__,
                "module": obj.__module__,
                "doc": obj.__doc__,
                "annotations": obj.__annotations__,
                "dict": obj.__dict__,
                "closure": closure,
            }
            # The state (which may refer back to the function) is pickled after the
            # function object is memoised, so recursion through defaults or closures works.
            ncells = len(obj.__code__.co_freevars)
            return (_make_function, (obj.__code__, obj.__name__, ncells), state, None, None, _set_function_state)
        if isinstance(obj, type) and obj.__module__ == "__main__" and "__slotnames__" not in obj.__dict__:
            # Pickling an instance caches `__slotnames__` in its class; cloudpickle sends the
            # class dict, so without this the class's pickle (and the fingerprint of every
            # value holding it) would change once, after the first pickle, for no edit.
            try:
                copyreg._slotnames(obj)
            except Exception:  # noqa: BLE001 - only a cache; cloudpickle reports real failures
                pass
        return super().reducer_override(obj)


def dump(value: Any, file: BinaryIO, namespace: Optional[Mapping[str, Any]]) -> None:
    """Pickles ``value`` into ``file`` (cloudpickle, protocol 5, buffers in band)."""
    NamespacePickler(file, namespace).dump(value)


def load(file: BinaryIO, namespace: dict) -> Any:
    """Unpickles one value, rebuilding namespace functions with ``namespace`` as globals."""
    return _with_target(namespace, lambda: pickle.load(file))


def _with_target(namespace: dict, run):
    global _target
    previous = _target
    _target = namespace
    try:
        return run()
    finally:
        _target = previous
