"""The campaign's workload: replicated kernels running cells with known effects, through
the Kernel Gateway API (HTTPS) and the channels WebSocket of any host, with a history of
every request and reply, and the checks of a round.

Cell kinds (every cell appends its id to `log`, in the same cell as its effect):
  add    counter += K                       (K recorded per id)
  big    big = <2 MiB of bytes from random.Random(seed)>; big_id = id   (> 1 MiB: object store)
  fn     def f_<n>(x): return x + K         (the function is called by the check)
  mod    import colorsys as m_<n>
  append only the log append

A cell is *acknowledged* when its `execute_reply` says `ok`. Anything else (error reply,
timeout, lost socket) leaves it *unknown*: it may have run, at most once.
"""

from __future__ import annotations

import hashlib
import json
import random
import ssl
import threading
import time
import uuid

import websocket

BIG_BYTES = 2 << 20


def big_sha(seed: int) -> str:
    return hashlib.sha256(random.Random(seed).randbytes(BIG_BYTES)).hexdigest()


INIT = "log = []\ncounter = 0\nbig = b''\nbig_id = None\n"

# After an anomaly the kernel starts a new epoch from a clean slate, so that later rounds
# check their own cells instead of reporting the same damage again.
RESET = (
    "for _k in [k for k in list(globals()) if k.startswith(('f_', 'm_'))]:\n"
    "    del globals()[_k]\n"
    "del _k\n" + INIT
)

CHECK = (
    "print(__import__('json').dumps({'log': log, 'counter': counter, "
    "'big_id': big_id, 'big_sha': __import__('hashlib').sha256(big).hexdigest(), "
    "'fns': {k: globals()[k](1) for k in sorted(globals()) if k.startswith('f_')}, "
    "'mods': sorted(k for k in globals() if k.startswith('m_'))}))"
)


class Cell:
    def __init__(self, cid: str, kind: str, code: str, arg: int) -> None:
        self.id = cid
        self.kind = kind
        self.code = code
        self.arg = arg
        self.sent = None
        self.replied = None
        self.status = "unsent"  # ok | error | timeout | lost | unsent
        self.host = None
        self.executor = None
        self.detail = ""
        self.msg_id = None
        self.epoch = 0
        self.election = None  # the reply's metadata.nbos_election
        self.warning = ""     # a "[NotebookOS] ..." line the daemon put on the cell's stderr

    def record(self) -> dict:
        return {k: getattr(self, k) for k in ("id", "kind", "arg", "sent", "replied", "status", "host", "executor", "detail", "msg_id", "epoch", "election", "warning")}


def make_cell(kernel_no: int, n: int, rng: random.Random) -> Cell:
    cid = f"k{kernel_no}c{n}"
    kind = rng.choice(["add", "add", "append", "big", "fn", "mod"])
    arg = rng.randint(1, 1000)
    if kind == "add":
        body = f"counter += {arg}"
    elif kind == "big":
        body = f"big = __import__('random').Random({arg}).randbytes({BIG_BYTES})\nbig_id = {cid!r}"
    elif kind == "fn":
        body = f"def f_{cid}(x):\n    return x + {arg}"
    elif kind == "mod":
        body = f"import colorsys as m_{cid}"
    else:
        body = "pass"
    return Cell(cid, kind, f"{body}\nlog.append({cid!r})", arg)


class KernelClient:
    """One kernel and its client: a WebSocket to one gateway at a time; on any failure it
    moves on to the next host's gateway."""

    def __init__(self, cluster, kernel_id: str, kernel_no: int, seed: int, gateway: int = 1, sticky: bool = False) -> None:
        self.c = cluster
        # sticky: stay on one gateway through timeouts and error replies; move only when
        # the socket itself fails (so no two front-ends ever hold cells of this client).
        self.sticky = sticky
        self.kernel_id = kernel_id
        self.no = kernel_no
        self.rng = random.Random(seed * 1000 + kernel_no)
        self.gateway = gateway
        self.ws = None
        self.session = uuid.uuid4().hex
        self.cells: list[Cell] = []
        self.events: list[dict] = []
        self.n = 0
        self.epoch = 0  # bumped when the kernel's namespace was legitimately reset
        self.lock = threading.Lock()

    def event(self, what: str, **kw) -> None:
        self.events.append({"t": time.time(), "what": what, **kw})

    def connect(self, timeout: float = 10) -> None:
        self.close()
        h = self.c.host(self.gateway)
        url = f"wss://{h.ip}:8888/api/kernels/{self.kernel_id}/channels?session_id={self.session}"
        self.ws = websocket.create_connection(
            url, timeout=timeout, header=[f"Authorization: token {self.c.token}"],
            sslopt={"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": str(self.c.ca)},
        )
        self.event("connect", gateway=self.gateway)

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close(timeout=1)
            except Exception:
                pass
            self.ws = None

    def rotate(self) -> None:
        self.close()
        self.gateway = self.gateway % len(self.c.hosts) + 1

    def _msg(self, code: str, silent: bool = False) -> dict:
        return {
            "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "session": self.session,
                       "username": "chaos", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": silent, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": False},
        }

    def execute(self, code: str, timeout: float, cell: Cell | None = None) -> tuple[str, dict, str, str]:
        """Runs code once on the current socket: (status, reply metadata, stdout, detail).
        Raises OSError/WebSocketException when the socket fails."""
        if self.ws is None:
            self.connect()
        msg = self._msg(code)
        mid = msg["header"]["msg_id"]
        if cell is not None:
            cell.msg_id = mid
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        reply, out, idle = None, [], False
        while not (reply and idle):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply")
            self.ws.settimeout(min(left, 5))
            try:
                raw = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            if not raw:
                raise ConnectionError("socket closed")
            m = json.loads(raw)
            if m.get("parent_header", {}).get("msg_id") != mid:
                continue
            t = m.get("msg_type") or m.get("header", {}).get("msg_type")
            if t == "execute_reply":
                reply = m
            elif t == "stream" and m["content"].get("name") == "stdout":
                out.append(m["content"]["text"])
            elif t == "stream" and "[NotebookOS]" in m["content"].get("text", "") and cell is not None:
                cell.warning += m["content"]["text"][:500]
            elif t == "status" and m["content"].get("execution_state") == "idle":
                idle = True
        c = reply["content"]
        detail = "" if c.get("status") == "ok" else f"{c.get('ename')}: {c.get('evalue')}"
        return c.get("status", "?"), reply.get("metadata", {}), "".join(out), detail

    def run_cell(self, timeout: float = 30) -> Cell:
        """The next workload cell, sent once (never resent: a resend could run it twice)."""
        self.n += 1
        cell = make_cell(self.no, self.n, self.rng)
        cell.epoch = self.epoch
        with self.lock:
            self.cells.append(cell)
        try:
            if self.ws is None:
                self.connect()
        except Exception as e:
            cell.status, cell.detail = "unsent", f"connect: {e}"
            self.rotate()
            return cell
        cell.sent, cell.host = time.time(), self.gateway
        try:
            status, meta, _, detail = self.execute(cell.code, timeout, cell)
            cell.replied = time.time()
            cell.status = "ok" if status == "ok" else "error"
            cell.detail = detail
            cell.election = meta.get("nbos_election")
            cell.executor = (cell.election or {}).get("node_id")
            if status != "ok" and not self.sticky:
                # A failed cell may mean this gateway lost its way; try another next time.
                self.rotate()
        except TimeoutError:
            cell.status = "timeout"
            if not self.sticky:
                self.rotate()
        except Exception as e:
            cell.status, cell.detail = "lost", f"{type(e).__name__}: {e}"
            self.rotate()
        return cell

    def run_code(self, code: str, timeout: float = 60, tries: int = 0) -> tuple[str, str, str]:
        """Runs an idempotent cell (init, check), moving across gateways until it answers
        or `timeout` passes: (status, stdout, detail)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                status, _, out, detail = self.execute(code, min(30, max(1, deadline - time.monotonic())))
                if status == "ok":
                    return status, out, detail
                last = detail
            except Exception as e:
                last = f"{type(e).__name__}: {e}"
            self.rotate()
            time.sleep(0.5)
        return "failed", "", last


def check_kernel(client: KernelClient, state: dict, digests: dict[int, str | None], elections) -> list[str]:
    """Anomalies of one kernel from its check cell's output, its replicas' digests and its
    election records."""
    bad = []
    k = f"kernel {client.no} ({client.kernel_id[:8]})"
    log = state["log"]
    cells = {c.id: c for c in client.cells if c.epoch == client.epoch}
    acked = [c.id for c in client.cells if c.status == "ok" and c.epoch == client.epoch]
    seen: dict[str, int] = {}
    for cid in log:
        seen[cid] = seen.get(cid, 0) + 1
    for cid, n in seen.items():
        if cid not in cells:
            bad.append(f"{k}: log holds {cid}, a cell never sent")
        elif n > 1:
            bad.append(f"{k}: cell {cid} ({cells[cid].status}) ran {n} times")
    wrong = [cid for cid in acked if seen.get(cid, 0) != 1]
    if wrong:
        c = cells[wrong[0]]
        why = f"; first: executor {c.executor}, reply nbos_election {c.election}"
        if c.warning:
            why += f", daemon warning {c.warning.strip()!r}"
        counts = ", ".join(f"{cid}x{seen.get(cid, 0)}" for cid in wrong[:12])
        bad.append(f"{k}: {len(wrong)} acknowledged cell(s) not exactly once in the namespace: {counts}"
                   f"{' ...' if len(wrong) > 12 else ''}{why}")
    for c in cells.values():
        if c.status == "unsent" and c.id in seen:
            bad.append(f"{k}: cell {c.id} was never sent but ran")
    order = [cid for cid in log if cid in set(acked)]
    if order != [cid for cid in acked if cid in seen]:
        bad.append(f"{k}: acknowledged cells out of order: namespace {order} vs acks {acked}")
    # Effects of every cell that ran (acknowledged or not), exactly once.
    ran = [cells[cid] for cid in log if cid in cells]
    want_counter = sum(c.arg for c in ran if c.kind == "add")
    if state["counter"] != want_counter:
        bad.append(f"{k}: counter is {state['counter'] - want_counter:+d} off the sum of the add cells in the log")
    bigs = [c for c in ran if c.kind == "big"]
    if bigs:
        last = bigs[-1]
        if state["big_id"] != last.id or state["big_sha"] != big_sha(last.arg):
            bad.append(f"{k}: big holds {state['big_id']} sha {state['big_sha'][:12]}, want {last.id} {big_sha(last.arg)[:12]}")
    want_fns = {f"f_{c.id}": 1 + c.arg for c in ran if c.kind == "fn"}
    if state["fns"] != want_fns:
        bad.append(f"{k}: functions {state['fns']} != {want_fns}")
    want_mods = sorted(f"m_{c.id}" for c in ran if c.kind == "mod")
    if state["mods"] != want_mods:
        bad.append(f"{k}: modules {state['mods']} != {want_mods}")
    live = {n: d for n, d in digests.items() if d is not None}
    if len(set(live.values())) > 1:
        bad.append(f"{k}: replicas' namespace digests differ: {live}")
    if elections is not None:
        # The kernel group keeps the election records of its last 256 synchronised cells
        # (state_sync `elect_history`): a missing record is checked for recent cells only.
        records = {row["cell"]: row.get("record", {}) for row in elections.get("cells", [])}
        current = [c for c in client.cells if c.status == "ok" and c.epoch == client.epoch and c.msg_id]
        recent = {c.id for c in current[-20:]}
        for c in current:
            rec = records.get(c.msg_id)
            if rec is None:
                if c.id in recent:
                    bad.append(f"{k}: acknowledged cell {c.id} has no election record")
            elif rec.get("winner") is None or rec.get("node_id") != c.executor:
                bad.append(f"{k}: cell {c.id} ran on host {c.executor} but its election record says {rec}")
    return bad
