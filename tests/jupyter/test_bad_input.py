"""Bad input never hurts a kernel: wrong tokens are refused with 401, unknown
kernels are 404, and malformed or badly signed messages are dropped, counted and
logged while the kernel keeps working."""

import json
import urllib.error
import urllib.request
import uuid

import pytest
import websocket  # websocket-client, a jupyter_server dependency
from jupyter_client.session import Session
from nbos_harness import daemon, wait_for
from nbos_testkit import run_cell


def http(method: str, path: str, token: str | None, body: dict | None = None):
    d = daemon()
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(d.url + path, method=method, data=data)
    if token is not None:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def kernel_id():
    d = daemon()
    status, model = http("POST", "/api/kernels", d.token, {"name": "python3"})
    assert status == 201, model
    yield model["id"]
    http("DELETE", f"/api/kernels/{model['id']}", d.token)


def test_wrong_or_missing_token_is_401_everywhere(kernel_id):
    for method, path in [
        ("GET", "/api"),
        ("GET", "/api/kernels"),
        ("POST", "/api/kernels"),
        ("GET", "/api/kernelspecs"),
        ("GET", f"/api/kernels/{kernel_id}"),
        ("DELETE", f"/api/kernels/{kernel_id}"),
        ("POST", f"/api/kernels/{kernel_id}/interrupt"),
        ("POST", f"/api/kernels/{kernel_id}/restart"),
    ]:
        for token in (None, "wrong-token-wrong-token"):
            status, _ = http(method, path, token)
            assert status == 401, (method, path, token, status)
    # Nothing was deleted or restarted by the refused requests.
    status, model = http("GET", f"/api/kernels/{kernel_id}", daemon().token)
    assert status == 200 and model["execution_state"] == "idle"


def test_websocket_with_a_wrong_token_is_401(kernel_id):
    d = daemon()
    ws_url = d.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels"
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(ws_url, header=["Authorization: token wrong-token-wrong-token"], timeout=10)
    assert e.value.status_code == 401
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(ws_url + "?token=wrong", timeout=10)
    assert e.value.status_code == 401
    # Without any token, an unknown kernel id is refused too (the id is the capability).
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(d.url.replace("http", "ws") + f"/api/kernels/{uuid.uuid4()}/channels", timeout=10)
    assert e.value.status_code == 401


def test_unknown_kernel_is_404():
    d = daemon()
    bogus = str(uuid.uuid4())
    for method, path in [
        ("GET", f"/api/kernels/{bogus}"),
        ("DELETE", f"/api/kernels/{bogus}"),
        ("POST", f"/api/kernels/{bogus}/interrupt"),
        ("POST", f"/api/kernels/{bogus}/restart"),
        ("GET", "/api/kernelspecs/no-such-spec"),
        ("GET", "/kernelspecs/no-such-spec/logo-64x64.png"),
    ]:
        status, body = http(method, path, d.token)
        assert status == 404, (method, path, status, body)
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(
            d.url.replace("http", "ws") + f"/api/kernels/{bogus}/channels", header=[f"Authorization: token {d.token}"]
        )
    assert e.value.status_code == 404
    status, body = http("POST", "/api/kernels", d.token, {"name": "no-such-spec"})
    assert status == 404, body
    status, body = http("POST", "/api/kernels", d.token, {"name": "python3", "gpus": "many"})
    assert status == 400, body


def dropped_count(reason: str, source: str) -> float:
    d = daemon()
    req = urllib.request.Request(d.url + "/metrics")
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("notebookos_messages_dropped_total{") and f'reason="{reason}"' in line and f'source="{source}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_malformed_websocket_messages_are_dropped_counted_and_the_kernel_keeps_working(kernel_id):
    d = daemon()
    ws = websocket.create_connection(
        d.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels",
        header=[f"Authorization: token {d.token}"],
        timeout=60,
    )
    before = dropped_count("malformed_json", "websocket")
    ws.send("this is not json")
    ws.send(json.dumps({"channel": "shell", "content": {"code": "1"}}))  # no header
    ws.send(json.dumps({"header": {"msg_id": "x"}, "content": {}}))  # no msg_type
    wait_for(lambda: dropped_count("malformed_json", "websocket") >= before + 3, 10, "the drops to be counted")
    before_chan = dropped_count("unknown_channel", "websocket")
    ws.send(json.dumps({"channel": "bogus", "header": {"msg_id": "y", "msg_type": "x"}}))
    wait_for(lambda: dropped_count("unknown_channel", "websocket") >= before_chan + 1, 10, "the drop to be counted")
    cell = run_cell(ws, "6 * 7", timeout=60)
    assert (cell.status, cell.result) == ("ok", "42")
    ws.close()
    # The cell was counted by outcome and its interactivity delay observed.
    metrics = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
    assert any(l.startswith('notebookos_cells_total{outcome="ok"}') and float(l.split()[-1]) >= 1 for l in metrics.splitlines()), metrics
    assert any(l.startswith("notebookos_interactivity_delay_seconds_count") and float(l.split()[-1]) >= 1 for l in metrics.splitlines()), metrics


def test_badly_signed_messages_to_the_kernel_proxy_are_dropped(tmp_path):
    daemon()
    import zmq
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="notebookos-test")
    try:
        info = km.get_connection_info()
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://{info['ip']}:{info['shell_port']}")
        forged = Session(key=b"not-the-key")
        forged.send(sock, "execute_request", content={"code": "open('/tmp/pwned', 'w')", "silent": False})
        # A correctly signed request sent after the forged one is answered; the forged one never is.
        good = Session(key=info["key"] if isinstance(info["key"], bytes) else info["key"].encode())
        sent = good.send(sock, "kernel_info_request", content={})
        assert sock.poll(30_000), "no reply to the correctly signed request"
        _, reply = good.feed_identities(sock.recv_multipart())
        reply = good.deserialize(reply)
        assert reply["parent_header"]["msg_id"] == sent["header"]["msg_id"]
        assert reply["msg_type"] == "kernel_info_reply"
        assert not sock.poll(500), "the forged request got an answer"
        # The kernel keeps working for the real client.
        r = kc.execute_interactive("2 + 2", timeout=30)
        assert r["content"]["status"] == "ok"
        sock.close(0)
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
