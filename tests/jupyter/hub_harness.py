"""A real JupyterHub (PyPI's, with configurable-http-proxy from npm) whose users' single-user
servers use notebookosd as their kernel gateway, with the lines of docs/users-jupyterhub-setup.md:
what a team running JupyterHub deploys.

Everything listens on 127.0.0.1; the Hub's state (database, cookie secret, the users' homes)
is in a temp dir. Users `nbos-alice` and `nbos-bob` (and `nbos-admin`, in the daemon's
admin group) log in with a shared password (SharedPasswordAuthenticator); the tests get their
API tokens and start their servers through the Hub's REST API with an admin service token of
their own. Servers are started by `SimpleLocalProcessSpawner` (as the Hub's account): who a
kernel runs as is the daemon's decision (`[kernel] run_as = "owner"`), not the spawner's.

Order: `Hub()` picks its ports and writes the daemon's service token file; the daemon (or
cluster) starts with `hub.daemon_sections()`; then `hub.start(gateway_url)`.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

from nbos_harness import free_port
from nbos_testkit import wait_for

REPO = Path(__file__).resolve().parents[2]
SETUP_DOC = REPO / "docs" / "users-jupyterhub-setup.md"
PROXY = Path(os.environ.get("NBOS_HUB_PROXY") or REPO / ".nbos" / "hub-npm" / "node_modules" / ".bin" / "configurable-http-proxy")
ALICE, BOB, ADMIN = "nbos-alice", "nbos-bob", "nbos-admin"
PASSWORD = "nbos-hub-test-password"
# Where the test accounts' homes are (they outlive a test run: created once, reused).
HOMES = Path("/var/lib/nbos-test-users")
# kernel.owner_uid_min's default: the test accounts must be regular accounts above it.
UID_MIN = 1000


def setup_blocks() -> tuple[dict, str]:
    """The daemon's TOML (as sections) and the Hub's Python lines of the setup page."""
    text = SETUP_DOC.read_text()
    toml_block = re.search(r"```toml\n(.*?)```", text, re.S)
    py_block = re.search(r"```python\n(# --- NotebookOS.*?# --- end of the NotebookOS lines ---\n)```", text, re.S)
    assert toml_block and py_block, f"{SETUP_DOC} lost its daemon (toml) or Hub (python) block"
    return tomllib.loads(toml_block.group(1)), py_block.group(1)


def ensure_account(name: str) -> int:
    """The regular account `name` (root only: created once, with a home); its uid.

    Regular, not a system account: `kernel.run_as = "owner"` refuses uids below
    `kernel.owner_uid_min` (1000 by default). An account an older harness made as a system
    account (`useradd --system`, uid below 1000) is removed and made again.
    """
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        uid = None
    if uid is not None and uid >= UID_MIN:
        return uid
    if uid is not None:
        subprocess.run(["userdel", "--remove", name], check=True, capture_output=True)
    HOMES.mkdir(parents=True, exist_ok=True)
    HOMES.chmod(0o755)
    subprocess.run(
        ["useradd", "--create-home", "--home-dir", str(HOMES / name), "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    uid = pwd.getpwnam(name).pw_uid
    assert uid >= UID_MIN, f"useradd gave {name} uid {uid}, below {UID_MIN} (this host's login.defs UID_MIN?)"
    return uid


def http(method: str, url: str, token: str | None = None, body=None, timeout: float = 60) -> tuple[int, object]:
    """(status, decoded JSON body or text) of one request; HTTP errors are answers, not raised."""
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None)
    if token:
        req.add_header("Authorization", f"token {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


class Hub:
    def __init__(self, state: Path | None = None) -> None:
        self.state = state or Path(tempfile.mkdtemp(prefix="nbos-hub-test-"))
        self.state.chmod(0o711)
        self.port, self.hub_port, self.proxy_api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_url = f"http://127.0.0.1:{self.hub_port}/hub/api"
        # The daemon's service token (docs: jupyterhub_token_file, mode 0600).
        self.service_token = secrets.token_hex(32)
        self.service_token_file = self.state / "notebookos-jupyterhub-token"
        self.service_token_file.write_text(self.service_token + "\n")
        self.service_token_file.chmod(0o600)
        # The tests' own admin service: creates tokens, starts servers.
        self.admin_token = secrets.token_hex(32)
        self.daemon_toml, self.hub_lines = setup_blocks()
        self.admin_group = self.daemon_toml["auth"]["admin_group"]
        self.proc: subprocess.Popen | None = None
        self.server_pids: list[int] = []

    def daemon_sections(self, run_as: bool) -> dict:
        """The setup page's daemon sections, pointed at this Hub; `[kernel] run_as` only
        when `run_as` (root: the accounts exist)."""
        auth = {**self.daemon_toml["auth"], "jupyterhub_api_url": self.api_url, "jupyterhub_token_file": str(self.service_token_file)}
        # A revoked token stops working within this (the default, 60 s, is what the page shows).
        auth["jupyterhub_cache"] = "2s"
        sections = {"auth": auth}
        if run_as:
            sections["kernel"] = dict(self.daemon_toml["kernel"])
        return sections

    def config_text(self, gateway_url: str) -> str:
        lines = re.sub(r'(?m)^notebookos_url = ".*?"', f"notebookos_url = {gateway_url!r}", self.hub_lines)
        lines = re.sub(r'(?m)^notebookos_token_file = ".*?"', f"notebookos_token_file = {str(self.service_token_file)!r}", lines)
        assert gateway_url in lines and str(self.service_token_file) in lines, "the setup page's two values were not found"
        s = self.state
        # Lab settings without first-run notifications over the notebook (the browser test).
        settings = s / "lab-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        return f"""# Written by tests/jupyter/hub_harness.py.
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.hub_port}
c.JupyterHub.db_url = "sqlite:///{s}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{s}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{s}/jupyterhub.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True
c.ConfigurableHTTPProxy.command = ["{PROXY}"]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_api_port}"
c.ConfigurableHTTPProxy.auth_token = "{secrets.token_hex(16)}"
c.ConfigurableHTTPProxy.pid_file = "{s}/proxy.pid"
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = "{PASSWORD}"
c.Authenticator.allowed_users = {{"{ALICE}", "{BOB}", "{ADMIN}"}}
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{s}/home/{{username}}"
c.Spawner.cmd = ["{sys.executable}", "-m", "jupyterhub.singleuser"]
c.Spawner.args = ["--allow-root"]
c.Spawner.default_url = "/lab"
# Two cores shared with other work: a server takes a while to start.
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180

{lines}
# The tests' own: an admin service (tokens, servers), the daemon's admin group, settings.
c.JupyterHub.services.append({{"name": "nbos-test-admin", "api_token": "{self.admin_token}"}})
c.JupyterHub.load_roles.append(
    {{
        "name": "nbos-test-admin",
        "scopes": ["admin:users", "admin:servers", "admin:server_state", "tokens", "admin:groups", "list:users", "read:users"],
        "services": ["nbos-test-admin"],
    }}
)
c.JupyterHub.load_groups = {{"{self.admin_group}": {{"users": ["{ADMIN}"]}}, "nbos-team": {{"users": ["{ALICE}", "{BOB}"]}}}}
c.Spawner.environment["JUPYTERLAB_SETTINGS_DIR"] = "{s}/lab-settings"
c.Spawner.environment["JUPYTER_GATEWAY_REQUEST_TIMEOUT"] = "120"
"""

    def start(self, gateway_url: str) -> None:
        config = self.state / "jupyterhub_config.py"
        config.write_text(self.config_text(gateway_url))
        if not PROXY.exists():
            raise RuntimeError(f"{PROXY} missing: run scripts/install-deps.sh (configurable-http-proxy from npm)")
        self.log_path = self.state / "jupyterhub.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=self.state,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited {self.proc.returncode}:\n{self.logs()}")
            try:
                # Through the proxy: the Hub is up and its route is in the proxy.
                return http("GET", f"{self.url}/hub/api/", timeout=5)[0] == 200
            except OSError:
                return False

        wait_for(up, 120, "JupyterHub to start")

    def logs(self, tail: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if hasattr(self, "log_path") else ""

    def api(self, method: str, path: str, body=None, token: str | None = None) -> tuple[int, object]:
        """The Hub's REST API (as the tests' admin service unless `token`)."""
        return http(method, self.api_url + path, token or self.admin_token, body)

    def new_token(self, user: str, note: str = "nbos test") -> tuple[str, str]:
        """A new API token of `user` (what they get from /hub/token): (token, its id)."""
        status, body = self.api("POST", f"/users/{user}/tokens", {"note": note, "expires_in": 3600})
        assert status == 201, (status, body)
        return body["token"], body["id"]

    def revoke(self, user: str, token_id: str) -> None:
        status, body = self.api("DELETE", f"/users/{user}/tokens/{token_id}")
        assert status == 204, (status, body)

    def spawn(self, user: str) -> str:
        """Starts `user`'s single-user server (if not running); returns its URL through the proxy."""
        status, body = self.api("POST", f"/users/{user}/server")
        assert status in (201, 202, 400), (status, body)  # 400: already running

        def ready():
            status, model = self.api("GET", f"/users/{user}")
            server = (model or {}).get("servers", {}).get("")
            if server and server.get("ready"):
                return server
            if self.proc.poll() is not None:
                raise RuntimeError(self.logs())
            return None

        server = wait_for(ready, 240, f"{user}'s server to start")
        pid = (server.get("state") or {}).get("pid")
        if pid:
            self.server_pids.append(pid)
        return self.url + server["url"].rstrip("/")

    def home(self, user: str) -> Path:
        """The user's single-user server's root directory."""
        return self.state / "home" / user

    def stop(self) -> None:
        """SIGTERM (the Hub stops the servers and the proxy), then SIGKILL of what is left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        pids = list(self.server_pids)
        proxy_pid = self.state / "proxy.pid"
        if proxy_pid.exists():
            pids.append(int(proxy_pid.read_text().strip() or 0))
        for pid in pids:
            if pid <= 0:
                continue
            try:
                # Only ours: a process whose command line names our state dir or the proxy.
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"jupyterhub.singleuser" in cmdline or b"configurable-http-proxy" in cmdline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc = None


class HubSetup:
    """A daemon configured as the setup page says and a Hub whose servers use it."""

    def __init__(self) -> None:
        # Imported here: hub_harness is also imported by the browser suite's conftest path.
        from nbos_harness import Daemon

        self.hub = Hub()
        # Kernels run as their owners' accounts when we are root (they exist then).
        self.run_as_wanted = os.geteuid() == 0
        if self.run_as_wanted:
            for user in (ALICE, BOB):
                ensure_account(user)
        # Why the daemon would not take `[kernel] run_as` (a daemon without it), if it would not.
        self.run_as_refused: str | None = None
        try:
            self.daemon = Daemon(extra_sections=self.hub.daemon_sections(run_as=self.run_as_wanted))
        except RuntimeError as e:
            if "run_as" not in str(e):
                raise
            self.run_as_refused = next(line for line in str(e).splitlines() if "run_as" in line).strip()
            print(f"hub_harness: the daemon refused [kernel] run_as; kernels run as its shared account: {self.run_as_refused}")
            self.daemon = Daemon(extra_sections=self.hub.daemon_sections(run_as=False))
        try:
            self.hub.start(self.daemon.url)
        except BaseException:
            self.daemon.stop()
            raise

    @property
    def run_as(self) -> bool:
        return self.run_as_wanted and self.run_as_refused is None

    def logs(self) -> str:
        daemon_log = (self.daemon.dir / "daemon.log").read_text(errors="replace")[-4000:]
        return f"--- jupyterhub ---\n{self.hub.logs()}\n--- notebookosd ---\n{daemon_log}"

    def stop(self) -> None:
        self.hub.stop()
        self.daemon.stop()
