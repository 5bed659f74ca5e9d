#!/usr/bin/env bash
# `make package`: the Debian and RPM packages of notebookosd, into $TARGET_DIR/packages/:
#   notebookosd_<v>-1_amd64.deb, notebookosd-dbgsym_<v>-1_amd64.ddeb (cargo-deb),
#   notebookosd-<v>-1.x86_64.rpm, notebookosd-debuginfo-<v>-1.x86_64.rpm (cargo-generate-rpm);
#   and notebookosd-fake-gpu (.deb, .rpm): the fake-cuda test double, never installed by
#   default, for trying NotebookOS on a machine without a GPU.
# Binaries are stripped; their debug symbols go to the -dbgsym / -debuginfo packages.
# PACKAGE_PROFILE=dev builds from the debug profile instead and PACKAGE_FAST=1 compresses
# less (what `make test-packaging` does in CI, to reuse the test build; the layout and the
# stripping are the same).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
PROFILE=${PACKAGE_PROFILE:-release}
case "$PROFILE" in
    release) PROFILE_DIR=release ;;
    dev) PROFILE_DIR=debug ;;
    *) echo "package.sh: PACKAGE_PROFILE must be release or dev, not $PROFILE" >&2; exit 2 ;;
esac
# The versions this metadata was written for (cargo install needs crates.io once).
cargo-deb --version 2>/dev/null | grep -q ' 3\.8\.0' || "$CARGO" install --locked --force cargo-deb@3.8.0
cargo-generate-rpm --version 2>/dev/null | grep -q ' 0\.21\.0' ||
    "$CARGO" install --locked --force cargo-generate-rpm@0.21.0
for tool in objcopy gzip; do
    command -v "$tool" >/dev/null || { echo "package.sh: $tool is missing (make deps)" >&2; exit 1; }
done

METADATA=$("$CARGO" metadata --format-version 1 --no-deps)
TARGET_DIR=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' <<<"$METADATA")
VERSION=$(python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "notebookosd"))' <<<"$METADATA")
BUILT="$TARGET_DIR/$PROFILE_DIR"
"$CARGO" build --profile "$PROFILE" -p notebookosd -p nbos-cli -p nbos-cuda-shim -p fake-cuda --bins --lib

GEN=packaging/generated
rm -rf "$GEN"
mkdir -p "$GEN/man" "$GEN/completions" "$GEN/bin" "$GEN/debug"
"$BUILT/nbos" manpages "$GEN/man"
"$BUILT/notebookosd" --manpage > "$GEN/man/notebookosd.8"
gzip -9n "$GEN"/man/*.1 "$GEN"/man/*.8
"$BUILT/nbos" completions bash > "$GEN/completions/nbos"
"$BUILT/nbos" completions zsh > "$GEN/completions/_nbos"
"$BUILT/nbos" completions fish > "$GEN/completions/nbos.fish"
# The RPM's binaries: stripped, each with a debuglink to its .debug file (the -debuginfo RPM).
# cargo-deb does the same for the .deb from $BUILT itself.
for f in notebookosd nbos libnbos_cuda_shim.so libfake_cuda.so; do
    objcopy --only-keep-debug --compress-debug-sections=zlib "$BUILT/$f" "$GEN/debug/$f.debug"
    objcopy --strip-debug --strip-unneeded --add-gnu-debuglink="$GEN/debug/$f.debug" "$BUILT/$f" "$GEN/bin/$f"
done

OUT="$TARGET_DIR/packages"
rm -rf "$OUT"
mkdir -p "$OUT"
# Debug sections compressed with zlib (what Rust's backtraces read); PACKAGE_FAST: the
# payloads compressed least.
fast=() rpm_compress=zstd
[ "${PACKAGE_FAST:-0}" = 1 ] && fast=(--fast) rpm_compress=gzip
"$CARGO" deb -p notebookosd --no-build --profile "$PROFILE" --compress-debug-symbols=zlib "${fast[@]}" --output "$OUT/"
"$CARGO" generate-rpm -p daemon --payload-compress "$rpm_compress" --output "$OUT"
"$CARGO" deb -p fake-cuda --no-build --profile "$PROFILE" "${fast[@]}" --output "$OUT/"
"$CARGO" generate-rpm -p tests/fake-cuda --payload-compress "$rpm_compress" --output "$OUT"
# Debug symbols fit one build only: the -debuginfo RPM requires exactly this version-release.
"$CARGO" generate-rpm -p daemon --variant debuginfo --set-metadata "requires = { notebookosd = \"= $VERSION-1\" }" \
    --payload-compress "$rpm_compress" --output "$OUT"
echo "package.sh: packages in $OUT:"
ls -l "$OUT"
