"""The one `run_cell`: executes code on a kernel through a jupyter_client KernelClient
(`kc.execute`, shell and iopub channels) and collects what the cell produced, until both
its execute_reply and its `idle` status arrived (shell and iopub have no order)."""

from __future__ import annotations

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

    @property
    def status(self) -> str:
        return self.reply.get("status", "")

    @property
    def host(self) -> int | None:
        """The node id of the host that executed it (NotebookOS' election stamp)."""
        return self.metadata.get("nbos_election", {}).get("node_id")


def run_cell(kc, code: str, timeout: float = 120) -> Cell:
    """Executes `code` on `kc`; raises queue.Empty when a message does not come in `timeout` s."""
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
