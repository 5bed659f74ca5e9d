"""Content digests of Python values that are equal in two processes holding equal state.

The change tracker (``namespace.fingerprint``) and ``sync.namespace_digest`` both use
:class:`Digester`. The rules, value by value:

- ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``: their pickled
  bytes (so ``1``, ``1.0`` and ``True`` differ, and ``-0.0`` differs from ``0.0``).
- ``list``, ``tuple``, ``dict`` (exact types): in order, element by element; a container
  of only the scalars above is hashed through one ``pickle.dumps`` (C speed, no Python
  loop per element). ``set``/``frozenset``: the sorted digests of the elements, so the
  digest does not depend on the process's string-hash seed.
- modules: by name (state is "``np`` is ``numpy``", re-imported on the other side).
- numpy arrays (not of dtype ``object``): dtype, shape and the bytes of the C-ordered
  buffer, hashed straight from memory. ``bytearray``: its bytes.
- functions: by module and qualname when importable from a module other than
  ``__main__``; otherwise (defined in a cell) by module, qualname, the code (bytecode,
  constants, names, argument layout; not the file name or line numbers), defaults,
  keyword defaults, closure contents and ``__dict__``.
- classes defined in a cell (module ``__main__``): by module, qualname, bases and the digests of their own attributes
  (methods by the function rule; ``staticmethod``/``classmethod``/``property`` by
  their functions). Caches Python adds by itself (``__slotnames__``, ABC caches,
  ``__weakref__``/``__dict__``/slot descriptors) are left out. Other classes: by
  module and qualname when importable by that name, else by the pickle rule.
- instances of a class defined in a cell: the class digest, the digests of their
  attributes by name (``__dict__`` and slots together), and the content of a builtin
  base (``tuple`` of a NamedTuple, ``dict`` of a dict subclass, an exception's
  ``args``, an ndarray subclass's buffer; another C base by the pickle rule).
- everything else (the pickle rule): its stream from ``payload.NamespacePickler``
  (cloudpickle, protocol 5; functions of a ``__main__`` namespace without their
  globals), streamed into the hash, plus each out-of-band buffer hashed on its own. A
  value that does not pickle raises :class:`Unpicklable`.

Objects reached twice are digested by content each time, so a list shared by two names
digests like two equal copies (which is what sync produces on the other side). A
reference cycle is digested as a marker of how far up the stack it points.

``structural=False`` (the change tracker) digests every value but modules and
top-level buffers by the pickle rule, which is C speed and exact within one process.
With ``max_bytes`` set (the tracker), no buffer or pickle stream is hashed past that
many bytes: a larger mutable buffer (array, ``bytearray``, also an out-of-band buffer
inside a pickled value) is digested by its identity and a sample of evenly spaced
blocks; a larger immutable ``bytes``/``str`` by identity and length; any other value
whose pickle grows past the limit by its identity. Such digests are only meaningful
inside one process, and :attr:`Digester.identity_based` says one was taken.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
import types
from typing import Any, Dict, List, Optional

__all__ = ["Digester", "Unpicklable", "is_cell_class"]

_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
# Class attributes that Python or pickling add on their own, not part of the user's class.
_CLASS_NOISE = frozenset(
    {
        "__dict__",
        "__weakref__",
        "__slotnames__",
        "__module__",
        "__qualname__",
        "_abc_impl",
        "_abc_registry",
        "_abc_cache",
        "_abc_negative_cache",
        "_abc_negative_cache_version",
        "__firstlineno__",
        "__static_attributes__",
        "__annotate_func__",
    }
)
# Blocks taken from a buffer too large to hash in full (tracker only).
_SAMPLE_BLOCKS = 256
_SAMPLE_BLOCK_BYTES = 4096


class Unpicklable(Exception):
    """A value, or a part of it, cannot be pickled, so sync cannot carry it."""


class _TooLarge(Exception):
    pass


def _h(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.digest()


def _plain_pickle(value: Any) -> bytes:
    """Pickled bytes without the memo, so two equal strings written twice give the same
    bytes whether or not they are one object (interning differs between processes).
    Only for values without cycles (containers of scalars)."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=5)
    pickler.fast = True
    pickler.dump(value)
    return buf.getvalue()


def _resolves_to(obj: Any) -> bool:
    """True when ``obj`` is reachable as ``module.qualname`` from an importable module."""
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module_name or not qualname or module_name == "__main__" or "<locals>" in qualname:
        return False
    target: Any = sys.modules.get(module_name)
    if target is None:
        return False
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return False
    return target is obj


def is_cell_class(cls: type) -> bool:
    """True for a class defined in a cell (its module is ``__main__``, the user namespace).

    Other classes, importable or not (C types such as ``_thread.lock`` often are not
    reachable by name), are left to the pickle rule.
    """
    return isinstance(cls, type) and cls.__module__ == "__main__"


class _HashWriter:
    """A file-like sink for a pickler that hashes what it is given, up to a limit."""

    def __init__(self, limit: Optional[int]):
        self.hash = hashlib.sha256()
        self.size = 0
        self._limit = limit

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        self.size += n
        if self._limit is not None and self.size > self._limit:
            raise _TooLarge
        self.hash.update(data)
        return n


class Digester:
    """Computes :func:`digest` for many values, sharing work between them."""

    def __init__(self, max_bytes: Optional[int] = None, structural: bool = True):
        self.max_bytes = max_bytes
        self.structural = structural
        self.identity_based = False
        self._done: Dict[int, bytes] = {}
        self._keep: List[Any] = []  # keeps digested objects alive so their ids stay unique
        self._stack: Dict[int, int] = {}

    def digest(self, value: Any) -> bytes:
        """The 32-byte digest of ``value`` (rules in the module docstring)."""
        kind = type(value)
        if kind in _SCALARS:
            if self.max_bytes is not None and (kind is bytes or kind is str) and len(value) > self.max_bytes:
                # Immutable: the same object cannot change, so identity is exact here.
                self.identity_based = True
                return _h(b"large-immutable", f"{id(value):x}:{len(value)}".encode())
            return _h(b"s", pickle.dumps(value, protocol=5))
        key = id(value)
        done = self._done.get(key)
        if done is not None:
            return done
        depth = self._stack.get(key)
        if depth is not None:
            return _h(b"cycle", str(len(self._stack) - depth).encode())
        self._stack[key] = len(self._stack)
        try:
            result = self._digest(value, kind)
        except Unpicklable:
            raise
        except RecursionError:
            raise Unpicklable("RecursionError: nested too deeply to digest") from None
        except Exception as exc:  # noqa: BLE001 - an odd object (a proxy whose attributes raise) is not state we can carry
            raise Unpicklable(f"{type(exc).__name__}: {exc}") from None
        finally:
            del self._stack[key]
        self._done[key] = result
        self._keep.append(value)
        return result

    def _digest(self, value: Any, kind: type) -> bytes:
        if not self.structural:
            return self._within_process(value, kind)
        if kind is list or kind is tuple:
            tag = b"list" if kind is list else b"tuple"
            if set(map(type, value)) <= _SCALARS:
                return _h(tag, b"fast", _plain_pickle(value))
            return _h(tag, *map(self.digest, value))
        if kind is dict:
            if set(map(type, value)) <= _SCALARS and set(map(type, value.values())) <= _SCALARS:
                return _h(b"dict", b"fast", _plain_pickle(value))
            return _h(b"dict", *(self.digest(k) + self.digest(v) for k, v in value.items()))
        if kind is set or kind is frozenset:
            return _h(kind.__name__.encode(), *sorted(map(self.digest, value)))
        if isinstance(value, types.ModuleType):
            return _h(b"module", value.__name__.encode())
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray) and not value.dtype.hasobject:
            return self._array(value, numpy)
        if kind is bytearray:
            return self._buffer(b"bytearray", memoryview(value), id(value))
        if kind is types.FunctionType:
            return self._function(value)
        if isinstance(value, type):
            if is_cell_class(value):
                return self._class(value)
            if _resolves_to(value):
                return _h(b"classref", value.__module__.encode(), b":", value.__qualname__.encode())
            return self.pickled(value)
        if kind is staticmethod or kind is classmethod:
            return _h(kind.__name__.encode(), self.digest(value.__func__))
        if kind is property:
            return _h(b"property", *(self.digest(f) for f in (value.fget, value.fset, value.fdel, value.__doc__)))
        if is_cell_class(kind):
            return self._instance(value, kind)
        return self.pickled(value)

    def _within_process(self, value: Any, kind: type) -> bytes:
        # The change tracker: digests compared only inside this process, so the pickle
        # stream (C speed, one call for a list of a million tuples) is enough for every
        # value but modules and top-level buffers; equal content pickled with different
        # sharing or set order only costs a redundant export.
        if isinstance(value, types.ModuleType):
            return _h(b"module", value.__name__.encode())
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray) and not value.dtype.hasobject:
            return self._array(value, numpy)
        if kind is bytearray:
            return self._buffer(b"bytearray", memoryview(value), id(value))
        return self.pickled(value)

    def _array(self, value: Any, numpy: Any) -> bytes:
        header = f"{value.dtype.str}:{value.shape}".encode()
        data = numpy.ascontiguousarray(value)
        view = memoryview(data).cast("B") if data.nbytes else memoryview(b"")
        return self._buffer(b"ndarray" + header, view, id(value))

    def _buffer(self, tag: bytes, view: memoryview, identity: int) -> bytes:
        if self.max_bytes is not None and view.nbytes > self.max_bytes:
            return self._sample(tag, view, identity)
        return _h(tag, view)

    def _sample(self, tag: bytes, flat: memoryview, identity: int) -> bytes:
        # Too large to hash after every cell: identity plus evenly spaced blocks, which
        # sees whole-buffer updates (`a += 1`, `a[:] = 0`) but may miss a sparse write.
        self.identity_based = True
        n = flat.nbytes
        step = max(1, n // _SAMPLE_BLOCKS)
        h = hashlib.sha256()
        h.update(tag + b"sample" + f"{identity:x}:{n}".encode())
        for start in range(0, n, step):
            h.update(flat[start : start + _SAMPLE_BLOCK_BYTES])
        h.update(flat[max(0, n - _SAMPLE_BLOCK_BYTES) :])
        return h.digest()

    def _code(self, code: types.CodeType) -> bytes:
        consts = [self._code(c) if isinstance(c, types.CodeType) else self.digest(c) for c in code.co_consts]
        layout = (
            code.co_name,
            getattr(code, "co_qualname", code.co_name),
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_flags,
            code.co_names,
            code.co_varnames,
            code.co_freevars,
            code.co_cellvars,
        )
        return _h(b"code", code.co_code, _plain_pickle(layout), *consts)

    def _function(self, fn: types.FunctionType) -> bytes:
        if _resolves_to(fn):
            return _h(b"fnref", fn.__module__.encode(), b":", fn.__qualname__.encode())
        closure = []
        for cell in fn.__closure__ or ():
            try:
                closure.append(self.digest(cell.cell_contents))
            except ValueError:  # an empty cell (a free variable not yet assigned)
                closure.append(b"empty")
        return _h(
            b"fn",
            str(fn.__module__).encode(),
            b":",
            fn.__qualname__.encode(),
            self._code(fn.__code__),
            self.digest(fn.__defaults__),
            self.digest(fn.__kwdefaults__),
            self.digest(fn.__dict__),
            *closure,
        )

    def _class(self, cls: type) -> bytes:
        attrs = []
        for name in sorted(cls.__dict__):
            attr = cls.__dict__[name]
            if name in _CLASS_NOISE or type(attr).__name__ in ("member_descriptor", "getset_descriptor"):
                continue
            attrs.append(name.encode() + b"=" + self.digest(attr))
        return _h(
            b"class",
            str(cls.__module__).encode(),
            b":",
            cls.__qualname__.encode(),
            type(cls).__qualname__.encode(),
            *(self.digest(b) for b in cls.__bases__),
            *attrs,
        )

    def _instance(self, value: Any, kind: type) -> bytes:
        # Attributes from slots and `__dict__` together, by name: cloudpickle rebuilds a
        # class with `__slots__` as a class with a `__dict__`, so where an attribute lives
        # differs between the executor and a follower, while its value does not.
        state: Dict[str, Any] = {}
        for klass in kind.__mro__:
            names = klass.__dict__.get("__slots__", ())
            for name in [names] if isinstance(names, str) else names:
                if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                    state[name] = getattr(value, name)
        state.update(getattr(value, "__dict__", {}))
        attrs = [name.encode() + b"=" + self.digest(state[name]) for name in sorted(state)]
        return _h(b"instance", self.digest(kind), self._builtin_part(value, kind), *attrs)

    def _builtin_part(self, value: Any, kind: type) -> bytes:
        """The part of an instance held by a builtin base (`class Row(tuple)`, `class Cfg(dict)`)."""
        base = next((b for b in kind.__mro__ if not is_cell_class(b)), object)
        if base is object:
            return b"object"
        if base in _SCALARS or base in (list, tuple, dict, set, frozenset, bytearray):
            return self.digest(base(value))
        numpy = sys.modules.get("numpy")
        if numpy is not None and issubclass(base, numpy.ndarray):
            return self.digest(value.view(numpy.ndarray))
        if issubclass(base, BaseException):
            return self.digest(value.args)
        # Another C base: what its pickling says (may depend on sharing, see the docstring).
        return self.pickled(value)

    def pickled(self, value: Any) -> bytes:
        """The pickle rule: the NamespacePickler stream, with each out-of-band buffer
        (protocol 5: contiguous numpy arrays, ``bytearray``, ``PickleBuffer``) hashed on
        its own under the buffer rule, so a large array inside a container is sampled
        rather than making the whole container identity-based."""
        from .payload import NamespacePickler

        sink = _HashWriter(self.max_bytes)
        buffers: List[bytes] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            view = buffer.raw()
            buffers.append(self._buffer(b"buffer", view, id(view.obj)))
            return False  # not written into the stream: hashed above

        try:
            NamespacePickler(sink, namespace=None, buffer_callback=out_of_band).dump(value)
        except _TooLarge:
            self.identity_based = True
            return _h(b"large", f"{type(value).__module__}.{type(value).__qualname__}:{id(value):x}".encode())
        except RecursionError as exc:
            raise Unpicklable(f"RecursionError: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - anything can fail to pickle; the caller names it
            raise Unpicklable(f"{type(exc).__name__}: {exc}") from None
        return _h(b"pickle", sink.hash.digest(), *buffers)
