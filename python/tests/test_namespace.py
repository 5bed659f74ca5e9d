from nbos_kernel import NamespaceTracker, fingerprint, namespace
from nbos_kernel.namespace import is_user_name


def test_new_rebound_mutated_and_deleted_names_are_reported():
    ns = {"a": 1, "xs": [1, 2], "keep": "same", "gone": 3.0}
    t = NamespaceTracker(ns)
    ns["a"] = 2  # rebound
    ns["xs"].append(3)  # mutated in place
    ns["new"] = {"k": "v"}  # new
    del ns["gone"]
    c = t.end_cell()
    assert c.changed == {"a", "xs", "new"}
    assert c.deleted == {"gone"}


def test_a_cell_that_changes_nothing_reports_nothing():
    ns = {"a": [1, 2, 3]}
    t = NamespaceTracker(ns)
    assert t.end_cell().is_empty()
    ns["a"] = [1, 2, 3]  # equal content, new object: nothing to sync
    assert t.end_cell().is_empty()


def test_ipython_and_private_names_are_not_user_state():
    ns = {"In": [], "Out": {}, "_": 1, "_i3": "x", "__builtins__": None, "get_ipython": print}
    t = NamespaceTracker(ns)
    ns["_"] = 2
    ns["Out"][1] = 5
    assert t.end_cell().is_empty()
    assert is_user_name("model") and is_user_name("_tmp") and is_user_name("_i_x")
    for name in ("_", "__", "___", "_i", "_ii", "_iii", "_i3", "_3", "_ih", "_oh", "_dh", "_exit_code"):
        assert not is_user_name(name), name
    assert not is_user_name("__name__") and not is_user_name("_nbos_tracker")


def test_unpicklable_values_change_only_when_rebound():
    lock_type = type(__import__("threading").Lock())
    ns = {"lock": __import__("threading").Lock()}
    t = NamespaceTracker(ns)
    assert fingerprint(ns["lock"]).startswith("unpicklable:")
    assert t.end_cell().is_empty()
    ns["lock"] = __import__("threading").Lock()
    assert t.end_cell().changed == {"lock"}
    assert isinstance(ns["lock"], lock_type)


def test_modules_are_fingerprinted_by_name():
    import json

    assert fingerprint(json) == "module:json"


def test_huge_values_are_not_hashed_in_full(monkeypatch):
    monkeypatch.setattr(namespace, "MAX_FINGERPRINT_BYTES", 1024 * 1024)
    big = bytearray(2 * 1024 * 1024)
    fp = fingerprint(big)
    assert fp.startswith("large:")
    big[0] = 1  # the first block is always sampled
    assert fingerprint(big) != fp


def test_keys_that_are_not_identifiers_are_ignored():
    ns = {"a": 1}
    t = NamespaceTracker(ns)
    ns[1] = "int key"
    ns["a b"] = "not an identifier"
    assert t.end_cell().is_empty()
