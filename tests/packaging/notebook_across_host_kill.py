"""A notebook through the packaged `notebookos` kernelspec, run by a user with nbclient (Debian's
python3-nbclient), while the harness kills the host it started on (tests/packaging/walkthrough.sh).

Cell 1 runs, then this writes `cell1-done` in DIR and waits for `host-killed` there; the next
cells must see cell 1's state. Prints one line per cell's output; exits 1 on any failure.
"""

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

marks = Path(sys.argv[1])
nb = nbformat.v4.new_notebook()
nb.cells = [
    nbformat.v4.new_code_cell("import socket\nx = 41\nprint('cell1', x)"),
    nbformat.v4.new_code_cell("x += 1\nprint('cell2', x)"),
    nbformat.v4.new_code_cell("print('cell3', x * 2)"),
]
client = NotebookClient(nb, kernel_name="notebookos", timeout=180, startup_timeout=180)
with client.setup_kernel():
    client.execute_cell(nb.cells[0], 0)
    (marks / "cell1-done").touch()
    deadline = time.monotonic() + 120
    while not (marks / "host-killed").exists():
        if time.monotonic() > deadline:
            sys.exit("the harness did not kill the host within 120 s")
        time.sleep(0.2)
    for i in (1, 2):
        client.execute_cell(nb.cells[i], i)
for cell in nb.cells:
    for out in cell.outputs:
        if out.get("output_type") == "stream":
            print(out["text"].strip())
