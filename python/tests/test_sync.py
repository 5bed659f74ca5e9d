"""State sync: export on one namespace, apply on another, compare digests.

The first half works on plain dicts (the way `exec` runs a cell into a namespace); the
last test drives two real ipykernel processes with the helper loaded as the daemon
loads it, and goes through `user_expressions` of silent executes as the daemon does.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from nbos_kernel import NamespaceTracker, namespace as namespace_mod, sync
from nbos_kernel.digest import Digester, Unpicklable

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Replica:
    """A namespace plus its tracker, run cell by cell like the kernel does.

    Two Replicas in one process share cloudpickle's class registry (one class object per
    class per process), so tests of classes applied on a follower use another process
    (`_follower_process`, or the ipykernel test)."""

    def __init__(self):
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__}
        self.tracker = NamespaceTracker(self.ns)
        self.count = 0

    def run(self, code):
        exec(textwrap.dedent(code), self.ns)
        self.count += 1
        self.tracker.end_cell()

    def export(self, path):
        return sync.export_cell(str(path), namespace=self.ns, tracker=self.tracker, execution_count=self.count)

    def apply(self, path):
        return sync.apply_cell(str(path), namespace=self.ns, tracker=self.tracker)

    def digest(self):
        return sync.namespace_digest(self.ns)


CELL_1 = """
    import threading
    import json as j
    import numpy as np
    n = 1
    s = "text"
    xs = [1, 2]
    d = {"k": [1, 2.5], "tags": {"a", "b"}}
    arr = np.arange(10 * 1024 * 1024 // 8, dtype=np.float64)
    def f(k):
        return len(xs) + k
    class Point:
        dims = 1
        def __init__(self, x):
            self.x = x
        def norm(self):
            return abs(self.x) + n
    p = Point(3)
    lock = threading.Lock()
"""

# CELL_1 without its class: in-process followers share classes with the executor.
CELL_PLAIN = CELL_1.replace(
    """    class Point:
        dims = 1
        def __init__(self, x):
            self.x = x
        def norm(self):
            return abs(self.x) + n
    p = Point(3)
""",
    """    import types
    p = types.SimpleNamespace(x=3)
""",
)


def test_a_cell_round_trips_into_another_namespace(tmp_path):
    a, b = Replica(), Replica()
    a.run(CELL_PLAIN)
    out = a.export(tmp_path / "1")
    assert out["set"] == ["arr", "d", "f", "j", "n", "np", "p", "s", "threading", "types", "xs"]
    assert [u["name"] for u in out["unpicklable"]] == ["lock"]
    assert "lock" in out["warning"] and "pickle" in out["warning"]
    manifest = json.loads((tmp_path / "1" / "manifest.json").read_text())
    assert manifest["version"] == 1 and manifest["execution_count"] == 1
    kinds = {e["name"]: e["kind"] for e in manifest["set"]}
    assert kinds["np"] == "module" and kinds["j"] == "module" and kinds["arr"] == "pickle"
    np_entry = next(e for e in manifest["set"] if e["name"] == "np")
    pack = (tmp_path / "1" / np_entry["file"]).read_bytes()
    assert pack[np_entry["offset"] : np_entry["offset"] + np_entry["size"]] == b"numpy"
    # Every payload is in the one pack file, back to back (the unpicklable lock left nothing).
    assert {e["file"] for e in manifest["set"]} == {"payloads.pack"}
    assert sum(e["size"] for e in manifest["set"]) == len(pack)
    assert sorted(p.name for p in (tmp_path / "1").iterdir()) == ["manifest.json", "payloads.pack"]

    got = b.apply(tmp_path / "1")
    assert got["failed"] == [] and got["execution_count"] == 1
    assert b.digest() == a.digest()
    assert "lock" not in b.ns
    # Functions and methods read the globals of the namespace they were applied to, live.
    assert b.ns["f"](0) == 2
    b.ns["xs"].append(9)
    assert b.ns["f"](0) == 3 and a.ns["f"](0) == 2
    assert b.ns["p"].x == 3
    assert b.ns["np"] is np and b.ns["d"]["tags"] == {"a", "b"}
    assert np.array_equal(b.ns["arr"], a.ns["arr"])
    # What was applied is not exported again by the follower.
    assert b.tracker.end_cell().is_empty() is False  # the xs.append(9) above
    assert b.export(tmp_path / "b1")["set"] == ["xs"]


def test_the_next_export_holds_only_what_the_cell_changed(tmp_path):
    a, b = Replica(), Replica()
    a.run(CELL_PLAIN)
    a.export(tmp_path / "1")
    b.apply(tmp_path / "1")
    a.run("""
        xs.append(3)
        arr[12345] = -1.0
        p.x = 10
        del s
    """)
    out = a.export(tmp_path / "2")
    assert out["set"] == ["arr", "p", "xs"]
    assert out["deleted"] == ["s"]
    assert out["unpicklable"] == []
    got = b.apply(tmp_path / "2")
    assert got["set"] == ["arr", "p", "xs"] and got["deleted"] == ["s"]
    assert b.digest() == a.digest()
    assert b.ns["p"].x == 10
    assert b.ns["arr"][12345] == -1.0
    # Nothing changed since: an empty export.
    assert a.export(tmp_path / "3")["set"] == []


def test_changes_of_several_cells_accumulate_until_the_export(tmp_path):
    a = Replica()
    a.run("x = 1\ny = 2\nz = 3\n_i9 = 'ipython input history'")
    a.run("x = 10\ndel y\n_tmp = 'user'")
    a.run("z += 1\nw = 'w'")
    a.run("del w")  # created and deleted between two exports
    out = a.export(tmp_path / "1")
    assert out["set"] == ["_tmp", "x", "z"]
    assert out["deleted"] == ["w", "y"]


def test_the_digest_changes_with_content_not_with_identity():
    def digest(v):
        return Digester().digest(v)

    assert digest([1, 2, {"a": (1, 2.0)}]) == digest([1, 2, {"a": (1, 2.0)}])
    assert digest([1, 2]) != digest([1, 2.0]) != digest((1, 2))
    assert digest({"s", "t"}) == digest({"t", "s"})
    ns1, ns2 = {"__name__": "__main__"}, {"__name__": "__main__"}
    exec("def g(a, b=1):\n    return a + b + k", ns1)
    exec("def g(a, b=1):\n    return a + b + k", ns2)
    assert digest(ns1["g"]) == digest(ns2["g"])
    exec("def g(a, b=1):\n    return a + b + j", ns2)  # other global name
    assert digest(ns1["g"]) != digest(ns2["g"])
    exec("def g(a, b=2):\n    return a + b + k", ns2)  # other default
    assert digest(ns1["g"]) != digest(ns2["g"])
    a = np.zeros(100)
    before = digest(a)
    a[50] = 1
    assert Digester().digest(a) != before
    assert digest(a.reshape(10, 10)) != digest(a)
    with pytest.raises(Unpicklable):
        Digester().digest(threading.Lock())
    cyclic = [1]
    cyclic.append(cyclic)
    assert digest(cyclic) == digest(cyclic)


def test_the_digest_does_not_depend_on_the_hash_seed():
    # Sets iterate in an order that depends on PYTHONHASHSEED; the digest must not.
    script = (
        "from nbos_kernel import sync\n"
        "ns = {'tags': {'alpha', 'beta', 'gamma', 'delta'}, 'd': {'k': frozenset({'x', 'y', 'z'})}}\n"
        "print(sync.namespace_digest(ns))\n"
    )
    digests = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=PYTHON_DIR)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_a_10_mib_array_mutated_in_place_is_detected():
    ns = {"arr": np.zeros(10 * 1024 * 1024 // 8)}
    t = NamespaceTracker(ns)
    ns["arr"][-1] = 1.0  # one element at the very end
    assert t.end_cell().changed == {"arr"}
    assert namespace_mod.fingerprint(ns["arr"]).startswith("sha256:")


def test_values_past_the_fingerprint_limit_are_sampled_or_identity_based(monkeypatch, tmp_path):
    monkeypatch.setattr(namespace_mod, "MAX_FINGERPRINT_BYTES", 1024 * 1024)
    ns = {"__name__": "__main__", "big": np.zeros(4 * 1024 * 1024 // 8), "blob": b"x" * (2 * 1024 * 1024)}
    t = NamespaceTracker(ns)
    assert namespace_mod.fingerprint(ns["big"]).startswith("large:")
    ns["big"] += 1  # a whole-array update changes the sampled blocks
    assert t.end_cell().changed == {"big"}
    ns["big"][1500] = 7.0  # a sparse write between sampled blocks is not seen...
    assert t.end_cell().is_empty()
    t.mark_changed(["big"])  # ...unless the user marks the name
    out = sync.export_cell(str(tmp_path / "1"), namespace=ns, tracker=t)
    assert out["set"] == ["big"]
    ns["blob"] = b"y" * (2 * 1024 * 1024)  # bytes are immutable: rebinding is the only change
    assert t.end_cell().changed == {"blob"}
    ns["box"] = {"inner": np.zeros(4 * 1024 * 1024 // 8)}  # a large array inside a container
    t.end_cell()
    assert namespace_mod.fingerprint(ns["box"]).startswith("large:")
    ns["box"]["inner"] *= 2
    assert t.end_cell().is_empty()  # zeros doubled are zeros
    ns["box"]["inner"] += 1
    assert t.end_cell().changed == {"box"}


def test_a_payload_that_fails_on_apply_is_reported_and_the_others_applied(tmp_path):
    a, b = Replica(), Replica()
    a.run("x = [1, 2]\ny = 'why'\nz = 3")
    b.ns.update(x="stale x", y="stale y")
    out = a.export(tmp_path / "1")
    manifest = json.loads((tmp_path / "1" / "manifest.json").read_text())
    # x as a whole-file payload (the other accepted shape) whose size is wrong.
    x_entry = next(e for e in manifest["set"] if e["name"] == "x")
    del x_entry["offset"]
    x_entry["file"] = "x.pickle"
    (tmp_path / "1" / "x.pickle").write_bytes(b"corrupted")
    manifest["set"].append({"name": "m", "kind": "module", "file": "m.module", "size": 11, "sha256": ""})
    (tmp_path / "1" / "m.module").write_text("no_such_mod")
    import hashlib

    manifest["set"][-1]["sha256"] = hashlib.sha256(b"no_such_mod").hexdigest()
    (tmp_path / "1" / "manifest.json").write_text(json.dumps(manifest))
    got = b.apply(tmp_path / "1")
    assert out["set"] == ["x", "y", "z"]
    assert got["set"] == ["y", "z"]
    failed = {f["name"]: f["error"] for f in got["failed"]}
    assert set(failed) == {"x", "m"}
    assert "bytes" in failed["x"] and "ModuleNotFoundError" in failed["m"]
    assert "x" not in b.ns  # the stale value is not kept
    assert b.ns["y"] == "why" and b.ns["z"] == 3


def test_an_unpicklable_value_unbinds_the_stale_one_on_the_follower(tmp_path):
    a, b = Replica(), Replica()
    a.run("import threading\nres = 1")
    b.apply(a.export(tmp_path / "1")["dir"])
    assert b.ns["res"] == 1
    a.run("res = threading.Lock()")
    out = a.export(tmp_path / "2")
    assert out["set"] == [] and [u["name"] for u in out["unpicklable"]] == ["res"]
    assert b.apply(tmp_path / "2")["deleted"] == ["res"]
    assert "res" not in b.ns and b.digest() == a.digest()


@pytest.mark.parametrize(
    "manifest, message",
    [
        (None, "cannot read"),
        ("not json", "not JSON"),
        ({"version": 2, "execution_count": 1}, "version"),
        ({"version": 1, "execution_count": -1}, "execution_count"),
        ({"version": 1, "execution_count": 1, "set": [{"name": "a b"}]}, "not a user variable name"),
        ({"version": 1, "execution_count": 1, "set": [{"name": "_i3"}]}, "not a user variable name"),
        (
            {"version": 1, "execution_count": 1, "set": [{"name": "x", "kind": "pickle", "file": "../x", "size": 1, "sha256": "0" * 64}]},
            "plain file name",
        ),
        ({"version": 1, "execution_count": 1, "set": [{"name": "x", "kind": "exe"}]}, "kind"),
        ({"version": 1, "execution_count": 1, "deleted": "x"}, "deleted"),
    ],
)
def test_a_bad_manifest_is_a_clear_error_and_changes_nothing(tmp_path, manifest, message):
    b = Replica()
    b.run("x = 1")
    if manifest is not None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(sync.ManifestError, match=message):
        b.apply(tmp_path)
    assert b.ns["x"] == 1


def test_an_export_that_cannot_be_written_loses_no_change(tmp_path):
    a = Replica()
    a.run("x = 1\ny = 2")
    used = tmp_path / "used"
    used.mkdir()
    (used / "manifest.json").write_text("{}")
    with pytest.raises(FileExistsError):
        a.export(used)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        a.export(blocker / "sub")  # a path under a regular file
    assert a.export(tmp_path / "ok")["set"] == ["x", "y"]


def test_an_export_the_daemon_could_not_commit_is_restored_into_the_next(tmp_path):
    a = Replica()
    a.run("x = 1\ny = 2\nimport threading\nlock = threading.Lock()")
    first = a.export(tmp_path / "1")
    a.run("del y\nz = 3")
    assert sync.restore_export(first["dir"], namespace=a.ns, tracker=a.tracker) == {
        "set": ["lock", "threading", "x", "z"],
        "deleted": ["y"],
    }
    out = a.export(tmp_path / "2")
    assert out["set"] == ["threading", "x", "z"] and out["deleted"] == ["y"]
    assert [u["name"] for u in out["unpicklable"]] == ["lock"]


def test_shared_objects_are_copied_separately_and_recursive_functions_work(tmp_path):
    a, b = Replica(), Replica()
    a.run("""
        shared = [1]
        alias = shared
        def fact(k):
            return 1 if k <= 1 else k * fact(k - 1)
        def make():
            def inner(k):
                return 0 if k == 0 else inner(k - 1) + 1
            return inner
        counter = make()
        handlers = [lambda v: v + 1]
    """)
    b.apply(a.export(tmp_path / "1")["dir"])
    assert b.digest() == a.digest()
    assert b.ns["fact"](5) == 120 and b.ns["counter"](4) == 4 and b.ns["handlers"][0](1) == 2
    assert b.ns["shared"] == b.ns["alias"] and b.ns["shared"] is not b.ns["alias"]


def _kernel(env):
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(extra_arguments=["--IPKernelApp.extra_extensions=nbos_kernel"], env=env)
    return km


def _execute(kc, code, *, silent=False, user_expressions=None, timeout=60):
    """Runs code; returns (reply content, IOPub messages of this request)."""
    msg_id = kc.execute(code, silent=silent, store_history=not silent, user_expressions=user_expressions or {})
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    iopub = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        iopub.append(msg)
    return reply["content"], iopub


def _cell(kc, code):
    content, _ = _execute(kc, code)
    assert content["status"] == "ok", content
    return content["execution_count"]


def _internal(kc, expression):
    """What the daemon does: a silent execute, the result in user_expressions as JSON."""
    content, iopub = _execute(kc, "", silent=True, user_expressions={"r": expression})
    assert content["status"] == "ok", content
    result = content["user_expressions"]["r"]
    assert result["status"] == "ok", result
    # Nothing reaches the notebook: no stream, no display, no execute_input.
    assert [m["msg_type"] for m in iopub if m["msg_type"] != "status"] == []
    data = result["data"]
    # Sync results carry application/json; a plain value only its repr.
    return data["application/json"] if "application/json" in data else ast.literal_eval(data["text/plain"])


def test_two_ipykernels_converge_through_export_and_apply(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    kms = [_kernel(env), _kernel(env)]
    clients = []
    try:
        for km in kms:
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            clients.append(kc)
        a, b = clients
        _cell(a, textwrap.dedent(CELL_1))
        count = _cell(a, "xs.append(3)\nold = 1\ndel old\np.x = 7")
        assert count == 2
        first = str(tmp_path / "1")
        out = _internal(a, f"__import__('nbos_kernel').export_cell({first!r})")
        assert out["execution_count"] == 2
        assert [u["name"] for u in out["unpicklable"]] == ["lock"]
        assert "xs" in out["set"] and "arr" in out["set"]
        got = _internal(b, f"__import__('nbos_kernel').apply_cell({first!r})")
        assert got["failed"] == []
        digest = "__import__('nbos_kernel').namespace_digest()"
        assert _internal(a, digest) == _internal(b, digest)
        report = "__import__('nbos_kernel').namespace_report()"
        ra, rb = _internal(a, report), _internal(b, report)
        assert ra["digest"] == rb["digest"] == _internal(a, digest)
        assert ra["left_out"] == ["lock"] and rb["left_out"] == [] and ra["names"] == rb["names"]
        assert _internal(b, "[f(0), p.norm(), isinstance(p, Point), 'lock' in dir()]") == [3, 8, True, False]
        # The follower's next cell gets the number the executor's next cell would get.
        assert _internal(b, "get_ipython().execution_count") == _internal(a, "get_ipython().execution_count") == 3
        # A follower does not export what it applied.
        assert _internal(b, f"__import__('nbos_kernel').export_cell({str(tmp_path / 'b')!r})")["set"] == []

        assert _cell(a, "arr[0] = 42.0\ns = 'changed'\ndel d") == 3
        second = str(tmp_path / "2")
        out = _internal(a, f"__import__('nbos_kernel').export_cell({second!r})")
        assert out["set"] == ["arr", "s"] and out["deleted"] == ["d"] and out["unpicklable"] == []
        got = _internal(b, f"__import__('nbos_kernel').apply_cell({second!r})")
        assert got["set"] == ["arr", "s"] and got["deleted"] == ["d"]
        assert _internal(a, digest) == _internal(b, digest)
        assert _cell(b, "float(arr[0])") == 4
        # A name the user marks goes into the next export though its value is unchanged.
        assert _cell(a, "__import__('nbos_kernel').mark_changed('n')") == 4
        assert _internal(a, f"__import__('nbos_kernel').export_cell({str(tmp_path / '3')!r})")["set"] == ["n"]
        # A cell that changed no names reaches a follower as its count alone.
        assert _internal(b, "__import__('nbos_kernel').set_execution_count(9)") == 9
        assert _cell(b, "pass") == 10
        with pytest.raises(AssertionError, match="non-negative"):
            _internal(b, "__import__('nbos_kernel').set_execution_count(-1)")
    finally:
        for kc in clients:
            kc.stop_channels()
        for km in kms:
            km.shutdown_kernel(now=True)


FOLLOWER = """
import json, sys
from nbos_kernel import NamespaceTracker, sync
ns = {"__name__": "__main__", "__builtins__": __builtins__}
tracker = NamespaceTracker(ns)
steps = []
for d in sys.argv[2:]:
    r = sync.apply_cell(d, namespace=ns, tracker=tracker)
    steps.append({"failed": r["failed"], "digest": sync.namespace_digest(ns)})
print(json.dumps({"steps": steps, "check": eval(sys.argv[1], ns)}))
"""


def _follower_process(check, *dirs):
    """Applies manifest dirs in a separate Python process (its own class registry), returns
    the digest after each and the value of the `check` expression at the end."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    out = subprocess.run(
        [sys.executable, "-c", FOLLOWER, check, *map(str, dirs)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_dataclasses_enums_namedtuples_slots_and_subclasses_round_trip(tmp_path):
    # The follower is another process: cloudpickle maps a class to one class object per
    # process, so an in-process follower would share the executor's classes.
    a = Replica()
    a.run("""
        import dataclasses, enum, typing
        n = 1
        @dataclasses.dataclass
        class DC:
            x: int
            y: list = dataclasses.field(default_factory=list)
        class Color(enum.Enum):
            RED = 1
        class NT(typing.NamedTuple):
            a: int
        class Sub(dict):
            pass
        class Slotted:
            __slots__ = ("a", "b")
            def __init__(self):
                self.a = 1
        class Base:
            def hello(self):
                return f"base {n}"  # reads the global live, wherever it runs
        class Child(Base):
            @staticmethod
            def s():
                return 1
            @classmethod
            def c(cls):
                return cls.__name__
        dc, col, nt, sub, sl, ch = DC(1), Color.RED, NT(1), Sub(k=1), Slotted(), Child()
    """)
    assert a.export(tmp_path / "1")["unpicklable"] == []
    first = a.digest()
    a.run("pass")  # pickling caches nothing in a class that later looks like a change
    assert a.tracker.last.is_empty()
    a.run("dc.y.append(5)\nsub['z'] = 2\nsl.b = 3")
    assert a.tracker.last.changed == {"dc", "sub", "sl"}
    assert a.export(tmp_path / "2")["set"] == ["dc", "sl", "sub"]
    check = (
        "[col is Color.RED, isinstance(dc, DC), isinstance(nt, NT), ch.hello(), Child.c(), Child.s(),"
        " sl.b, sub['z'], dc.y, (globals().__setitem__('n', 2), ch.hello())[1]]"
    )
    got = _follower_process(check, tmp_path / "1", tmp_path / "2")
    assert [s["failed"] for s in got["steps"]] == [[], []]
    assert [s["digest"] for s in got["steps"]] == [first, a.digest()]
    assert got["check"] == [True, True, True, "base 1", "Child", 1, 3, 2, [5], "base 2"]


def test_a_corrupted_or_short_packed_payload_is_reported_and_the_others_applied(tmp_path):
    a, b = Replica(), Replica()
    a.run("x = [1, 2]\ny = 'why'\nz = 3")
    a.export(tmp_path / "1")
    manifest = json.loads((tmp_path / "1" / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["set"]}
    pack = bytearray((tmp_path / "1" / "payloads.pack").read_bytes())
    pack[entries["x"]["offset"]] ^= 0xFF
    (tmp_path / "1" / "payloads.pack").write_bytes(bytes(pack))
    entries["z"]["offset"] = len(pack) - 1  # runs past the end of the pack
    (tmp_path / "1" / "manifest.json").write_text(json.dumps(manifest))
    b.ns.update(x="stale x", z="stale z")
    got = b.apply(tmp_path / "1")
    assert got["set"] == ["y"]
    failed = {f["name"]: f["error"] for f in got["failed"]}
    assert set(failed) == {"x", "z"}
    assert "sha256" in failed["x"] and "bytes" in failed["z"]
    assert "x" not in b.ns and "z" not in b.ns and b.ns["y"] == "why"


def test_a_negative_offset_is_a_manifest_error(tmp_path):
    a, b = Replica(), Replica()
    a.run("x = 1")
    a.export(tmp_path / "1")
    manifest = json.loads((tmp_path / "1" / "manifest.json").read_text())
    manifest["set"][0]["offset"] = -1
    (tmp_path / "1" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(sync.ManifestError, match="offset"):
        b.apply(tmp_path / "1")
