"""A pre-warmed NotebookOS kernel, started by notebookosd (docs/prewarm.md).

Imports ipykernel and the NotebookOS helper ahead of time, prints "ready", then waits
for one line on stdin: the kernel it becomes (JSON: argv, env, cwd, log). The daemon has
moved this process into the kernel's cgroups before it sends that line. End of input
(the daemon shrank the pool, or is gone) ends the process.
"""

import sys

# sys.path[0] is this file's directory (the daemon's kernels directory): no place to
# import from. ipykernel puts the kernel's working directory first once it runs.
del sys.path[0]

import json  # noqa: E402
import os  # noqa: E402


def become(order):
    """Turns this process into the kernel `order` describes (as a new one would start)."""
    log = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(order["env"])
    os.chdir(order["cwd"])
    sys.argv = ["ipykernel_launcher", *order["argv"]]


def main():
    from ipykernel import kernelapp

    try:
        import nbos_kernel  # noqa: F401  (loaded as an extension by the argv below)
    except ImportError:
        pass  # a plain ipykernel, as when started afresh without the helper
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line:
        return
    become(json.loads(line))
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
