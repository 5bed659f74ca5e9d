"""A 1-GPU notebook through the packaged `notebookos-1gpu` kernelspec with nbclient, on the
walk-through's machine without a GPU (tests/packaging/walkthrough.sh). Prints the cell's
answer and how many GPUs the host has (`nbos status --json`): "42 2"."""

import json
import subprocess

import nbformat
from nbclient import NotebookClient

nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell("print(6 * 7)")]
NotebookClient(nb, kernel_name="notebookos-1gpu", timeout=120, startup_timeout=120).execute()
answer = "".join(o.get("text", "") for o in nb.cells[0].outputs).strip()
status = json.loads(subprocess.run(["nbos", "status", "--json"], check=True, capture_output=True, text=True).stdout)
print(answer, len(status["inventory"]["gpus"]))
