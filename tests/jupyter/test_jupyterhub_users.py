"""Teams share it, with the real thing: a JupyterHub (hub_harness.py, the lines of
docs/users-jupyterhub-setup.md) whose users' single-user servers use notebookosd as their
gateway, each with its own Hub token. Alice runs a notebook through her server; Bob, with his
own token, can neither see nor reach her kernel (REST and WebSocket answer 404, as for a kernel
that does not exist), not on one host nor on any host of a cluster; a made-up or revoked token
answers 401; each kernel runs as its user's account (root only)."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import time
import uuid

import pytest
import websocket
from hub_harness import ADMIN, ALICE, BOB, Hub, HubSetup, http
from nbos_testkit import Cluster, run_cell, wait_for

PRIVILEGED = os.environ.get("NBOS_REQUIRE_PRIVILEGED") == "1"


def cannot_run(why: str):
    if PRIVILEGED:
        pytest.fail(f"NBOS_REQUIRE_PRIVILEGED=1 but this test cannot run: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def setup():
    s = HubSetup()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokens(setup):
    """Each user's own API token (what /hub/token gives them)."""
    return {user: setup.hub.new_token(user)[0] for user in (ALICE, BOB, ADMIN)}


@pytest.fixture(scope="module")
def servers(setup):
    """Alice's and Bob's single-user servers, started by the Hub: their URLs through the proxy."""
    return {user: setup.hub.spawn(user) for user in (ALICE, BOB)}


def ws_url(base: str, kernel_id: str) -> str:
    return base.replace("http://", "ws://", 1) + f"/api/kernels/{kernel_id}/channels"


def connect(base: str, kernel_id: str, token: str) -> websocket.WebSocket:
    return websocket.create_connection(ws_url(base, kernel_id), header=[f"Authorization: token {token}"], timeout=120)


def ws_refusal(base: str, kernel_id: str, token: str) -> int | None:
    """The HTTP status that refused the channels WebSocket, or None if it opened."""
    try:
        connect(base, kernel_id, token).close()
        return None
    except websocket.WebSocketBadStatusException as e:
        return e.status_code


def runs_code(base: str, kernel_id: str, token: str, code: str):
    """The execute_reply if `code` ran on the kernel through `base`'s channels WebSocket within
    30 s; None if refused: at the handshake, or a socket that closes or never replies
    (jupyter_server accepts a client's socket before it connects to the gateway's, and keeps it
    open, pinging, when the gateway refuses)."""
    try:
        ws = connect(base, kernel_id, token)
    except websocket.WebSocketBadStatusException:
        return None
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "session": msg_id, "username": "", "version": "5.3"}
    try:
        ws.settimeout(2)
        ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell", "content": {"code": code, "silent": False}}))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                opcode, data = ws.recv_data(control_frame=True)
            except websocket.WebSocketTimeoutException:
                continue
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                return None
            if opcode == websocket.ABNF.OPCODE_TEXT:
                m = json.loads(data)
                if m.get("msg_type") == "execute_reply" and m.get("parent_header", {}).get("msg_id") == msg_id:
                    return m
        return None
    except (websocket.WebSocketException, OSError):
        return None
    finally:
        ws.close()


def server_kernel(setup, servers, tokens, user: str) -> str:
    """A kernel `user` starts through their own single-user server (as JupyterLab does)."""
    status, model = http("POST", servers[user] + "/api/kernels", tokens[user], {"name": "python3"}, timeout=180)
    assert status == 201, f"{user}'s server could not start a kernel on the gateway: {status} {model}\n{setup.logs()}"
    return model["id"]


@pytest.fixture(scope="module")
def alice_kernel(setup, servers, tokens):
    return server_kernel(setup, servers, tokens, ALICE)


def test_each_server_uses_the_gateway_with_its_own_token_and_the_hub_vouches_for_it(setup, servers):
    """What the daemon relies on: a server's gateway token is its own JUPYTERHUB_API_TOKEN,
    which the Hub's `GET /user` names as its user, with groups; the daemon's service token reads
    users' groups."""
    for user in (ALICE, BOB):
        pid = next(p for p in setup.hub.server_pids if f"/user/{user}".encode() in _environ_raw(p))
        env = _environ(pid)
        assert env["JUPYTER_GATEWAY_URL"] == setup.daemon.url
        assert env["JUPYTER_GATEWAY_AUTH_TOKEN"] == env["JUPYTERHUB_API_TOKEN"]
        status, me = http("GET", setup.hub.api_url + "/user", env["JUPYTERHUB_API_TOKEN"])
        assert status == 200 and me["name"] == user and "nbos-team" in me["groups"], (status, me)
        status, model = http("GET", setup.hub.api_url + f"/users/{user}", setup.hub.service_token)
        assert status == 200 and "nbos-team" in model["groups"], (status, model)
    status, model = http("GET", setup.hub.api_url + f"/users/{ADMIN}", setup.hub.service_token)
    assert status == 200 and setup.hub.admin_group in model["groups"], (status, model)


def _environ_raw(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return b""


def _environ(pid: int) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in _environ_raw(pid).decode().split("\0") if "=" in kv)


def test_alice_runs_a_notebook_through_her_server(setup, servers, tokens, alice_kernel):
    status, specs = http("GET", servers[ALICE] + "/api/kernelspecs", tokens[ALICE])
    assert status == 200 and "python3" in specs["kernelspecs"], (status, specs)
    ws = connect(servers[ALICE], alice_kernel, tokens[ALICE])
    try:
        cell = run_cell(ws, "x = 6 * 7\nprint('answer', x)")
    finally:
        ws.close()
    assert cell.status == "ok" and "answer 42" in cell.stdout, cell
    # The same kernel on the daemon, listed for her own token.
    status, kernels = http("GET", setup.daemon.url + "/api/kernels", tokens[ALICE])
    assert status == 200 and alice_kernel in [k["id"] for k in kernels], (status, kernels)
    status, model = http("GET", setup.daemon.url + f"/api/kernels/{alice_kernel}", tokens[ALICE])
    assert status == 200 and model["id"] == alice_kernel, (status, model)


def test_bob_can_neither_see_nor_reach_alices_kernel(setup, servers, tokens, alice_kernel):
    d, bob = setup.daemon.url, tokens[BOB]
    status, kernels = http("GET", d + "/api/kernels", bob)
    assert status == 200, (status, kernels)
    assert alice_kernel not in [k["id"] for k in kernels], kernels
    for method, path in [
        ("GET", f"/api/kernels/{alice_kernel}"),
        ("POST", f"/api/kernels/{alice_kernel}/interrupt"),
        ("POST", f"/api/kernels/{alice_kernel}/restart"),
        ("DELETE", f"/api/kernels/{alice_kernel}"),
    ]:
        status, body = http(method, d + path, bob, {} if method == "POST" else None)
        assert status == 404, f"Bob's {method} {path}: {status} {body}"
    # As for a kernel that does not exist: the same answer, nothing of hers in it.
    assert http("GET", d + f"/api/kernels/{alice_kernel}", bob)[0] == http("GET", d + f"/api/kernels/{uuid.uuid4()}", bob)[0]
    assert ws_refusal(d, alice_kernel, bob) == 404
    # Bob's own server (his token at the gateway) lists none of hers and cannot reach it, not
    # even after he asks it for a session on her kernel's id (jupyter_server then takes the
    # kernel from the gateway by id, as for a kernel started elsewhere: the daemon decides).
    status, kernels = http("GET", servers[BOB] + "/api/kernels", bob)
    assert status == 200 and alice_kernel not in [k["id"] for k in kernels], (status, kernels)
    http("POST", servers[BOB] + "/api/sessions", bob, {"path": "hers.ipynb", "type": "notebook", "kernel": {"id": alice_kernel}})
    ran = runs_code(servers[BOB], alice_kernel, bob, "x = 'Bob was here'")
    assert ran is None, f"Bob ran code in Alice's kernel through his server: {ran}"
    status, model = http("GET", servers[BOB] + f"/api/kernels/{alice_kernel}", bob)
    assert status == 404 or not (model or {}).get("execution_state"), (status, model)
    # Nor through hers: the Hub lets no one else into her server.
    assert http("GET", servers[ALICE] + "/api/kernels", bob)[0] in (403, 404)
    # Her kernel is untouched: still there, same namespace (no restart, no delete).
    ws = connect(servers[ALICE], alice_kernel, tokens[ALICE])
    try:
        cell = run_cell(ws, "print('still', x)")
    finally:
        ws.close()
    assert "still 42" in cell.stdout, cell


def test_a_kernel_username_sent_by_the_client_changes_neither_owner_nor_account(setup, tokens):
    """Bob asks for a kernel `for` Alice (Enterprise Gateway's KERNEL_USERNAME): it is his."""
    d = setup.daemon.url
    status, model = http("POST", d + "/api/kernels", tokens[BOB], {"name": "python3", "env": {"KERNEL_USERNAME": ALICE}}, timeout=180)
    assert status == 201, (status, model)
    kid = model["id"]
    try:
        assert kid not in [k["id"] for k in http("GET", d + "/api/kernels", tokens[ALICE])[1]]
        assert http("GET", d + f"/api/kernels/{kid}", tokens[ALICE])[0] == 404
        if setup.run_as:
            ws = connect(d, kid, tokens[BOB])
            try:
                cell = run_cell(ws, "import os; print('uid', os.getuid())")
            finally:
                ws.close()
            assert f"uid {pwd.getpwnam(BOB).pw_uid}" in cell.stdout, cell
    finally:
        http("DELETE", d + f"/api/kernels/{kid}", tokens[BOB])


def test_each_kernel_runs_as_its_users_account(setup, servers, tokens):
    if os.geteuid() != 0:
        cannot_run("needs root: the daemon runs kernels as the accounts nbos-alice and nbos-bob it finds by name")
    assert setup.run_as, f"the daemon does not take [kernel] run_as = \"owner\": {setup.run_as_refused}"
    uids = {}
    for user in (ALICE, BOB):
        kid = server_kernel(setup, servers, tokens, user)
        ws = connect(servers[user], kid, tokens[user])
        try:
            cell = run_cell(ws, "import os\nprint('ids', os.getuid(), os.geteuid(), os.getgid())")
        finally:
            ws.close()
            http("DELETE", servers[user] + f"/api/kernels/{kid}", tokens[user])
        account = pwd.getpwnam(user)
        assert f"ids {account.pw_uid} {account.pw_uid} {account.pw_gid}" in cell.stdout, (user, cell)
        uids[user] = account.pw_uid
    assert uids[ALICE] != uids[BOB] and 0 not in uids.values()


def test_a_made_up_or_revoked_token_is_refused(setup, tokens, alice_kernel):
    d = setup.daemon.url
    for token in (None, secrets.token_hex(16), setup.hub.service_token + "x"):
        assert http("GET", d + "/api/kernels", token)[0] == 401, token
        assert http("POST", d + "/api/kernels", token, {"name": "python3"})[0] == 401, token
    # Credentials before anything else: a stranger learns nothing of which kernels exist.
    for kernel_id in (str(uuid.uuid4()), alice_kernel):
        assert ws_refusal(d, kernel_id, secrets.token_hex(16)) == 401, kernel_id
        assert http("GET", d + f"/api/kernels/{kernel_id}", secrets.token_hex(16))[0] == 401, kernel_id
    # A token of Bob's works until it is revoked at the Hub, then is refused (after the
    # daemon's cache of the Hub's answer, `jupyterhub_cache`, 2 s here).
    token, token_id = setup.hub.new_token(BOB, "revoked by the test")
    assert http("GET", d + "/api/kernels", token)[0] == 200
    setup.hub.revoke(BOB, token_id)
    assert http("GET", setup.hub.api_url + "/user", token)[0] in (401, 403), "the Hub still takes the revoked token"
    wait_for(lambda: http("GET", d + "/api/kernels", token)[0] == 401, 60, "the daemon to refuse the revoked token")


def test_the_admin_group_sees_every_kernel(setup, tokens, alice_kernel):
    status, kernels = http("GET", setup.daemon.url + "/api/kernels", tokens[ADMIN])
    assert status == 200 and alice_kernel in [k["id"] for k in kernels], (status, kernels)
    assert http("GET", setup.daemon.url + f"/api/kernels/{alice_kernel}", tokens[ADMIN])[0] == 200


# ---- The same isolation across a 3-host cluster (every host with the Hub config). ----


@pytest.fixture(scope="module")
def hub_cluster():
    hub = Hub()
    sections = hub.daemon_sections(run_as=False)
    cluster = Cluster(hosts=3, tls=False, overlay=sections)
    try:
        hub.start(cluster.urls[0])
        yield hub, cluster
    finally:
        hub.stop()
        cluster.stop()


def test_across_the_cluster_bob_reaches_none_of_alices_kernel_and_she_reaches_it_anywhere(hub_cluster):
    hub, cluster = hub_cluster
    alice, bob = hub.new_token(ALICE)[0], hub.new_token(BOB)[0]
    status, model = http("POST", cluster.urls[0] + "/api/kernels", alice, {"name": "python3"}, timeout=180)
    assert status == 201, f"{status} {model}\n{cluster.logs()}"
    kid = model["id"]
    try:
        for host in (1, 2):
            url = cluster.urls[host]
            status, kernels = http("GET", url + "/api/kernels", bob)
            assert status == 200 and kid not in [k["id"] for k in kernels], (host + 1, status, kernels)
            for method, path in [
                ("GET", f"/api/kernels/{kid}"),
                ("POST", f"/api/kernels/{kid}/interrupt"),
                ("POST", f"/api/kernels/{kid}/restart"),
                ("DELETE", f"/api/kernels/{kid}"),
            ]:
                status, body = http(method, url + path, bob, {} if method == "POST" else None)
                assert status == 404, f"host {host + 1}: Bob's {method} {path}: {status} {body}"
            assert ws_refusal(url, kid, bob) == 404, f"host {host + 1}"
        # Alice reaches her kernel through another host: listed, and a cell runs.
        url = cluster.urls[1]
        status, kernels = http("GET", url + "/api/kernels", alice)
        assert status == 200 and kid in [k["id"] for k in kernels], (status, kernels)
        ws = connect(url, kid, alice)
        try:
            cell = run_cell(ws, "print('from host 2:', 6 * 7)")
        finally:
            ws.close()
        assert "from host 2: 42" in cell.stdout, cell
    finally:
        http("DELETE", cluster.urls[0] + f"/api/kernels/{kid}", alice)
