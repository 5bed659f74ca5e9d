"""Not a test, and not in `make test`: checks the JupyterHub users tests themselves before the
daemon has users. A pytest plugin that puts a stand-in for the daemon's users (a Hub token checked
with the Hub's GET /user, kernels owned by who created them, 404 for someone else's, the admin
group sees all; no caching, no run_as, single host) in front of a plain daemon, so that the tests
can be seen to pass where the specification is met and, with STANDIN_NO_OWNERSHIP=1, to fail
where it is not:

    PYTHONPATH=tests/jupyter:tests/support/python .venv/bin/python -m pytest -p hub_standin \
        tests/jupyter/test_jupyterhub_users.py tests/browser/test_hub.py -k "not runs_as and not cluster"
"""
import asyncio
import os
import json
import re
import threading
import urllib.request

import hub_harness
import tornado.httpclient
import tornado.web
import tornado.websocket
from nbos_harness import Daemon, free_port

OWNERS: dict[str, str] = {}


def hub_user(api_url, token):
    if not token:
        return None
    req = urllib.request.Request(api_url + "/user", headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except Exception:
        return None


class Base:
    def user(self):
        a = self.request.headers.get("Authorization", "")
        tok = a[6:] if a.startswith("token ") else None
        return hub_user(self.settings["hub_api"], tok)

    def allowed(self, user, kid):
        if os.environ.get("STANDIN_NO_OWNERSHIP"):
            return True
        return self.settings["admin_group"] in user.get("groups", []) or OWNERS.get(kid) == user["name"]


class Rest(Base, tornado.web.RequestHandler):
    async def handle(self, path):
        u = self.user()
        if u is None:
            self.set_status(401)
            return self.finish("401")
        m = re.match(r"/api/kernels/([^/]+)", path)
        if m and not self.allowed(u, m.group(1)):
            self.set_status(404)
            return self.finish("404 no such kernel")
        body = self.request.body if self.request.method in ("POST", "PUT", "PATCH") else None
        if self.request.method == "POST" and body == b"":
            body = b"{}"
        if self.request.method == "POST" and path == "/api/kernels":
            b = json.loads(body or b"{}")
            b.pop("env", None)
            body = json.dumps(b).encode()
        r = await tornado.httpclient.AsyncHTTPClient().fetch(
            self.settings["up"] + path, method=self.request.method, body=body,
            headers={"Authorization": f"token {self.settings['up_token']}", "Content-Type": "application/json"},
            raise_error=False, request_timeout=180,
        )
        out = r.body
        if r.code == 201 and path == "/api/kernels":
            OWNERS[json.loads(out)["id"]] = u["name"]
        if r.code == 200 and path == "/api/kernels" and self.request.method == "GET":
            out = json.dumps([k for k in json.loads(out) if self.allowed(u, k["id"])]).encode()
        self.set_status(r.code)
        if r.code != 204:
            self.set_header("Content-Type", r.headers.get("Content-Type", "application/json"))
            self.finish(out)
        else:
            self.finish()

    get = post = delete = patch = put = handle


class Channels(Base, tornado.websocket.WebSocketHandler):
    async def get(self, kid):
        u = self.user()
        if u is None:
            self.set_status(401)
            return self.finish("401")
        if not self.allowed(u, kid):
            self.set_status(404)
            return self.finish("404")
        self.up = await tornado.websocket.websocket_connect(tornado.httpclient.HTTPRequest(
            self.settings["up"].replace("http", "ws") + f"/api/kernels/{kid}/channels",
            headers={"Authorization": f"token {self.settings['up_token']}"}), max_message_size=64 << 20)
        await super().get(kid)

    def open(self, kid):
        async def pump():
            while True:
                m = await self.up.read_message()
                if m is None:
                    self.close()
                    return
                await self.write_message(m, binary=isinstance(m, bytes))
        asyncio.ensure_future(pump())

    async def on_message(self, m):
        await self.up.write_message(m, binary=isinstance(m, bytes))

    def on_close(self):
        self.up.close()


def start_proxy(up, up_token, hub_api, admin_group):
    port = free_port()
    ready = threading.Event()

    def run():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        app = tornado.web.Application(
            [(r"/api/kernels/([^/]+)/channels", Channels), (r"(/.*)", Rest)],
            up=up, up_token=up_token, hub_api=hub_api, admin_group=admin_group,
        )
        app.listen(port, "127.0.0.1")
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    ready.wait()
    return f"http://127.0.0.1:{port}"


class StandinSetup(hub_harness.HubSetup):
    def __init__(self):
        self.hub = hub_harness.Hub()
        self.run_as_wanted = False
        self.run_as_refused = "stand-in"
        self.daemon = Daemon()
        self.real_url = self.daemon.url
        self.daemon.url = start_proxy(self.real_url, self.daemon.token, self.hub.api_url, self.hub.admin_group)
        self.hub.start(self.daemon.url)


hub_harness.HubSetup = StandinSetup
