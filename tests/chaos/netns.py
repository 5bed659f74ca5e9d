"""N notebookosd hosts, each in its own network namespace, for the fault campaign (issue 16).

Topology (every name starts with `nbc`, so `cleanup.sh` finds what a crashed run left):

    root namespace: bridge nbcbr0 10.77.0.254/24 (the campaign's clients live here)
      |-- veth nbcvN  <->  eth0 in netns nbcN, 10.77.0.N/24

In namespace nbcN the daemon listens on the namespace's loopback (HTTPS 127.0.0.1:8888,
raft 127.0.0.1:7000) and a fault proxy (faultproxy.py) listens on 10.77.0.N with the
same ports and forwards to it: every byte that reaches host N from another host or a
client crosses the bridge (so nftables rules in the namespace can drop it) and the proxy
(so it can be delayed). The seeds, `advertise_url`s and the clients use 10.77.0.N, which
is not a loopback address: the daemons must and do use mutual TLS (a PKI from
`nbos pki`, node certificates with the IP SANs 10.77.0.N and 127.0.0.1).

Each host's `node.state_dir` is a small ext4 image (loop mount) of its own, so one host's
disk can be filled; `runtime_dir` is a plain directory. Kernels run as `kernel.user`
(notebookos-kernel): directories above the runtime directories are 0711.

A host's raft node id starts as N; `replace(n)` gives host N a new node id with an empty
state directory after it left the cluster, and joins it with `nbos cluster join` (a node
id belongs to one state directory for its life, docs/operations.md): its raft traffic
still goes through its fault proxy (`cluster.raft_advertise`).

Faults: `kill` (SIGKILL to the daemon's process group: its kernels die with it; a check
then looks for any process of the kernel account left in the namespace), `restart`,
`freeze`/`thaw` (SIGSTOP/SIGCONT of the group), `partition(groups)` and `one_way(src,
dst)` (nftables table `inet nbchaos` in each namespace), `heal`, `shape` (proxy rules),
`fill_disk`/`free_disk`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# The test kit's config builder (tests/support/python).
sys.path.insert(0, str(REPO / "tests" / "support" / "python"))

from nbos_testkit import write_config  # noqa: E402

SUBNET = "10.77.0"
BRIDGE = "nbcbr0"
RAFT_PORT = 7000
HTTP_PORT = 8888
KERNEL_USER = "notebookos-kernel"


def sh(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def signal_all(pids, sig) -> None:
    """Sends `sig` to each pid; one that is gone already is skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def bin_dir() -> Path:
    """The binaries: $NBOS_BIN_DIR (CI passes the fresh build), else target/debug."""
    env = os.environ.get("NBOS_BIN_DIR")
    return Path(env) if env else REPO / "target" / "debug"


def preflight() -> list[str]:
    """What the machine lacks for the campaign (empty: all there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, nftables, loop mounts)")
    for tool in ("ip", "nft", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            missing.append(tool + (" (apt-get install nftables)" if tool == "nft" else ""))
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        missing.append(f"a free {BRIDGE}: another campaign runs, or a crashed one left it (tests/chaos/cleanup.sh)")
    b = bin_dir()
    for f in ("notebookosd", "nbos", "libfake_cuda.so", "libnbos_cuda_shim.so"):
        if not (b / f).is_file():
            missing.append(f"{b / f} (set NBOS_BIN_DIR)")
    try:
        import pwd

        pwd.getpwnam(KERNEL_USER)
    except KeyError:
        missing.append(f"the account {KERNEL_USER} (scripts/install-deps.sh)")
    return missing


class Host:
    def __init__(self, n: int, root: Path) -> None:
        self.n = n
        self.node_id = n
        self.ns = f"nbc{n}"
        self.ip = f"{SUBNET}.{n}"
        self.dir = root / f"h{n}"
        self.state = self.dir / "state"
        self.run = self.dir / "run"
        self.image = root / f"h{n}.img"
        self.config = self.dir / "notebookosd.toml"
        self.log = self.dir / "daemon.log"
        self.control = self.dir / "proxy.json"
        self.proc: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None
        self.frozen = False
        self.mounted = False

    @property
    def url(self) -> str:
        return f"https://{self.ip}:{HTTP_PORT}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ChaosCluster:
    def __init__(
        self,
        hosts: int = 3,
        fake_gpus: int = 4,
        host_ttl: str = "2s",
        disk_mib: int = 512,
        seed: int = 0,
        python: str | None = None,
    ) -> None:
        missing = preflight()
        if missing:
            raise RuntimeError("the chaos harness needs: " + "; ".join(missing))
        self.bins = bin_dir()
        self.nbos = str(self.bins / "nbos")
        self.python = python or sys.executable
        self.root = Path(tempfile.mkdtemp(prefix="nbos-chaos-"))
        self.root.chmod(0o711)
        self.hosts = [Host(i + 1, self.root) for i in range(hosts)]
        self.next_node_id = hosts + 1
        self.fake_gpus = fake_gpus
        self.host_ttl = host_ttl
        self.disk_mib = disk_mib
        self.seed = seed
        self.partitioned = False
        self.pki = self.root / "pki"
        self.token = secrets.token_hex(24)
        self.operator_token = secrets.token_hex(24)
        try:
            self._network()
            self._files()
            for h in self.hosts:
                self._start_proxy(h)
                self.start(h.n)
            self.wait_ready()
        except BaseException:
            self.destroy()
            raise

    # ---------------------------------------------------------------- set-up

    def _network(self) -> None:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.254/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for h in self.hosts:
            sh("ip", "netns", "add", h.ns)
            sh("ip", "link", "add", f"nbcv{h.n}", "type", "veth", "peer", "name", f"nbcp{h.n}")
            sh("ip", "link", "set", f"nbcp{h.n}", "netns", h.ns)
            sh("ip", "link", "set", f"nbcv{h.n}", "master", BRIDGE)
            sh("ip", "link", "set", f"nbcv{h.n}", "up")
            ex = ("ip", "netns", "exec", h.ns)
            sh(*ex, "ip", "link", "set", f"nbcp{h.n}", "name", "eth0")
            sh(*ex, "ip", "addr", "add", f"{h.ip}/24", "dev", "eth0")
            sh(*ex, "ip", "link", "set", "eth0", "up")
            sh(*ex, "ip", "link", "set", "lo", "up")

    def _pki(self, *args: str) -> None:
        sh(self.nbos, "pki", args[0], "--dir", str(self.pki), *args[1:])

    def _files(self) -> None:
        self._pki("init")
        for h in self.hosts:
            self._pki("issue", "node", str(h.n), "--ip", h.ip, "--ip", "127.0.0.1")
        self.ca = self.pki / "ca.pem"
        self.ssl = ssl.create_default_context(cafile=str(self.ca))
        (self.root / "token").write_text(self.token + "\n")
        (self.root / "operator-token").write_text(self.operator_token + "\n")
        for f in ("token", "operator-token"):
            (self.root / f).chmod(0o600)
        self.objects = self.root / "objects"
        self.objects.mkdir(mode=0o700)
        self.seeds = [f"{h.n}={h.ip}:{RAFT_PORT}" for h in self.hosts]
        for h in self.hosts:
            h.dir.mkdir()
            h.dir.chmod(0o711)
            h.state.mkdir()
            h.run.mkdir()
            # The state directory on a small file system of its own (full-disk fault).
            sh("truncate", "-s", f"{self.disk_mib}M", str(h.image))
            sh("mkfs.ext4", "-q", "-F", "-m", "0", str(h.image))
            sh("mount", "-o", "loop", str(h.image), str(h.state))
            h.mounted = True
            h.state.chmod(0o711)
            h.control.write_text('{"rules": {}}')
            self._config(h)

    def _config(self, h: Host) -> None:
        """Host h's notebookosd.toml for its current node id (a founding seed, or a host that
        joins: it advertises the proxy's address for its raft traffic)."""
        node = self.pki / f"node-{h.node_id}"
        cert, key, ca = f"{node}.pem", f"{node}.key", str(self.ca)
        cluster = {
            "enabled": True,
            "node_id": h.node_id,
            "raft_listen": f"127.0.0.1:{RAFT_PORT}",
            "advertise_url": h.url,
            "seeds": self.seeds,
            "host_ttl": self.host_ttl,
            "object_store": f"file://{self.objects}",
            "tls": {"ca_cert": ca, "cert": cert, "key": key},
        }
        if h.node_id != h.n:
            cluster["raft_advertise"] = f"{h.ip}:{RAFT_PORT}"
        sections = {
            "node": {"name": f"chaos-{h.node_id}", "state_dir": str(h.state), "runtime_dir": str(h.run)},
            "http": {
                "listen": f"127.0.0.1:{HTTP_PORT}",
                "token_file": str(self.root / "token"),
                "operator_token_file": str(self.root / "operator-token"),
                "tls": {"cert": cert, "key": key, "client_ca": ca},
            },
            "kernel": {"python": str(self.python), "prewarm_min": 0, "prewarm_max": 0},
            "gpu": {"driver": "fake", "fake_gpus": self.fake_gpus},
            "observer": {"mode": "procfs"},
            "cluster": cluster,
            "log": {"format": "text"},
        }
        write_config(h.config, h.dir, sections)

    def _start_proxy(self, h: Host) -> None:
        pairs = [f"{h.ip}:{p}=127.0.0.1:{p}" for p in (RAFT_PORT, HTTP_PORT)]
        h.proxy = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, sys.executable, str(HERE / "faultproxy.py"),
             "--control", str(h.control), "--seed", str(self.seed * 100 + h.n), *pairs],
            stdout=subprocess.PIPE, stderr=open(h.dir / "proxy.log", "ab"), start_new_session=True,
        )
        line = h.proxy.stdout.readline()
        if b"ready" not in line:
            raise RuntimeError(f"fault proxy of host {h.n} did not start: {(h.dir / 'proxy.log').read_text()}")

    # ---------------------------------------------------------------- daemons

    def host(self, n: int) -> Host:
        return self.hosts[n - 1]

    def index(self, node_id: int) -> int | None:
        """The host (namespace number) whose daemon is raft node `node_id` now."""
        return next((h.n for h in self.hosts if h.node_id == node_id), None)

    def replace(self, n: int, timeout: float = 120) -> int:
        """Host n, which left the cluster, comes back as a new host: its daemon stopped, an
        empty state directory, a new node id and certificate, started and joined through
        another host (`nbos cluster join`). Returns the new node id."""
        h = self.host(n)
        self.stop(n)
        for entry in h.state.iterdir():
            if entry.name != "lost+found":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        h.node_id = self.next_node_id
        self.next_node_id += 1
        self._pki("issue", "node", str(h.node_id), "--ip", h.ip, "--ip", "127.0.0.1")
        self._config(h)
        self.start(n)
        member = next(o for o in self.hosts if o.n != n and o.alive)
        deadline = time.monotonic() + timeout
        while self.status(n) is None:
            if time.monotonic() > deadline or not h.alive:
                raise RuntimeError(f"host {n} (node {h.node_id}) did not start:\n{self.log_tail(n)}")
            time.sleep(0.3)
        # Secrets through the environment: argv is readable by every local user.
        env = dict(os.environ, NBOS_TOKEN=self.token, NBOS_OPERATOR_TOKEN=self.operator_token)
        r = subprocess.run(
            [self.nbos, "--url", h.url, "--ca-cert", str(self.ca),
             "cluster", "join", member.url, "--timeout", f"{int(timeout)}s"],
            capture_output=True, text=True, timeout=timeout + 30, env=env,
        )
        if r.returncode != 0:
            raise RuntimeError(f"host {n} (node {h.node_id}) could not join: {r.stderr[-1000:]}\n{self.log_tail(n)}")
        return h.node_id

    def start(self, n: int) -> None:
        h = self.host(n)
        assert not h.alive, f"host {n} is running"
        with open(h.log, "ab") as log:
            log.write(f"\n==== chaos: start at {time.time():.3f}\n".encode())
            log.flush()
            # `ip netns exec` execs the daemon: its pid is the daemon's, and its session
            # (process group) holds its kernels.
            h.proc = subprocess.Popen(
                ["ip", "netns", "exec", h.ns, str(self.bins / "notebookosd"), "--config", str(h.config)],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                env={**os.environ, "PATH": f"{Path(self.python).parent}:{os.environ.get('PATH', '')}"},
            )
        h.frozen = False

    def kill(self, n: int) -> list[tuple[int, str]]:
        """kill -9 of the host's daemon and its process group (a daemon crash). Returns the
        kernel account's processes still in the host's namespace 0.3 s later as (pid, start
        time) pairs: the daemon starts each kernel in a process group of its own, and its
        next start must kill what the dead one left (FINDINGS.md #1); `run.py` checks it."""
        h = self.host(n)
        if h.proc is None:
            return []
        try:
            os.killpg(h.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        h.proc.wait()
        h.proc = None
        h.frozen = False
        time.sleep(0.3)
        return [(pid, start) for pid in self.kernel_processes(n) if (start := self.start_time(pid))]

    @staticmethod
    def start_time(pid: int) -> str | None:
        """A running process's start time (/proc/PID/stat field 22; it tells a pid from its
        reuse), None when it is gone or dead (a zombie its new parent has not reaped yet)."""
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None

    def restart(self, n: int) -> list[str]:
        left = self.kill(n)
        self.start(n)
        return left

    def _session(self, n: int) -> list[int]:
        """The daemon's pid and its kernels' (the kernel account's processes in its namespace)."""
        h = self.host(n)
        return ([h.proc.pid] if h.proc else []) + self.kernel_processes(n)

    def freeze(self, n: int) -> None:
        """SIGSTOP of the daemon and its kernels (a frozen host: a VM paused, a long GC)."""
        h = self.host(n)
        if h.alive:
            h.frozen_pids = self._session(n)
            signal_all(h.frozen_pids, signal.SIGSTOP)
            h.frozen = True

    def thaw(self, n: int) -> None:
        h = self.host(n)
        if h.frozen:
            signal_all(getattr(h, "frozen_pids", []), signal.SIGCONT)
        h.frozen = False

    def stop(self, n: int) -> None:
        h = self.host(n)
        if h.proc is None:
            return
        self.thaw(n)
        h.proc.send_signal(signal.SIGTERM)
        try:
            h.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(h.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        h.proc.wait()
        h.proc = None

    # ---------------------------------------------------------------- network faults

    def _nft(self, h: Host, script: str) -> None:
        sh("ip", "netns", "exec", h.ns, "nft", "-f", "-", input=script)

    def _drop(self, h: Host, inbound: list[str], outbound: list[str]) -> None:
        """Replaces host h's rules: drop packets from `inbound` and to `outbound` addresses."""
        rules = ["table inet nbchaos {",
                 "  chain input { type filter hook input priority -10; policy accept;"]
        rules += [f"    ip saddr {a} drop" for a in inbound]
        rules += ["  }", "  chain output { type filter hook output priority -10; policy accept;"]
        rules += [f"    ip daddr {a} drop" for a in outbound]
        rules += ["  }", "}"]
        sh("ip", "netns", "exec", h.ns, "nft", "delete", "table", "inet", "nbchaos", check=False)
        self._nft(h, "\n".join(rules) + "\n")

    def partition(self, groups: list[list[int]]) -> None:
        """Hosts in different groups cannot reach each other (both ways); a host in no
        group is a group of its own (cut off from all). The campaign's clients
        (10.77.0.254) still reach every host."""
        side = {n: i for i, g in enumerate(groups) for n in g}
        for h in self.hosts:
            mine = side.get(h.n, ("alone", h.n))
            others = [o.ip for o in self.hosts if o.n != h.n and side.get(o.n, ("alone", o.n)) != mine]
            self._drop(h, others, others)
        self.partitioned = True

    def one_way(self, src: int, dst: list[int]) -> None:
        """Packets from host `src` to the hosts `dst` are lost; the other way works."""
        ips = [self.host(d).ip for d in dst]
        self._drop(self.host(src), [], ips)
        self.partitioned = True

    def heal_network(self) -> None:
        for h in self.hosts:
            sh("ip", "netns", "exec", h.ns, "nft", "delete", "table", "inet", "nbchaos", check=False)
        self.partitioned = False

    def shape(self, n: int, rules: dict) -> None:
        """Proxy rules of host n's ingress: {source ip or "*": {delay_ms, jitter_ms, loss, reset}}."""
        h = self.host(n)
        tmp = h.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rules": rules}))
        tmp.replace(h.control)

    def unshape(self) -> None:
        for h in self.hosts:
            self.shape(h.n, {})

    # ---------------------------------------------------------------- disk

    def fill_disk(self, n: int) -> int:
        """Fills host n's state file system; returns the bytes written."""
        f = self.host(n).state / "chaos-fill"
        written = 0
        chunk = b"\0" * (1 << 20)
        with open(f, "ab") as out:
            try:
                while True:
                    out.write(chunk)
                    out.flush()
                    written += len(chunk)
            except OSError:
                pass
        # The last partial blocks too.
        try:
            with open(f, "ab") as out:
                while True:
                    out.write(b"\0" * 4096)
                    out.flush()
        except OSError:
            pass
        return written

    def free_disk(self, n: int) -> None:
        (self.host(n).state / "chaos-fill").unlink(missing_ok=True)

    # ---------------------------------------------------------------- API

    def request(self, n: int, path: str, method: str = "GET", body=None, timeout: float = 10, operator=False):
        """JSON from host n's API (None on any error)."""
        data = json.dumps(body).encode() if body is not None else None
        tok = self.operator_token if operator else self.token
        req = urllib.request.Request(
            self.host(n).url + path, data=data, method=method,
            headers={"Authorization": f"token {tok}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ssl) as r:
                raw = r.read()
                return json.loads(raw) if raw else {}
        except (OSError, ValueError):
            return None

    def metrics(self, n: int) -> str:
        req = urllib.request.Request(self.host(n).url + "/metrics")
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ssl) as r:
                return r.read().decode()
        except OSError:
            return ""

    def status(self, n: int):
        return self.request(n, "/api/v1/cluster/status", timeout=5)

    def wait_ready(self, timeout: float = 120, hosts: list[int] | None = None) -> None:
        """Every running host (or `hosts`) is ready and sees every one of them up."""
        want = hosts or [h.n for h in self.hosts if h.alive]
        deadline = time.monotonic() + timeout
        while True:
            ok = True
            for n in want:
                if not self.host(n).alive:
                    raise RuntimeError(f"host {n} exited:\n{self.log_tail(n)}")
                s = self.status(n)
                if not s or not s.get("ready"):
                    ok = False
                    break
                up = {m["node_id"] for m in s.get("members", []) if m.get("up")}
                if not {self.host(w).node_id for w in want} <= up:
                    ok = False
                    break
            if ok:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ready after {timeout}s\n" + self.logs())
            time.sleep(0.5)

    # ---------------------------------------------------------------- checks

    def kernel_processes(self, n: int) -> list[int]:
        """Pids of the kernel account's processes in host n's network namespace."""
        import pwd

        uid = pwd.getpwnam(KERNEL_USER).pw_uid
        try:
            ns_ino = os.stat(f"/run/netns/{self.host(n).ns}").st_ino
        except OSError:
            return []
        pids = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                if os.stat(f"/proc/{p}").st_uid != uid:
                    continue
                if os.stat(f"/proc/{p}/ns/net").st_ino != ns_ino:
                    continue
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            pids.append(int(p))
        return pids

    @staticmethod
    def describe(pids: list[int]) -> list[str]:
        """pid, ppid, pgid, sid and command line of each pid (for an anomaly's text)."""
        out = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    st = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
                out.append(f"pid {pid} state {st[0]} ppid {st[1]} pgid {st[2]} sid {st[3]}: {cmd}")
            except OSError:
                out.append(f"pid {pid} (gone)")
        return out

    def log_tail(self, n: int, chars: int = 3000) -> str:
        try:
            return self.host(n).log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def logs(self, chars: int = 3000) -> str:
        return "\n".join(f"--- host {h.n} ---\n{self.log_tail(h.n, chars)}" for h in self.hosts)

    # ---------------------------------------------------------------- teardown

    def destroy(self, keep: bool = False) -> None:
        """Stops everything and removes namespaces, bridge, mounts; keeps the directory
        (logs) when `keep`."""
        for h in self.hosts:
            try:
                if h.proc is not None:
                    self.thaw(h.n)
                    os.killpg(h.proc.pid, signal.SIGKILL)
                    h.proc.wait()
                    h.proc = None
            except (ProcessLookupError, OSError):
                h.proc = None
            if h.proxy is not None:
                try:
                    os.killpg(h.proxy.pid, signal.SIGKILL)
                    h.proxy.wait()
                except (ProcessLookupError, OSError):
                    pass
                h.proxy = None
        # Anything else still in a namespace (a kernel that escaped its group).
        for h in self.hosts:
            r = sh("ip", "netns", "pids", h.ns, check=False)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.2)
        for h in self.hosts:
            sh("ip", "netns", "del", h.ns, check=False)
            sh("ip", "link", "del", f"nbcv{h.n}", check=False)
            if h.mounted:
                for _ in range(10):
                    if sh("umount", str(h.state), check=False).returncode == 0:
                        break
                    time.sleep(0.3)
                else:
                    sh("umount", "-l", str(h.state), check=False)
                h.mounted = False
            h.image.unlink(missing_ok=True)
        sh("ip", "link", "del", BRIDGE, check=False)
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
