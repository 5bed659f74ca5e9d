#!/usr/bin/env python3
"""Peak RSS of a notebookosd under one hostile-client attack (issue 29).

Starts the given notebookosd binary with `--dev --fake-gpus 1` on a free loopback port,
runs one attack, and prints JSON: the daemon's VmRSS before the attack, its VmHWM (peak
RSS) after it, and what the attack saw.

  ws:   SOCKETS WebSocket connections to one kernel's channels each send one text message
        of SIZE bytes at once (a JSON object whose content is a long array of numbers,
        without a header: the old decoder built a JSON tree of the whole message before
        finding that out).
  slow: CONNS connections each send PAD bytes of a request head and never finish it.

  scripts/hostile-rss.py --bin target/debug/notebookosd ws --sockets 8 --size 16000000
  scripts/hostile-rss.py --bin target/debug/notebookosd slow --conns 3000 --pad 60000

The kernel's Python is the first `python3` on PATH, with ipykernel (--python-bin puts a
directory first; default: the repository's .venv/bin).
"""

import argparse
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def wait_healthy(url, proc, deadline=60):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"notebookosd exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("notebookosd did not answer /healthz")


def ws_open(port, path):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError("closed during the WebSocket handshake")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"no upgrade: {head[:200]!r}")
    return s


def ws_text_frame(payload):
    # A client frame must be masked; a zero key leaves the payload as is.
    return bytes([0x81, 0x80 | 127]) + struct.pack(">Q", len(payload)) + b"\0\0\0\0" + payload


def ws_wait_close(s, timeout):
    """The close code and reason the server sent, or None if it sent none in time."""
    s.settimeout(timeout)
    buf = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
            while len(buf) >= 2:
                op, n = buf[0] & 0x0F, buf[1] & 0x7F
                at = 2
                if n == 126:
                    n, at = struct.unpack(">H", buf[2:4])[0], 4
                elif n == 127:
                    n, at = struct.unpack(">Q", buf[2:10])[0], 10
                if len(buf) < at + n:
                    break
                payload, buf = buf[at : at + n], buf[at + n :]
                if op == 0x8:
                    code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                    return {"code": code, "reason": payload[2:].decode(errors="replace")}
    except OSError:
        return None


def attack_ws(port, url, args):
    req = urllib.request.Request(
        f"{url}/api/kernels", data=b'{"name":"python3"}', headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        kernel = json.load(r)["id"]
    sockets = [ws_open(port, f"/api/kernels/{kernel}/channels") for _ in range(args.sockets)]
    body = b'{"content":{"pad":[' + b"0," * ((args.size - 22) // 2) + b"0]}}"
    frame = ws_text_frame(body)
    start = threading.Barrier(len(sockets))

    def send(s):
        start.wait()
        try:
            s.sendall(frame)
        except OSError:
            pass  # closed by the server mid-send: that is an answer too

    threads = [threading.Thread(target=send, args=(s,)) for s in sockets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    closes = [ws_wait_close(s, args.settle) for s in sockets]
    for s in sockets:
        s.close()
    return {"kernel": kernel, "sockets": args.sockets, "message_bytes": len(body), "closes": closes}


def attack_slow(port, url, args):
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * args.pad
    conns, refused = [], 0
    for _ in range(args.conns):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
            conns.append(s)
        except OSError:
            refused += 1
    time.sleep(args.settle)
    # Which connections the server still holds: a closed one reads EOF (or a reset).
    still_open = 0
    for s in conns:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK) != b"":
                still_open += 1
        except BlockingIOError:
            still_open += 1
        except OSError:
            pass
    for s in conns:
        s.close()
    return {"conns": args.conns, "pad_bytes": args.pad, "failed_to_send": refused, "still_open_after": still_open}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the notebookosd binary")
    p.add_argument("--python-bin", default=str(REPO / ".venv" / "bin"), help="directory put first on PATH")
    p.add_argument("--settle", type=float, default=10.0, help="seconds to wait for the server after the attack")
    sub = p.add_subparsers(dest="attack", required=True)
    ws = sub.add_parser("ws")
    ws.add_argument("--sockets", type=int, default=8)
    ws.add_argument("--size", type=int, default=16_000_000)
    slow = sub.add_parser("slow")
    slow.add_argument("--conns", type=int, default=3000)
    slow.add_argument("--pad", type=int, default=60_000)
    args = p.parse_args()

    # Room for thousands of sockets here and in the daemon (which inherits the limit).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PATH=f"{args.python_bin}:{os.environ.get('PATH', '')}", RUST_LOG="warn")
    state = tempfile.mkdtemp(prefix="hostile-rss-")
    proc = subprocess.Popen(
        [args.bin, "--dev", "--fake-gpus", "1", "--listen", f"127.0.0.1:{port}", "--state-dir", state],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(url, proc)
        rss_before = status_kib(proc.pid, "VmRSS")
        seen = (attack_ws if args.attack == "ws" else attack_slow)(port, url, args)
        time.sleep(1)
        out = {
            "binary": args.bin,
            "attack": args.attack,
            "rss_before_kib": rss_before,
            "peak_rss_kib": status_kib(proc.pid, "VmHWM"),
            "rss_after_kib": status_kib(proc.pid, "VmRSS"),
            "daemon_alive": proc.poll() is None,
            **seen,
        }
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=10) as r:
                out["healthz_after"] = r.status
        except OSError as e:
            out["healthz_after"] = str(e)
        print(json.dumps(out))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
