#!/usr/bin/env python3
"""An `exec` autoscaling provider that fails on purpose, in front of a real one.

Usage: flaky-provider.py --state DIR [--fail-releases N] -- PROVIDER ARGV...

Each host's first N `release` requests fail: the odd ones exit 3 with a message on stderr,
the even ones answer {"ok": false}. Every other request goes to PROVIDER unchanged. (A
provider that hangs is killed at autoscale.command_timeout and fails the same way; the
provider's unit tests cover the kill.) DIR keeps the per-host counts and a log
of every request and what was done with it (requests.log), for the test to read.
"""
import argparse
import fcntl
import json
import os
import subprocess
import sys


def count(state, node_id):
    """This request's number among the host's release requests (1-based), under a lock."""
    path = os.path.join(state, f"release-{node_id}")
    with open(os.path.join(state, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as f:
                n = int(f.read().strip()) + 1
        except FileNotFoundError:
            n = 1
        with open(path, "w") as f:
            f.write(str(n))
        return n


def log(state, line):
    with open(os.path.join(state, "requests.log"), "a") as f:
        f.write(line + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state", required=True)
    p.add_argument("--fail-releases", type=int, default=0)
    p.add_argument("provider", nargs=argparse.REMAINDER)
    args = p.parse_args()
    provider = args.provider[1:] if args.provider[:1] == ["--"] else args.provider
    os.makedirs(args.state, exist_ok=True)
    raw = sys.stdin.read()
    request = json.loads(raw)
    if request.get("action") == "release":
        node_id = int(request["host"]["node_id"])
        n = count(args.state, node_id)
        if n <= args.fail_releases:
            log(args.state, f"release {node_id} #{n}: failed")
            if n % 2 == 1:
                print(f"injected failure #{n} releasing host {node_id}", file=sys.stderr)
                sys.exit(3)
            print(json.dumps({"ok": False, "message": f"injected refusal #{n} releasing host {node_id}"}))
            return
        log(args.state, f"release {node_id} #{n}: passed on")
    else:
        log(args.state, f"{request.get('action')}: passed on")
    done = subprocess.run(provider, input=raw, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
