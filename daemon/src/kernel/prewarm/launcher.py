"""A pre-warmed NotebookOS kernel, started by notebookosd (docs/prewarm.md).

Imports ipykernel and the NotebookOS helper ahead of time, prints "ready", then reads
lines on stdin: "ping" is answered "pong" (the daemon's check that this process still runs
before it hands it a kernel); any other line is the kernel it becomes (JSON: argv, env,
cwd, log, and under kernel.run_as = "owner" the account to switch to), answered "up"
once ipykernel has opened its ports. Stdin and stdout are one socket to the daemon. The daemon has moved this process into the kernel's cgroups before
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


_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _status_fields():
    with open("/proc/self/status") as f:
        return {k: v.split() for k, v in (line.split(":", 1) for line in f if ":" in line)}


def switch(account):
    """Becomes the kernel's owner (kernel.run_as = "owner") and drops every capability,
    before anything of the kernel's is opened or run; exits non-zero unless /proc says it
    worked (the daemon then kills this process and starts the kernel afresh)."""
    uid, gid, groups = int(account["uid"]), int(account["gid"]), [int(g) for g in account["groups"]]
    if uid == 0 or gid == 0 or 0 in groups:
        os._exit(70)
    # capset and the ambient set are per thread: with one thread, all of the process.
    if len(os.listdir("/proc/self/task")) != 1:
        os._exit(74)
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        os._exit(71)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        os._exit(72)
    status = _status_fields()
    caps_zero = all(int(status[k][0], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapAmb"))
    ids_are = status["Uid"] == [str(uid)] * 4 and status["Gid"] == [str(gid)] * 4
    if not (caps_zero and ids_are and sorted(int(g) for g in status["Groups"]) == sorted(set(groups))):
        os._exit(73)


def become(order):
    """Turns this process into the kernel `order` describes (as a new one would start)."""
    if "switch" in order:
        switch(order["switch"])
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
