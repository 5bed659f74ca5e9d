"""A userspace TCP fault proxy (asyncio): the kernel of the chaos machine has no `netem`.

One proxy runs inside each host's network namespace, in front of that host's daemon:
it listens on the host's bridge address (10.77.0.N:PORT) and forwards to the daemon,
which listens on the namespace's loopback (127.0.0.1:PORT). Every byte another host
(or the campaign's client) sends to this host goes through it, so it shapes the
*ingress* of its host, per source address:

- `delay_ms` + uniform `jitter_ms`: each chunk read from either side of a connection
  whose peer is that source is delivered that much later (order kept: a chunk is never
  delivered before the one read before it);
- `loss`: TCP carries no datagrams to drop, so a "lost" chunk is delivered after an
  extra `retransmit_ms` (default 200 ms), what a retransmission costs a TCP stream;
- `reset`: probability, per chunk, that the connection is torn down (RST-like close).

Rules come from a JSON control file, re-read when it changes:
`{"rules": {"10.77.0.2": {"delay_ms": 50, "jitter_ms": 20, "loss": 0.05}}}`.
Partitions are NOT done here: they are nftables rules (see netns.py), which drop the
packets below TCP. Usage: faultproxy.py --control FILE --seed S LISTEN=TARGET ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

RULES: dict[str, dict] = {}
RNG = random.Random(0)


def rule_for(peer: str) -> dict | None:
    r = RULES.get(peer) or RULES.get("*")
    return r or None


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
    """Copies reader to writer, shaping each chunk by the rule of `peer` (read live)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while True:
            at, data = await queue.get()
            if data is None:
                break
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    last = 0.0
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            rule = rule_for(peer)
            at = time.monotonic()
            if rule:
                if rule.get("reset", 0) and RNG.random() < rule["reset"]:
                    raise ConnectionResetError("fault proxy: reset")
                at += (rule.get("delay_ms", 0) + RNG.uniform(0, rule.get("jitter_ms", 0))) / 1000
                if rule.get("loss", 0) and RNG.random() < rule["loss"]:
                    at += rule.get("retransmit_ms", 200) / 1000
            at = max(at, last)
            last = at
            await queue.put((at, data))
        await queue.put((0, None))
        await sender
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, ConnectionError, asyncio.CancelledError):
        sender.cancel()
        writer.transport.abort()


async def handle(client_r, client_w, target: tuple[str, int]) -> None:
    peer = client_w.get_extra_info("peername")[0]
    try:
        up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*target), 5)
    except (OSError, asyncio.TimeoutError):
        client_w.transport.abort()
        return
    a = asyncio.create_task(pump(client_r, up_w, peer))
    b = asyncio.create_task(pump(up_r, client_w, peer))
    await asyncio.gather(a, b, return_exceptions=True)
    for w in (client_w, up_w):
        w.close()


async def watch(control: str) -> None:
    global RULES
    mtime = None
    while True:
        try:
            m = os.stat(control).st_mtime_ns
            if m != mtime:
                mtime = m
                with open(control) as f:
                    RULES = json.load(f).get("rules", {})
        except (OSError, ValueError):
            pass
        await asyncio.sleep(0.1)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--control", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("pairs", nargs="+", help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    a = p.parse_args()
    RNG.seed(a.seed)
    servers = []
    for pair in a.pairs:
        listen, target = pair.split("=")
        lh, lp = listen.rsplit(":", 1)
        th, tp = target.rsplit(":", 1)
        t = (th, int(tp))
        servers.append(
            await asyncio.start_server(lambda r, w, t=t: handle(r, w, t), lh, int(lp), reuse_address=True)
        )
    print("ready", flush=True)
    await watch(a.control)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
