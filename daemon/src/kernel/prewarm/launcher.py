"""A pre-warmed NotebookOS kernel, started by notebookosd (docs/prewarm.md).

Imports ipykernel and the NotebookOS helper ahead of time, prints "ready", then reads
lines on stdin: "ping" is answered "pong" (the daemon's check that this process still runs
before it hands it a kernel); any other line is the kernel it becomes (JSON: argv, env,
cwd, log), answered "up" once ipykernel has opened its ports. Stdin and stdout are one
socket to the daemon. The daemon has moved this process into the kernel's cgroups before
it sends the kernel. End of input (the daemon shrank the pool, or is gone) ends the process.
"""

import ctypes
import sys

# Not dumpable until it is a kernel: other processes of the kernels' account can then
# neither trace this one nor open its files through /proc.
_PR_SET_DUMPABLE = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)

# sys.path[0] is this file's directory (the daemon's kernels directory): no place to
# import from. ipykernel puts the kernel's working directory first once it runs.
del sys.path[0]

import json  # noqa: E402
import os  # noqa: E402
import site  # noqa: E402


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
    # The user site of the kernel's HOME, as a new Python would have added it (started
    # with -s, this one skipped the pool's).
    site.USER_BASE = None
    site.USER_SITE = None
    user_site = site.getusersitepackages()
    if os.path.isdir(user_site):
        site.addsitedir(user_site)
    sys.argv = ["ipykernel_launcher", *order["argv"]]
    _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


def main():
    from ipykernel import kernelapp

    try:
        import nbos_kernel  # noqa: F401  (loaded as an extension by the argv below)
    except ImportError:
        pass  # a plain ipykernel, as when started afresh without the helper
    print("ready", flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        if line == "ping\n":
            print("pong", flush=True)
            continue
        break
    # The daemon's socket, kept past become() only to say "up": closed before any kernel
    # code runs.
    control = os.dup(1)
    become(json.loads(line))
    # What kernelapp.launch_new_instance() does, with the "up" between its two halves.
    app = kernelapp.IPKernelApp.instance()
    app.initialize()
    os.write(control, b"up\n")
    os.close(control)
    app.start()


if __name__ == "__main__":
    main()
