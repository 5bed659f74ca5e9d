"""The one `run_cell`: executes code on a kernel and collects what the cell produced,
until both its execute_reply and its `idle` status arrived (shell and iopub have no
order). The kernel is reached through a jupyter_client KernelClient (`kc.execute`, shell
and iopub channels) or a connected channels WebSocket of the gateway (websocket-client,
JSON messages)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field


@dataclass
class Cell:
    """What one cell produced."""

    reply: dict
    """The execute_reply's content (`status`, `execution_count`, …)."""
    metadata: dict
    """The execute_reply's metadata (`nbos_election`, …)."""
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    """The execute_result's text/plain."""
    errors: list[str] = field(default_factory=list)
    """Each error message as `ename: evalue`."""
    states: list[str] = field(default_factory=list)
    """Every IOPub status read meanwhile, of any parent (WebSocket only)."""

    @property
    def status(self) -> str:
        return self.reply.get("status", "")

    @property
    def host(self) -> int | None:
        """The node id of the host that executed it (NotebookOS' election stamp)."""
        return self.metadata.get("nbos_election", {}).get("node_id")


def run_cell(client, code: str, timeout: float = 120) -> Cell:
    """Executes `code` through `client` (a KernelClient, or a channels WebSocket); fails
    when the cell does not end within `timeout` s (KernelClient: per message)."""
    if not hasattr(client, "execute"):
        return _run_cell_ws(client, code, timeout)
    kc = client
    msg_id = kc.execute(code)
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        # Late replies of earlier requests (kernel_info of wait_for_ready's retries).
        reply = kc.get_shell_msg(timeout=timeout)
    out, err, errors, result = [], [], [], None
    while True:
        m = kc.get_iopub_msg(timeout=timeout)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        content = m["content"]
        if m["msg_type"] == "stream":
            (out if content["name"] == "stdout" else err).append(content["text"])
        elif m["msg_type"] == "execute_result":
            result = content["data"].get("text/plain")
        elif m["msg_type"] == "error":
            errors.append(f"{content['ename']}: {content['evalue']}")
        elif m["msg_type"] == "status" and content["execution_state"] == "idle":
            break
    return Cell(reply["content"], reply["metadata"], "".join(out), "".join(err), result, errors)


def _run_cell_ws(ws, code: str, timeout: float) -> Cell:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "session": "t", "username": "t", "version": "5.3"}
    content = {"code": code, "silent": False}
    ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}))
    cell = Cell({}, {})
    replied = idle = False
    deadline = time.monotonic() + timeout
    while not (replied and idle):
        assert time.monotonic() < deadline, f"no execute_reply and idle status in {timeout} s: {cell}"
        m = json.loads(ws.recv())
        content = m["content"]
        if m["msg_type"] == "status":
            cell.states.append(content["execution_state"])
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            if content["name"] == "stdout":
                cell.stdout += content["text"]
            else:
                cell.stderr += content["text"]
        elif m["msg_type"] == "execute_result":
            cell.result = content["data"].get("text/plain")
        elif m["msg_type"] == "error":
            cell.errors.append(f"{content['ename']}: {content['evalue']}")
        elif m["msg_type"] == "execute_reply":
            cell.reply, cell.metadata, replied = content, m.get("metadata", {}), True
        elif m["msg_type"] == "status" and content["execution_state"] == "idle":
            idle = True
    return cell
