#!/usr/bin/env bash
# A rolling upgrade between two versions' binaries (docs/operations.md, "Rolling upgrade"):
# builds the old version from git (OLD_REF, default below) beside this checkout's build, then
# runs test_rolling_upgrade.py: three hosts on the old version with a kernel, each replaced in
# turn by a new-version host (join, drain the old one with `nbos cluster leave`, stop it),
# a cell after every step, the namespace intact at the end.
#
# Usage: make test-upgrade [OLD_REF=<commit>]   (root: kernels run as notebookos-kernel)
set -euo pipefail
cd "$(dirname "$0")/../.."
# The last commit before the packaging work (issue 14 resolved): the version an operator
# running this project before would upgrade from.
OLD_REF=${OLD_REF:-5567b5c}
CARGO=${CARGO:-cargo}
PYTHON=${NBOS_PYTHON:-$PWD/.venv/bin/python}
target=${CARGO_TARGET_DIR:-$PWD/target}
if ! git rev-parse -q --verify "$OLD_REF^{commit}" >/dev/null; then
  # A shallow clone (some CI checkouts) lacks the old commit: fetch it if the remote answers.
  git fetch -q --unshallow 2>/dev/null || git fetch -q origin "$OLD_REF" 2>/dev/null || true
fi
if ! old_rev=$(git rev-parse -q --verify --short=12 "$OLD_REF^{commit}"); then
  # CI (NBOS_REQUIRE_PRIVILEGED=1) clones the whole history: a missing commit there is a
  # broken setup, not a reason to pass without testing.
  if [ "${NBOS_REQUIRE_PRIVILEGED:-}" = 1 ]; then
    echo "test-upgrade: FAILED: commit $OLD_REF is not in this clone (shallow?) and could not be fetched," \
      "and NBOS_REQUIRE_PRIVILEGED=1 asks for every test to run (clone the full history)" >&2
    exit 1
  fi
  echo "test-upgrade: SKIPPED: commit $OLD_REF is not in this clone (shallow?) and could not be fetched" >&2
  exit 0
fi
work=$target/upgrade/$old_rev
old_bins=$work/bin

if [ ! -x "$old_bins/notebookosd" ]; then
  echo "== building the old version $old_rev ($(git log -1 --format=%s "$old_rev" | cut -c1-80))"
  rm -rf "$work/src" && mkdir -p "$work/src" "$old_bins"
  git archive "$old_rev" | tar -x -C "$work/src"
  # Line tables only and no incremental cache: the old tree's own profile may carry full
  # debug info (gigabytes) and it is built once.
  # nbos is its own package (nbos-cli) since issue 35; before, notebookosd built it.
  (cd "$work/src" && CARGO_TARGET_DIR=$work/target CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only \
    "$CARGO" build -q -p notebookosd -p fake-cuda -p nbos-cuda-shim $(test -d daemon/cli && echo -p nbos-cli))
  cp "$work/target/debug/"{notebookosd,nbos,libfake_cuda.so,libnbos_cuda_shim.so} "$old_bins/"
  rm -rf "$work/target"
fi
# Each version's kernels import that version's helper (python/nbos_kernel): the old hosts'
# Python puts the old tree's first. Kernels run as another account: readable, executable.
cat > "$old_bins/python" <<WRAPPER
#!/bin/sh
PYTHONPATH=$work/src/python\${PYTHONPATH:+:\$PYTHONPATH} exec $PYTHON "\$@"
WRAPPER
chmod 0755 "$old_bins/python" "$work" "$work/src" "$target/upgrade"

echo "== building this version"
"$CARGO" build -q -p notebookosd -p nbos-cli -p fake-cuda -p nbos-cuda-shim
NBOS_BIN_DIR=$target/debug NBOS_OLD_BIN_DIR=$old_bins NBOS_OLD_REF=$old_rev \
  "$PYTHON" -m pytest -q -p no:cacheprovider tests/upgrade "$@"
