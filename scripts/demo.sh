#!/usr/bin/env bash
# `make demo` / `make demo-stop`: a three-host NotebookOS cluster on this machine (three
# notebookosd processes on loopback, one SIMULATED GPU each from the fake-cuda test
# double), three replicated kernels training in turns, a host killed and restarted.
# The cluster is left running for you to explore.
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/debug"
demo_dir=$PWD/.nbos/demo
python=${NBOS_PYTHON:-.venv/bin/python}
http_base=${NBOS_DEMO_HTTP_BASE:-8880}   # host i listens on 127.0.0.1:(base + i)
raft_base=${NBOS_DEMO_RAFT_BASE:-7100}
hosts=3

pki=$demo_dir/pki
# Never plaintext: raft mutual TLS, HTTPS, and node certificates between hosts, from a
# PKI made for the demo. nbos (and the kernelspecs it installs) trust its CA.
export NBOS_CA_CERT=$pki/ca.pem
url() { echo "https://127.0.0.1:$((http_base + $1))"; }
pidfile() { echo "$demo_dir/host$1/pid"; }
alive() { [ -f "$(pidfile "$1")" ] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }

# The cluster's directory — PKI, each host's directory and config — is laid out by
# nbos-test-cluster (tests/support), the launcher the tests use too: host i on HTTP port
# http_base+i and raft port raft_base+i, one simulated GPU, a token-less loopback API as
# `notebookosd --dev` serves (clients present certificates from the demo's PKI).
prepare() {
  "$bin/nbos-test-cluster" prepare --dir "$demo_dir" --hosts $hosts --tls --fake-gpus 1 --python python3 \
    --http-base "$http_base" --raft-base "$raft_base" --unauthenticated-loopback --host-ttl 1s \
    >"$demo_dir/layout.json"
}

start_host() {
  local i=$1
  # setsid: each host is its own process group, so "kill the host" takes its kernels too.
  setsid "$bin/notebookosd" --config "$demo_dir/host$i/notebookosd.toml" \
    >"$demo_dir/host$i/out" 2>>"$demo_dir/host$i/log" </dev/null &
  echo $! > "$(pidfile "$i")"
  disown  # killed on purpose later: no "Killed" job notice from this shell
}

wait_up() {
  for _ in $(seq 300); do
    if "$bin/nbos" --url "$(url 1)" cluster status --json 2>/dev/null |
      "$python" -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if s.get("ready") and sum(1 for m in s["members"] if m.get("up")) == int(sys.argv[1]) else 1)' "$1" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "demo: the cluster did not come up in 60 s; logs: $demo_dir/host*/log"
  exit 1
}

stop() {
  local any=""
  for i in $(seq $hosts); do
    if alive "$i"; then
      kill -TERM "$(cat "$(pidfile "$i")")"
      any=1
    fi
  done
  for i in $(seq $hosts); do
    for _ in $(seq 100); do alive "$i" || break; sleep 0.1; done
    if alive "$i"; then kill -KILL -- "-$(cat "$(pidfile "$i")")" 2>/dev/null || true; fi
    rm -f "$(pidfile "$i")"
  done
  if [ -n "$any" ]; then echo "demo: cluster stopped"; else echo "demo: no demo cluster running"; fi
}

start() {
  for lib in libnbos_cuda_shim.so libfake_cuda.so nbos-test-cluster; do
    [ -f "$bin/$lib" ] || { echo "demo: $bin/$lib is missing; run cargo build --workspace first"; exit 1; }
  done
  stop >/dev/null
  # A fresh cluster each time: the demo's state is not worth keeping.
  rm -rf "$demo_dir"
  mkdir -p "$demo_dir"
  # Kernels run as another uid (kernel.user): they must pass through to each host's
  # runtime directory (enter, not list), whatever the umask (prepare sets $demo_dir's).
  chmod 0711 "$(dirname "$demo_dir")"
  prepare
  "$bin/nbos" pki issue --dir "$pki" client jupyter >/dev/null
  for i in $(seq $hosts); do start_host "$i"; done
  wait_up $hosts
  echo "== three notebookosd hosts on loopback, 1 SIMULATED GPU each (fake-cuda test double)"
  "$bin/nbos" --url "$(url 1)" cluster status
  echo
  urls=$(for i in $(seq $hosts); do printf '%s,' "$(url "$i")"; done)
  pids=$(for i in $(seq $hosts); do printf '%s,' "$(pidfile "$i")"; done)
  "$python" examples/run_replicated.py --urls "${urls%,}" --nbos "$bin/nbos" --pidfiles "${pids%,}" \
    --restart "$0 restart-host {i}" --kernels 3
  echo
  echo "The cluster keeps running (logs: $demo_dir/host*/log). Any host's gateway serves any kernel:"
  echo "Try:   $python -m jupyter lab --gateway-url=$(url 1) --GatewayClient.ca_certs=$pki/ca.pem \\"
  echo "         --GatewayClient.client_cert=$pki/client-jupyter.pem --GatewayClient.client_key=$pki/client-jupyter.key"
  echo "       $bin/nbos --ca-cert $pki/ca.pem --url $(url 2) cluster status"
  echo "Stop:  make demo-stop"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  restart-host)
    i=${2:?restart-host needs a host number}
    alive "$i" && { echo "demo: host $i is running"; exit 1; }
    start_host "$i"
    wait_up $hosts
    echo "demo: host $i restarted with its state directory"
    ;;
  *) echo "usage: $0 start|stop|restart-host N" >&2; exit 2 ;;
esac
