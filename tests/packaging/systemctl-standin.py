#!/usr/bin/python3
"""`systemctl` and `journalctl` for the walk-through's Debian roots, where no systemd runs
(tests/packaging/walkthrough.sh installs this file under both names).

Not a service manager: it reads a unit (its file and drop-ins), runs `ExecStartPre=` and
starts `ExecStart=` in a session of its own as the unit's `User=`, with its
`EnvironmentFile=` and `Environment=`, logging to /var/log/UNIT.log; like systemctl, `start`
of a `Type=notify` unit returns once the service said READY=1 on its NOTIFY_SOCKET (or
failed), of any other type at once. It stops a unit with SIGTERM to that session. The sandboxing settings are not
applied (daemon/tests/systemd_unit.rs tests those). systemctl: start, stop, restart, reload
(a restart), enable/disable [--now], daemon-reload, is-active; journalctl: -u UNIT (the log
file). Anything else fails loudly.
"""

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

UNIT_DIRS = [Path("/etc/systemd/system"), Path("/lib/systemd/system"), Path("/usr/lib/systemd/system")]
STATE = Path("/run/systemctl-standin")


def die(msg: str) -> None:
    print(f"systemctl (stand-in): {msg}", file=sys.stderr)
    sys.exit(1)


def unit_name(arg: str) -> str:
    return arg if "." in arg else f"{arg}.service"


def service_section(name: str) -> dict[str, list[str]]:
    """`[Service]` keys of the unit and its drop-ins, in systemd's order (later ones append)."""
    files = [d / name for d in UNIT_DIRS if (d / name).is_file()][:1]
    if not files:
        die(f"unit {name} not found")
    for d in UNIT_DIRS:
        dropins = d / f"{name}.d"
        if dropins.is_dir():
            files += sorted(dropins.glob("*.conf"))
    keys: dict[str, list[str]] = {}
    for f in files:
        section = None
        for line in f.read_text().splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            if section == "[Service]" and "=" in line:
                k, v = line.split("=", 1)
                keys.setdefault(k.strip(), []).append(v.strip())
    return keys


def environment(keys: dict[str, list[str]]) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    for f in keys.get("EnvironmentFile", []):
        optional = f.startswith("-")
        path = Path(f.lstrip("-"))
        if not path.is_file():
            if optional:
                continue
            die(f"EnvironmentFile {path} is missing")
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k.strip()] = " ".join(shlex.split(v))
    for e in keys.get("Environment", []):
        for pair in shlex.split(e):
            k, v = pair.split("=", 1)
            env[k] = v
    return env


def command(line: str, env: dict[str, str]) -> list[str]:
    line = line.lstrip("-@+!:")
    argv = []
    for word in shlex.split(line):
        # systemd's `$VAR` splits the value into words; `${VAR}` keeps it one.
        if word.startswith("$") and not word.startswith("${"):
            argv += env.get(word[1:], "").split()
        else:
            argv.append(os.path.expandvars(word) if word.startswith("${") else word)
    return argv


def as_user(argv: list[str], keys: dict[str, list[str]]) -> list[str]:
    user = keys.get("User", [""])[-1]
    return ["runuser", "-u", user, "--", *argv] if user and user != "root" else argv


def alive(pid: int) -> bool:
    """Running: a zombie (exited, its parent, not us, yet to reap it) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pid_of(name: str) -> int | None:
    try:
        pid = int((STATE / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def start(name: str) -> None:
    if pid_of(name):
        return
    keys = service_section(name)
    env = environment(keys)
    for pre in keys.get("ExecStartPre", []):
        r = subprocess.run(as_user(command(pre, env), keys), env=env)
        if r.returncode != 0 and not pre.startswith("-"):
            die(f"{name}: ExecStartPre {pre!r} exited {r.returncode}")
    exec_start = keys.get("ExecStart")
    if not exec_start:
        die(f"{name} has no ExecStart")
    STATE.mkdir(parents=True, exist_ok=True)
    notify = None
    if keys.get("Type", [""])[-1] == "notify":
        path = STATE / f"{name}.notify"
        path.unlink(missing_ok=True)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(path))
        notify.settimeout(0.2)
        env["NOTIFY_SOCKET"] = str(path)
    log_file = f"/var/log/{name.removesuffix('.service')}.log"
    log = open(log_file, "ab")
    p = subprocess.Popen(as_user(command(exec_start[-1], env), keys), env=env, stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True, cwd="/")
    (STATE / f"{name}.pid").write_text(str(p.pid))
    deadline = time.monotonic() + 90
    while notify is not None:
        if p.poll() is not None:
            break
        if time.monotonic() > deadline:
            die(f"{name} did not say READY=1 within 90 s ({log_file})")
        try:
            if b"READY=1" in notify.recv(4096).split(b"\n"):
                break
        except socket.timeout:
            pass
    if p.poll() is not None:
        die(f"{name}: {exec_start[-1]!r} exited {p.returncode} ({log_file})")


def stop(name: str) -> None:
    pid = pid_of(name)
    if not pid:
        return
    os.killpg(pid, signal.SIGTERM)
    for _ in range(300):
        if not alive(pid):
            break
        time.sleep(0.1)
    else:
        die(f"{name} did not stop within 30 s of SIGTERM")
    (STATE / f"{name}.pid").unlink(missing_ok=True)


def main(args: list[str]) -> None:
    now = "--now" in args
    args = [a for a in args if not a.startswith("-")]
    if not args:
        die("no command")
    cmd, units = args[0], [unit_name(u) for u in args[1:]]
    if cmd == "daemon-reload":
        return
    for u in units:
        if cmd == "start" or (cmd == "enable" and now):
            start(u)
        elif cmd == "stop" or (cmd == "disable" and now):
            stop(u)
        elif cmd in ("restart", "reload"):
            stop(u)
            start(u)
        elif cmd in ("enable", "disable"):
            pass
        elif cmd == "is-active":
            if not pid_of(u):
                print("inactive")
                sys.exit(3)
            print("active")
        else:
            die(f"{cmd} is not handled")


def journalctl(args: list[str]) -> None:
    if "-u" not in args or args.index("-u") + 1 >= len(args):
        die("journalctl: only -u UNIT is handled")
    name = unit_name(args[args.index("-u") + 1])
    sys.stdout.write(Path(f"/var/log/{name.removesuffix('.service')}.log").read_text(errors="replace"))


if __name__ == "__main__":
    if Path(sys.argv[0]).name == "journalctl":
        journalctl(sys.argv[1:])
    else:
        main(sys.argv[1:])
