#!/usr/bin/env bash
# `make demo` / `make demo-stop`: run notebookosd in dev mode (loopback, simulated GPUs)
# and show what it does. The daemon is left running for you to explore.
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/debug"
demo_dir=.nbos/demo
pidfile=$demo_dir/notebookosd.pid
listen=${NBOS_DEMO_LISTEN:-127.0.0.1:8888}
python=${NBOS_PYTHON:-.venv/bin/python}

stop() {
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill -TERM "$(cat "$pidfile")"
    for _ in $(seq 50); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
    echo "demo: notebookosd stopped"
  else
    echo "demo: no demo daemon running"
  fi
  rm -f "$pidfile"
}

start() {
  mkdir -p "$demo_dir"
  for lib in libnbos_cuda_shim.so libfake_cuda.so; do
    [ -f "$bin/$lib" ] || { echo "demo: $bin/$lib is missing; run cargo build --workspace first"; exit 1; }
  done
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "demo: restarting the running demo daemon"
    stop
  fi
  : > "$demo_dir/notebookosd.out"
  "$bin/notebookosd" --dev --state-dir "$PWD/$demo_dir/state" --listen "$listen" --fake-gpus 2 \
    >"$demo_dir/notebookosd.out" 2>"$demo_dir/notebookosd.log" &
  echo $! > "$pidfile"
  url=""
  for _ in $(seq 100); do
    url=$(grep -o 'listening on http://[^ ]*' "$demo_dir/notebookosd.out" 2>/dev/null | sed 's/listening on //' || true)
    [ -n "$url" ] && break
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { echo "demo: notebookosd exited:"; cat "$demo_dir/notebookosd.log"; exit 1; }
    sleep 0.1
  done
  [ -n "$url" ] || { echo "demo: notebookosd did not come up in 10 s; log: $demo_dir/notebookosd.log"; exit 1; }
  export NBOS_URL=$url
  echo "== notebookosd --dev is up (2 SIMULATED GPUs from the fake-cuda test double)"
  cat "$demo_dir/notebookosd.out"
  echo
  echo "== nbos status"
  "$bin/nbos" status
  echo
  echo "== health"
  curl -fsS "$url/healthz"
  echo
  echo
  # Three kernels train in turns on the two simulated GPUs, each holding a GPU
  # only while a cell runs (kernels run under the CUDA shim, leases from the daemon).
  "$python" examples/run_in_turns.py --url "$url" --nbos "$bin/nbos" --kernels 3
  echo
  echo "== GPU metrics"
  curl -fsS "$url/metrics" | grep -E '^notebookos_(gpus|lease_grants|lease_revocations|gpu_evict|gpu_restored|observer_mode|cells_total|subscription)' || true
  echo
  echo "The daemon keeps running (pid $(cat "$pidfile"), log $demo_dir/notebookosd.log)."
  echo "Try:   $python -m jupyter lab --gateway-url=$url"
  echo "       NBOS_URL=$url $bin/nbos kernels"
  echo "Stop:  make demo-stop"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
