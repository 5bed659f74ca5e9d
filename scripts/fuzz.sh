#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers that peers and users reach (docs/fuzzing.md):
# AFL++ through cargo-afl, on stable Rust. Builds the targets in fuzz/ (instrumented, under
# <target dir>/fuzz), then runs each in turn for SECONDS on its committed corpus
# fuzz/corpus/<target>/, and fails when any run saved a crash or a hang.
# Usage: scripts/fuzz.sh SECONDS [TARGET...]     (default: every target; SECONDS 0: build only)
# Findings: <target dir>/fuzz/findings/<target>/default/{crashes,hangs,queue}/ (FUZZ_OUT overrides).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
all=(lease_proto raft_frame jupyter_wire jupyter_ws gateway_bodies config_file zmq_frames)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")

# cargo-afl builds AFL++ (afl-fuzz and its runtime) from the sources in the crate with
# make and gcc: no download besides crates.io. Installed once; skipped when present.
CARGO_AFL_VERSION=0.18.2
if ! cargo afl --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-afl $CARGO_AFL_VERSION (builds AFL++; a few minutes, once)"
  cargo install --locked "cargo-afl@$CARGO_AFL_VERSION"
fi
# The AFL++ runtime is built per rustc version: after a toolchain update, build it again.
# (It refuses, harmlessly, when it is already built for this rustc.)
cargo afl config --build >/dev/null 2>&1 || true

target_dir=${CARGO_TARGET_DIR:-$PWD/target}/fuzz
out=${FUZZ_OUT:-$target_dir/findings}
echo "fuzz: building the targets (instrumented, release) in $target_dir"
(cd fuzz && cargo afl build --release --target-dir "$target_dir" --bins)
[ "$seconds" = 0 ] && exit 0

# Not a tuned fuzzing box: no CPU governor or core_pattern changes, no core pinning (the
# machine is shared), no UI (logs), and a run ends after $seconds.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1 AFL_NO_AFFINITY=1
export AFL_NO_STARTUP_CALIBRATION=1
failed=()
for t in "${targets[@]}"; do
  [ -d "fuzz/corpus/$t" ] || { echo "fuzz: no corpus fuzz/corpus/$t (unknown target?)" >&2; exit 2; }
  rm -rf "${out:?}/$t"
  mkdir -p "$out/$t"
  # Replay the committed corpus first: afl-fuzz skips a seed that crashes, so a fixed
  # crash (kept there as crash-*) that came back would otherwise go unnoticed.
  replay_failed=0
  for f in "fuzz/corpus/$t"/*; do
    if ! "$target_dir/release/$t" <"$f" >"$out/$t.replay.log" 2>&1; then
      echo "fuzz: $t fails on its corpus file $f:" >&2
      tail -5 "$out/$t.replay.log" >&2
      replay_failed=1
    fi
  done
  if ((replay_failed)); then
    failed+=("$t (corpus replay)")
    continue
  fi
  echo "== fuzz $t for ${seconds}s"
  # -V: stop after $seconds; -t: a run over 1 s is a hang. The fuzzer's status lines go to a log.
  if ! nice -n 19 cargo afl fuzz -V "$seconds" -t 1000 -i "fuzz/corpus/$t" -o "$out/$t" \
    "$target_dir/release/$t" >"$out/$t.log" 2>&1; then
    tail -20 "$out/$t.log" >&2
    failed+=("$t (afl-fuzz failed: $out/$t.log)")
    continue
  fi
  stats=$out/$t/default/fuzzer_stats
  execs=$(awk -F' *: *' '$1=="execs_done"{print $2}' "$stats")
  corpus=$(awk -F' *: *' '$1=="corpus_count"{print $2}' "$stats")
  edges=$(awk -F' *: *' '$1=="edges_found"{print $2}' "$stats")
  echo "   $t: $execs execs, corpus $corpus, $edges edges"
  found=$(find "$out/$t/default/crashes" "$out/$t/default/hangs" -type f ! -name README.txt 2>/dev/null)
  if [ -n "$found" ]; then
    echo "fuzz: $t found crashes or hangs (reproduce: $target_dir/release/$t < FILE):" >&2
    echo "$found" | sed 's/^/  /' >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, no crash or hang"
