"""Timings of nbos_kernel's state sync, best of 5, in one process on plain namespaces.

    .venv/bin/python python/benches/sync_bench.py

end_cell: the tracker after a cell; export: export_cell of every name (tmpdir files);
apply: apply_cell of that export into an empty namespace; digest: namespace_digest.
"""

import tempfile
import time

import numpy as np

from nbos_kernel import NamespaceTracker, sync


def best_ms(fn, runs=5):
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main():
    cases = {
        "10 MiB array": {"arr": np.random.rand(10 * 1024 * 1024 // 8)},
        "1000 small dicts": {f"v{i}": {"k": list(range(20)), "s": "x" * 50} for i in range(1000)},
        "1M tuples in a list": {"pairs": [(i, float(i)) for i in range(1_000_000)]},
    }
    for label, values in cases.items():
        space = {"__name__": "__main__", **values}
        tracker = NamespaceTracker(space)
        with tempfile.TemporaryDirectory() as tmp:
            runs = iter(range(1000))

            def export():
                tracker.mark_changed(values)
                return sync.export_cell(f"{tmp}/{next(runs)}", namespace=space, tracker=tracker)

            export_ms = best_ms(export)
            follower = {"__name__": "__main__"}
            follower_tracker = NamespaceTracker(follower)
            apply_ms = best_ms(lambda: sync.apply_cell(f"{tmp}/0", namespace=follower, tracker=follower_tracker))
        print(
            f"{label:>20}: end_cell {best_ms(tracker.end_cell):7.1f} ms  export {export_ms:7.1f} ms"
            f"  apply {apply_ms:7.1f} ms  namespace_digest {best_ms(lambda: sync.namespace_digest(space)):7.1f} ms"
        )


if __name__ == "__main__":
    main()
