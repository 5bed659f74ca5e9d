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
  echo "== health and metrics"
  curl -fsS "$url/healthz"
  curl -fsS "$url/metrics" | grep -E '^notebookos_' || true
  echo
  echo "The daemon keeps running (pid $(cat "$pidfile"), log $demo_dir/notebookosd.log)."
  echo "Try:   NBOS_URL=$url $bin/nbos status --json"
  echo "Stop:  make demo-stop"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
