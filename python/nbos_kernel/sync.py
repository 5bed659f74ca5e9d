"""Namespace state sync between the replicas of one kernel.

After a cell, the executing replica's daemon calls :func:`export_cell` (a silent
execute); it writes what the cell changed into a directory: ``manifest.json`` plus the
payloads, all in one pack file (``payloads.pack``), each entry naming its ``offset``
in it: a cell that sets 20,000 small values creates two files, not 20,001 (creating a
file costs about as much as pickling a thousand small values). Followers' daemons
rebuild such a directory from the kernel's Raft group and call :func:`apply_cell`.
:func:`namespace_digest` lets tests (and operators) check that replicas hold equal
state. See docs/state-sync.md for the rules.

Manifest (version 1)::

    {"version": 1, "execution_count": 7,
     "set": [{"name": "xs", "kind": "pickle", "file": "payloads.pack", "offset": 0, "size": 25, "sha256": "…"},
             {"name": "np", "kind": "module", "file": "payloads.pack", "offset": 25, "size": 5, "sha256": "…"}],
     "deleted": ["old"],
     "unpicklable": [{"name": "lock", "error": "TypeError: cannot pickle '_thread.lock' object"}]}

A ``pickle`` payload is cloudpickle (protocol 5, buffers in band) of the value; a
``module`` payload is the module's import name in UTF-8 (``import numpy as np`` →
``numpy``). ``size`` and ``sha256`` are of the payload: bytes ``offset`` to
``offset + size`` of ``file``, or the whole ``file`` when an entry has no ``offset``
(one file per payload, also accepted).

Every function returns a :class:`SyncResult` (a dict that also renders as
``application/json``), so the daemon reads it from ``user_expressions`` of a silent
execute and nothing is printed.

Payloads are unpickled: they must come only from the kernel's own replicas (the
daemon reads them from its authenticated Raft group and object store).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import sys
import types
from typing import Any, Dict, List, Optional

from .digest import Digester, Unpicklable
from .namespace import CellChanges, NamespaceTracker, is_user_name

__all__ = [
    "MANIFEST",
    "ManifestError",
    "SyncResult",
    "apply_cell",
    "export_cell",
    "mark_changed",
    "namespace_digest",
    "restore_export",
    "set_execution_count",
    "namespace_digests",
    "namespace_report",
]

MANIFEST = "manifest.json"
PACK = "payloads.pack"
VERSION = 1
# A manifest is small (names, sizes, hashes); anything larger is not one of ours.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
# Payloads are hashed in chunks of this size before they are unpickled.
_CHUNK = 1024 * 1024


class ManifestError(ValueError):
    """The directory does not hold a valid version-1 manifest."""


class SyncResult(dict):
    """A plain dict that IPython also renders as ``application/json``."""

    def _repr_json_(self) -> dict:
        return dict(self)


class _HashingFile:
    """Writes to a file while hashing and counting what was written."""

    def __init__(self, file):
        self._file = file
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        n = self._file.write(data)
        self.hash.update(data)
        self.size += memoryview(data).nbytes
        return n


def _context(namespace: Optional[dict], tracker: Optional[NamespaceTracker]):
    """The namespace, tracker and IPython shell to work on."""
    shell = None
    if namespace is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise RuntimeError("nbos_kernel.sync needs a running IPython kernel, or an explicit namespace")
        namespace = shell.user_ns
    if tracker is None:
        tracker = namespace.get("_nbos_tracker")
        if not isinstance(tracker, NamespaceTracker):
            # The extension was not loaded: every user name is new to us.
            tracker = NamespaceTracker(namespace, baseline=False)
            namespace["_nbos_tracker"] = tracker
            if shell is not None:
                shell.user_ns_hidden["_nbos_tracker"] = tracker
    return namespace, tracker, shell


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


def _module_name(module: types.ModuleType) -> str:
    name = module.__name__
    if sys.modules.get(name) is not module:
        raise TypeError(f"module {name!r} was not imported by name, so it cannot be re-imported")
    return name


def export_cell(
    dir: str,
    *,
    namespace: Optional[dict] = None,
    tracker: Optional[NamespaceTracker] = None,
    execution_count: Optional[int] = None,
) -> SyncResult:
    """Writes what changed since the last export (or apply) into ``dir``.

    Names the tracker saw created, rebound or mutated go to ``set`` with a payload
    each; removed names to ``deleted``; values that do not pickle to ``unpicklable``
    with the error (they are not sent; a follower drops its older value of that name).
    ``dir`` is created if missing and must not already hold a manifest. On an error
    that stops the export (disk full), the changes stay pending for the next export.

    Returns ``{"dir", "execution_count", "set": [names], "deleted": [names],
    "unpicklable": [{"name", "error"}], "bytes", "warning"}``; ``warning`` is a line
    naming the unpicklable values for the cell's stderr, or null.
    """
    namespace, tracker, shell = _context(namespace, tracker)
    if execution_count is None:
        execution_count = shell.execution_count - 1 if shell is not None else 0
    os.makedirs(dir, exist_ok=True)
    if os.path.exists(os.path.join(dir, MANIFEST)):
        raise FileExistsError(f"{os.path.join(dir, MANIFEST)} already exists: export into an empty directory")
    changes = tracker.drain()
    try:
        entries, unpicklable, total = _write_payloads(dir, namespace, changes)
        deleted = sorted(n for n in changes.deleted if n not in namespace)
        manifest = {
            "version": VERSION,
            "execution_count": int(execution_count),
            "set": entries,
            "deleted": deleted,
            "unpicklable": unpicklable,
        }
        tmp = os.path.join(dir, MANIFEST + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f)
        os.replace(tmp, os.path.join(dir, MANIFEST))
    except BaseException:
        tracker.restore(changes)
        raise
    warning = None
    if unpicklable:
        names = ", ".join(f"{u['name']} ({u['error']})" for u in unpicklable)
        warning = f"NotebookOS: not synchronised to the other replicas (cannot be pickled): {names}"
    return SyncResult(
        dir=dir,
        execution_count=int(execution_count),
        set=[e["name"] for e in entries],
        deleted=deleted,
        unpicklable=unpicklable,
        bytes=total,
        warning=warning,
    )


def _write_payloads(dir: str, namespace: dict, changes: CellChanges):
    from . import payload  # cloudpickle is imported only when state is synchronised

    entries: List[Dict[str, Any]] = []
    unpicklable: List[Dict[str, str]] = []
    total = 0
    with open(os.path.join(dir, PACK), "wb") as pack:
        for name in sorted(changes.changed):
            if name not in namespace:
                continue
            value = namespace[name]
            is_module = isinstance(value, types.ModuleType)
            offset = pack.tell()
            sink = _HashingFile(pack)
            try:
                if is_module:
                    sink.write(_module_name(value).encode("utf-8"))
                else:
                    payload.dump(value, sink, namespace)
            except OSError:
                raise
            except Exception as exc:  # noqa: BLE001 - any value may fail to pickle; it is named, not fatal
                # Whatever it wrote goes: the next payload starts where this one did.
                pack.seek(offset)
                pack.truncate()
                unpicklable.append({"name": name, "error": _error_text(exc)})
                continue
            entries.append(
                {
                    "name": name,
                    "kind": "module" if is_module else "pickle",
                    "file": PACK,
                    "offset": offset,
                    "size": sink.size,
                    "sha256": sink.hash.hexdigest(),
                }
            )
            total += sink.size
    return entries, unpicklable, total


def _read_manifest(dir: str) -> dict:
    path = os.path.join(dir, MANIFEST)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("version") != VERSION:
        raise ManifestError(f"{path}: expected an object with \"version\": {VERSION}")
    count = manifest.get("execution_count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ManifestError(f"{path}: \"execution_count\" must be a non-negative integer")
    sets = manifest.get("set", [])
    if not isinstance(sets, list):
        raise ManifestError(f"{path}: \"set\" must be a list")
    for entry in sets:
        if not isinstance(entry, dict):
            raise ManifestError(f"{path}: every \"set\" entry must be an object")
        _check_name(path, entry.get("name"))
        if entry.get("kind") not in ("pickle", "module"):
            raise ManifestError(f"{path}: {entry['name']}: \"kind\" must be \"pickle\" or \"module\"")
        file = entry.get("file")
        if not isinstance(file, str) or not file or "/" in file or file in (".", "..") or "\0" in file:
            raise ManifestError(f"{path}: {entry['name']}: \"file\" must be a plain file name in the directory")
        offset = entry.get("offset", 0)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ManifestError(f"{path}: {entry['name']}: \"offset\" must be a non-negative integer")
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{path}: {entry['name']}: \"size\" must be a non-negative integer")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64:
            raise ManifestError(f"{path}: {entry['name']}: \"sha256\" must be 64 hex digits")
    for key in ("deleted",):
        names = manifest.get(key, [])
        if not isinstance(names, list):
            raise ManifestError(f"{path}: \"{key}\" must be a list of names")
        for name in names:
            _check_name(path, name)
    unpicklable = manifest.get("unpicklable", [])
    if not isinstance(unpicklable, list) or not all(isinstance(u, dict) for u in unpicklable):
        raise ManifestError(f"{path}: \"unpicklable\" must be a list of objects")
    for u in unpicklable:
        _check_name(path, u.get("name"))
    return manifest


def _check_name(path: str, name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier() or not is_user_name(name):
        raise ManifestError(f"{path}: {name!r} is not a user variable name")


class _Payloads:
    """Opens each payload file of a manifest directory once (a pack holds many payloads)."""

    def __init__(self, dir: str):
        self._dir = dir
        self._files: Dict[str, Any] = {}

    def __enter__(self) -> "_Payloads":
        return self

    def __exit__(self, *exc) -> None:
        for f in self._files.values():
            f.close()

    def _file(self, name: str):
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = open(os.path.join(self._dir, name), "rb")
        return f

    def open(self, entry: dict):
        """The payload of ``entry`` after checking its size and sha256: a file positioned
        at its start (a whole-file payload, streamed) or its bytes (a packed one)."""
        if "offset" in entry:
            f = self._file(entry["file"])
            f.seek(entry["offset"])
            data = f.read(entry["size"])
            if len(data) != entry["size"]:
                raise ValueError(
                    f"payload at {entry['offset']} of {entry['file']} has {len(data)} bytes, "
                    f"the manifest says {entry['size']}"
                )
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"].lower():
                raise ValueError(
                    f"payload at {entry['offset']} of {entry['file']} has sha256 {digest}, "
                    f"the manifest says {entry['sha256']}"
                )
            return io.BytesIO(data)
        return _open_payload(self._dir, entry)


def _open_payload(dir: str, entry: dict):
    """Opens a whole-file payload after checking its size and sha256 (streamed, not held twice)."""
    path = os.path.join(dir, entry["file"])
    f = open(path, "rb")
    try:
        h = hashlib.sha256()
        size = 0
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
        if size != entry["size"]:
            raise ValueError(f"payload {entry['file']} has {size} bytes, the manifest says {entry['size']}")
        if h.hexdigest() != entry["sha256"].lower():
            raise ValueError(f"payload {entry['file']} has sha256 {h.hexdigest()}, the manifest says {entry['sha256']}")
        f.seek(0)
        return f
    except BaseException:
        f.close()
        raise


def apply_cell(
    dir: str,
    execution_count: Optional[int] = None,
    *,
    namespace: Optional[dict] = None,
    tracker: Optional[NamespaceTracker] = None,
) -> SyncResult:
    """Applies a manifest directory to the user namespace.

    In manifest order: each ``set`` value is loaded (functions bound to this namespace,
    modules imported) and bound; then ``deleted`` and ``unpicklable`` names are unbound
    (an unpicklable value was rebound on the executor, so the older value here is
    stale). A value that fails here (bad checksum, a class or module this side lacks)
    is reported in ``failed`` and its name unbound, so this replica never computes with
    a stale value; the other names are still applied. The shell's execution counter is
    set so that its next cell is ``execution_count + 1`` (``execution_count`` overrides
    the manifest's). The tracker takes the applied values as known.

    Raises :class:`ManifestError` (nothing applied) when the manifest is missing or
    malformed. Returns ``{"execution_count", "set": [names], "deleted": [names],
    "failed": [{"name", "error"}]}``; ``deleted`` lists the names actually unbound.
    """
    from . import payload

    manifest = _read_manifest(dir)
    namespace, tracker, shell = _context(namespace, tracker)
    count = manifest["execution_count"] if execution_count is None else int(execution_count)
    applied: List[str] = []
    failed: List[Dict[str, str]] = []
    touched: List[str] = []
    with _Payloads(dir) as payloads:
        for entry in manifest.get("set", []):
            name = entry["name"]
            touched.append(name)
            try:
                with payloads.open(entry) as f:
                    if entry["kind"] == "module":
                        value = importlib.import_module(f.read().decode("utf-8"))
                    else:
                        value = payload.load(f, namespace)
            except Exception as exc:  # noqa: BLE001 - one bad value must not stop the others
                namespace.pop(name, None)
                failed.append({"name": name, "error": _error_text(exc)})
                continue
            namespace[name] = value
            applied.append(name)
    removed: List[str] = []
    for name in list(manifest.get("deleted", [])) + [u["name"] for u in manifest.get("unpicklable", [])]:
        touched.append(name)
        if name in namespace:
            del namespace[name]
            removed.append(name)
    tracker.rebaseline(touched)
    if shell is not None:
        shell.execution_count = count + 1
    return SyncResult(execution_count=count, set=applied, deleted=removed, failed=failed)


def set_execution_count(execution_count: int) -> int:
    """Sets the shell's counter so that its next cell is ``execution_count + 1``.

    A follower whose cells changed no names gets only this, when it is about to execute
    (the daemon does not run the kernel for a cell that carries nothing). Returns the
    count set.
    """
    count = int(execution_count)
    if count < 0:
        raise ValueError(f"execution_count must be non-negative, not {count}")
    _, _, shell = _context(None, None)
    if shell is not None:
        shell.execution_count = count + 1
    return count


def restore_export(
    dir: str, *, namespace: Optional[dict] = None, tracker: Optional[NamespaceTracker] = None
) -> SyncResult:
    """Puts the names of an export back into the pending changes: for the daemon when it
    could not commit that export (lost leadership, store down), so the next export carries
    them again instead of the followers never receiving them. Returns ``{"set",
    "deleted"}``: the names now pending again."""
    manifest = _read_manifest(dir)
    namespace, tracker, _ = _context(namespace, tracker)
    changed = {e["name"] for e in manifest.get("set", [])} | {u["name"] for u in manifest.get("unpicklable", [])}
    deleted = set(manifest.get("deleted", []))
    tracker.restore(CellChanges(changed=changed, deleted=deleted))
    pending = tracker.pending()
    return SyncResult(set=sorted(pending.changed), deleted=sorted(pending.deleted))


def mark_changed(*names: str) -> None:
    """Forces ``names`` into the next export (e.g. after a sparse write into an array
    too large to be hashed after every cell)."""
    _, tracker, _ = _context(None, None)
    tracker.mark_changed(names)


def namespace_digests(namespace: Optional[dict] = None) -> Dict[str, Optional[str]]:
    """Per user name, the hex content digest of its value, or None when it does not
    pickle (such values are not synchronised)."""
    if namespace is None:
        namespace, _, _ = _context(None, None)
    digester = Digester()
    out: Dict[str, Optional[str]] = {}
    for name in sorted(n for n in list(namespace) if is_user_name(n)):
        try:
            out[name] = digester.digest(namespace[name]).hex()
        except Unpicklable:
            out[name] = None
    return out


def namespace_digest(namespace: Optional[dict] = None) -> str:
    """A hex digest of the user namespace, equal on two processes with equal state.

    Covers every user name (sorted) whose value pickles, with the digest rules of
    ``nbos_kernel.digest``; values that do not pickle are left out, because sync does
    not carry them (they are named in the export's warning instead).
    """
    return namespace_report(namespace)["digest"]


def namespace_report(namespace: Optional[dict] = None) -> SyncResult:
    """:func:`namespace_digest` as JSON for the daemon (``user_expressions`` renders a
    bare string only as its repr): ``{"digest", "names": [user names digested],
    "left_out": [names whose values do not pickle]}``."""
    digests = namespace_digests(namespace)
    h = hashlib.sha256(b"nbos-namespace-v1")
    for name, digest in digests.items():
        if digest is not None:
            h.update(name.encode("utf-8") + b"=" + digest.encode("ascii") + b";")
    return SyncResult(
        digest=h.hexdigest(),
        names=[n for n, d in digests.items() if d is not None],
        left_out=[n for n, d in digests.items() if d is None],
    )
