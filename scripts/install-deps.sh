#!/usr/bin/env bash
# Installs what building, testing and the demo need, idempotently:
#   Debian packages (apt-get, when missing and we are root; otherwise prints the command),
#   and the Python venv at .venv from requirements-dev.txt plus python/ (nbos_kernel).
# Usage: scripts/install-deps.sh [--no-venv]
set -euo pipefail
cd "$(dirname "$0")/.."

# clang + libbpf-dev + bpftool: the eBPF programs (C, -target bpf, CO-RE against the kernel's BTF).
# gcc/libc6-dev: C test programs and crates with C parts. python3-venv: the venv.
# pkg-config: -sys crates. procps: `ps`/`pkill` used by tests and the demo.
# strace: the test that the leased hot path makes no syscalls. systemd: systemd-analyze
# (unit verification; `syscall-filter` expands the unit's groups); libseccomp2: the test
# support crate loads it to build the unit's seccomp filters as systemd does.
# Tests needing them fail, not skip, in CI (NBOS_REQUIRE_PRIVILEGED=1).
# protobuf-compiler + libprotobuf-dev: the etcd-client crate's build (protoc, well-known types).
# etcd-server: `nbos bench raft --etcd` and its test.
# chromium + chromium-driver: the JupyterLab browser tests (tests/browser); haproxy: the
# load balancer in front of the gateways in the browser failover test (docs/operations.md).
# prometheus: promtool and the Prometheus that daemon/tests/prometheus_rules.rs starts itself
# to check packaging/prometheus/ and packaging/grafana/ against real daemons.
# nodejs (with npm): configurable-http-proxy, the JupyterHub proxy of the users tests (below).
# binutils (objcopy, readelf), debootstrap, lintian, rpm: `make package` and `make test-packaging`.
# nftables, e2fsprogs (mkfs.ext4), iproute2: the fault campaign (`make chaos`, tests/chaos/).
packages=(clang llvm libbpf-dev bpftool gcc libc6-dev pkg-config python3-venv procps curl strace systemd libseccomp2
  protobuf-compiler libprotobuf-dev etcd-server chromium chromium-driver haproxy prometheus
  binutils debootstrap lintian rpm nftables e2fsprogs iproute2 nodejs)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "install-deps: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "install-deps: missing Debian packages: ${missing[*]}" >&2
    echo "install-deps: run:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# The unprivileged account notebookosd runs kernels as (config kernel.user; packages use
# packaging/notebookos.sysusers). Tests start root daemons whose kernels run as it.
if ! getent passwd notebookos-kernel >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "install-deps: creating the system user notebookos-kernel"
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin notebookos-kernel
  else
    echo "install-deps: run:  sudo useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin notebookos-kernel" >&2
  fi
fi

for tool in cargo rustc; do
  command -v "$tool" >/dev/null || { echo "install-deps: $tool not found: install Rust 1.95 with rustup (https://rustup.rs)" >&2; exit 1; }
done

[ "${1:-}" = "--no-venv" ] && exit 0

# JupyterHub's proxy for the users tests (tests/jupyter/hub_harness.py): configurable-http-proxy
# from npm, exactly as tests/jupyter/hub-npm/package-lock.json pins it, into .nbos/hub-npm;
# reinstalled only when that lock file changes. Debian's nodejs has no npm; nodesource's has.
command -v npm >/dev/null || {
  if [ "$(id -u)" = 0 ]; then
    echo "install-deps: installing Debian's npm"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  else
    echo "install-deps: run:  sudo apt-get install -y npm" >&2; exit 1
  fi
}
hub_npm=.nbos/hub-npm
want=$(sha256sum tests/jupyter/hub-npm/package-lock.json | cut -d' ' -f1)
if [ ! -x "$hub_npm/node_modules/.bin/configurable-http-proxy" ] || [ "$(cat "$hub_npm/.nbos-installed" 2>/dev/null)" != "$want" ]; then
  echo "install-deps: installing configurable-http-proxy into $hub_npm (tests/jupyter/hub-npm)"
  rm -rf "$hub_npm" && mkdir -p "$hub_npm"
  cp tests/jupyter/hub-npm/package.json tests/jupyter/hub-npm/package-lock.json "$hub_npm"/
  (cd "$hub_npm" && npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1) ||
    { cat "$hub_npm/npm.log" >&2; echo "install-deps: npm ci failed (log above)" >&2; exit 1; }
  echo "$want" > "$hub_npm/.nbos-installed"
fi

# The venv is rebuilt only when requirements-dev.txt or python/pyproject.toml change.
# Debian's interpreter (python3-venv above); some toolchains put a python3 without ssl first on PATH.
default_python=python3
[ -x /usr/bin/python3 ] && default_python=/usr/bin/python3
python=${PYTHON:-$default_python}
stamp=.venv/.nbos-installed
want=$(cat requirements-dev.txt python/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "install-deps: creating the Python venv in .venv (requirements-dev.txt)"
"$python" -m venv .venv
log=.venv/install.log
{
  .venv/bin/python -m pip install -q -r requirements-dev.txt &&
  .venv/bin/python -m pip install -q -e python/
} >"$log" 2>&1 || { cat "$log" >&2; echo "install-deps: pip failed (log above, also in $log)" >&2; exit 1; }
.venv/bin/python -m ipykernel --version >/dev/null
echo "$want" > "$stamp"
