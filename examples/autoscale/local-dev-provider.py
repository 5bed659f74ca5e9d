#!/usr/bin/env python3
"""An `exec` autoscaling provider that starts and stops local notebookosd daemons.

notebookosd runs it with one JSON request on stdin (docs/autoscaling.md) and reads one JSON
answer from stdout. `scale_out` starts `count` daemons from a config template and has each
join the cluster (`nbos cluster join`); `release` stops a daemon that has left the cluster.
This is the provider the test suite uses (daemon/bench/tests/cluster_autoscale.rs); a cloud
auto-scaling group or a Kubernetes node pool follows the same contract
(examples/autoscale/aws-asg-provider.sh, examples/autoscale/k8s-node-pool-provider.sh).

The template is a notebookosd TOML config with {node_id}, {dir} (the host's own directory)
and {raft_listen} (a free loopback port) filled in per host.
"""
import argparse
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time


def free_port():
    """A loopback port free now, below Linux's ephemeral range (32768+): a port-0 pick could be
    taken by any outgoing connection before the new daemon binds it."""
    first = random.randrange(12_000)
    for i in range(12_000):
        port = 20_000 + (first + i) % 12_000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port in 20000..32000")


def next_node_id(args):
    """Allocates node ids under a lock (a node id belongs to one state directory for life)."""
    path = os.path.join(args.dir, "next-node-id")
    with open(os.path.join(args.dir, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as f:
                n = int(f.read().strip())
        except FileNotFoundError:
            n = args.first_node_id
        with open(path, "w") as f:
            f.write(str(n + 1))
        return n


def wait_endpoint(host_dir, proc, timeout):
    endpoint = os.path.join(host_dir, "run", "endpoint.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"notebookosd exited with {proc.returncode}; see {host_dir}/log")
        try:
            with open(endpoint) as f:
                return json.load(f)["url"]
        except (FileNotFoundError, ValueError, KeyError):
            time.sleep(0.1)
    raise RuntimeError(f"notebookosd in {host_dir} did not serve HTTP within {timeout} s")


def nbos(args, url, *rest):
    cmd = [args.nbos, "--url", url]
    # A cluster without a PKI (plain HTTP on loopback, as `nbos replay` starts) has no CA.
    if args.ca_cert:
        cmd += ["--ca-cert", args.ca_cert]
    # Files, not the tokens themselves: argv is readable by every local user.
    if args.token_file:
        cmd += ["--token-file", args.token_file]
    if args.operator_token_file:
        cmd += ["--operator-token-file", args.operator_token_file]
    return subprocess.run(cmd + list(rest), capture_output=True, text=True, timeout=120)


def scale_out(args, request):
    members = [h["gateway_url"] for h in request["cluster"]["hosts"]]
    if not members:
        raise RuntimeError("no live host to join")
    template = open(args.template).read()
    started = []
    for _ in range(int(request["count"])):
        node_id = next_node_id(args)
        host_dir = os.path.join(args.dir, f"host{node_id}")
        os.makedirs(host_dir, exist_ok=True)
        config = os.path.join(host_dir, "notebookosd.toml")
        with open(config, "w") as f:
            f.write(template.format(node_id=node_id, dir=host_dir, raft_listen=f"127.0.0.1:{free_port()}"))
        with open(os.path.join(host_dir, "log"), "ab") as log:
            proc = subprocess.Popen([args.notebookosd, "--config", config], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        with open(os.path.join(host_dir, "pid"), "w") as f:
            f.write(str(proc.pid))
        url = wait_endpoint(host_dir, proc, 60)
        joined = nbos(args, url, "cluster", "join", members[0])
        if joined.returncode != 0:
            raise RuntimeError(f"host {node_id} could not join: {joined.stdout}{joined.stderr}")
        started.append(node_id)
    return f"started and joined hosts {started}"


def release(args, request):
    node_id = int(request["host"]["node_id"])
    pid_file = os.path.join(args.dir, f"host{node_id}", "pid")
    try:
        pid = int(open(pid_file).read().strip())
    except FileNotFoundError:
        return f"host {node_id} is not one of ours (no {pid_file}); nothing to stop"
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.rename(pid_file, pid_file + ".released")
    return f"stopped host {node_id} (pid {pid})"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="where the started hosts live (one directory each)")
    p.add_argument("--template", required=True, help="notebookosd config template")
    p.add_argument("--first-node-id", type=int, default=100)
    p.add_argument("--notebookosd", required=True)
    p.add_argument("--nbos", required=True)
    p.add_argument("--ca-cert", help="the cluster's CA certificate (HTTPS); without it, plain HTTP")
    p.add_argument("--token-file")
    p.add_argument("--operator-token-file", required=True)
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    try:
        request = json.load(sys.stdin)
        action = request.get("action")
        if action == "scale_out":
            message = scale_out(args, request)
        elif action == "release":
            message = release(args, request)
        else:
            raise RuntimeError(f"unknown action {action!r}")
        print(json.dumps({"ok": True, "message": message}))
    except Exception as e:  # the daemon gets a message, never a traceback on stdout
        print(json.dumps({"ok": False, "message": str(e)}))


if __name__ == "__main__":
    main()
