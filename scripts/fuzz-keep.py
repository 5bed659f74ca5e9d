#!/usr/bin/env python3
"""Adds to fuzz/corpus/TARGET/ the inputs of a fuzzing run's queue that reach coverage the
committed corpus does not (docs/fuzzing.md), so what a long run found survives the machine.

Usage: scripts/fuzz-keep.py TARGET QUEUE_DIR [BINARY]
  QUEUE_DIR: e.g. target/fuzz/findings/TARGET/default/queue
  BINARY:    the instrumented target (default: $CARGO_TARGET_DIR or target, /fuzz/release/TARGET)

An input's coverage is the set of edges `cargo afl showmap` reports for it. The committed
inputs are taken first; then, smallest first, each queue input that reaches an edge nothing
taken so far reaches is copied as `q-<sha256 prefix>`: the greedy pass of afl-cmin, written
here because afl-cmin.py found no edges in these stdin targets.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def edges_of_each(binary: Path, inputs: Path, traces: Path) -> dict[str, set[str]]:
    """Edges each input of the directory `inputs` reaches, by file name (one afl-showmap
    run over the directory: the target is forked per input, not started)."""
    subprocess.run(
        ["cargo", "afl", "showmap", "-q", "-t", "2000", "-i", str(inputs), "-o", str(traces), "--", str(binary)],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if not traces.is_dir():
        return {}
    # Edges only, not their hit-count buckets: the buckets would keep most of a queue.
    return {t.name: {line.split(":")[0] for line in t.read_text().split()} for t in traces.iterdir()}


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    target, queue = sys.argv[1], Path(sys.argv[2])
    root = Path(__file__).resolve().parent.parent
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR") or root / "target")
    binary = Path(sys.argv[3]) if len(sys.argv) == 4 else target_dir / "fuzz" / "release" / target
    corpus = root / "fuzz" / "corpus" / target
    if not corpus.is_dir() or not binary.exists() or not queue.is_dir():
        print(f"fuzz-keep: need {corpus}, {binary} and {queue}", file=sys.stderr)
        return 2
    os.environ.update(AFL_SKIP_CPUFREQ="1", AFL_NO_AFFINITY="1", AFL_QUIET="1")
    with tempfile.TemporaryDirectory() as tmp:
        committed = {hashlib.sha256(f.read_bytes()).hexdigest() for f in corpus.iterdir() if f.is_file()}
        covered: set[str] = set()
        for found in edges_of_each(binary, corpus, Path(tmp) / "corpus").values():
            covered |= found
        if not covered:
            print(f"fuzz-keep: {binary} reported no edges for the committed corpus", file=sys.stderr)
            return 1
        before = len(covered)
        reached = edges_of_each(binary, queue, Path(tmp) / "queue")
        candidates = sorted((f for f in queue.iterdir() if f.is_file()), key=lambda f: (f.stat().st_size, f.name))
        kept = 0
        for f in candidates:
            data = f.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest in committed:
                continue
            new = reached.get(f.name, set()) - covered
            if new:
                covered |= new
                committed.add(digest)
                (corpus / f"q-{digest[:16]}").write_bytes(data)
                kept += 1
    print(f"fuzz-keep: {target}: {kept} of {len(candidates)} queue inputs kept; edges {before} -> {len(covered)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
