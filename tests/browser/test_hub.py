"""JupyterHub's users in the browser, their kernels on notebookosd (hub_harness.py, the lines of
docs/users-jupyterhub-setup.md): Alice logs in to the Hub and runs a notebook in her JupyterLab;
Bob, logged in to his, sees none of her kernels and cannot open her kernel's channels; with root,
each kernel runs as its user's account."""

from __future__ import annotations

import json
import os
import pwd

import pytest
from hub_harness import ALICE, BOB, PASSWORD, HubSetup, http
from lab_harness import Notebook, chromium, close, wait_until
from selenium.webdriver.common.by import By


@pytest.fixture(scope="module")
def setup():
    s = HubSetup()
    yield s
    s.stop()


@pytest.fixture
def browser():
    driver = chromium()
    yield driver
    close(driver)


def log_in(driver, hub_url: str, user: str) -> None:
    """The Hub's login page, as a user fills it in."""
    driver.get(f"{hub_url}/hub/login")
    wait_until(lambda: driver.find_elements(By.ID, "username_input"), 60, "the Hub's login page")
    driver.find_element(By.ID, "username_input").send_keys(user)
    driver.find_element(By.ID, "password_input").send_keys(PASSWORD)
    driver.find_element(By.ID, "login_submit").click()
    wait_until(lambda: "/hub/login" not in driver.current_url, 60, f"{user} to be logged in")


def open_notebook(setup, driver, user: str, name: str) -> Notebook:
    """Writes an empty Python notebook into `user`'s home and opens it in their JupyterLab."""
    server = setup.hub.spawn(user)
    # What JupyterLab asks first: the kernelspecs, from the daemon with the server's own token.
    status, specs = http("GET", server + "/api/kernelspecs", setup.hub.new_token(user)[0])
    assert status == 200 and "python3" in specs["kernelspecs"], f"{user}'s server has no kernelspecs from the daemon: {status} {specs}"
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": "c0", "metadata": {}, "outputs": [], "source": ""}],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (setup.hub.home(user) / name).write_text(json.dumps(nb))
    return Notebook(driver, f"{setup.hub.url}/user/{user}/lab/tree/{name}?reset")


def page_json(driver, url: str, method: str = "GET", body=None):
    """A request to a server's API from the page, as JupyterLab makes it (session cookie, XSRF header)."""
    return driver.execute_async_script(
        "const [url, method, body, done] = arguments;"
        "const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';"
        "fetch(url, {method, body, headers: {'X-XSRFToken': decodeURIComponent(xsrf), 'Content-Type': 'application/json'}})"
        ".then(async r => done({status: r.status, body: await r.text()})).catch(e => done({status: 0, body: String(e)}));",
        url,
        method,
        json.dumps(body) if body is not None else None,
    )


def runs_code(driver, url: str, code: str) -> bool:
    """Whether `code` runs on the kernel whose channels WebSocket is `url`, from the page: an
    execute_reply arrives (true), or the socket is refused, closes or stays silent for 30 s."""
    driver.set_script_timeout(90)
    return driver.execute_async_script(
        "const [url, code, done] = arguments;"
        "const id = crypto.randomUUID();"
        "const ws = new WebSocket(url);"
        "const end = ok => { clearTimeout(t); try { ws.close(); } catch (e) {} done(ok); };"
        "const t = setTimeout(() => end(false), 30000);"
        "ws.onopen = () => ws.send(JSON.stringify({channel: 'shell', header: {msg_id: id, msg_type: 'execute_request', session: id,"
        " username: '', version: '5.3', date: new Date().toISOString()}, parent_header: {}, metadata: {},"
        " content: {code, silent: false, store_history: false, user_expressions: {}, allow_stdin: false}}));"
        "ws.onmessage = e => { const m = JSON.parse(e.data); if (m.msg_type === 'execute_reply' && m.parent_header.msg_id === id) end(true); };"
        "ws.onerror = () => end(false);"
        "ws.onclose = () => end(false);",
        url,
        code,
    )


def kernel_id_of(setup, user: str, notebook: str, driver) -> str:
    r = page_json(driver, f"{setup.hub.url}/user/{user}/api/sessions")
    assert r["status"] == 200, r
    return next(s["kernel"]["id"] for s in json.loads(r["body"]) if s["path"] == notebook)


def test_alice_runs_a_notebook_and_bob_can_neither_see_nor_reach_her_kernel(setup, browser):
    log_in(browser, setup.hub.url, ALICE)
    nb = open_notebook(setup, browser, ALICE, "alice.ipynb")
    c = nb.run("import os\nx = 6 * 7\nprint('answer', x, 'uid', os.getuid())")
    shown = nb.wait_output(c, "answer 42", 120)
    if setup.run_as:
        assert f"uid {pwd.getpwnam(ALICE).pw_uid}" in shown, shown
    alice_kernel = kernel_id_of(setup, ALICE, "alice.ipynb", browser)
    ws = setup.hub.url.replace("http://", "ws://", 1)
    # The control: from her own page, code runs on her kernel.
    assert runs_code(browser, f"{ws}/user/{ALICE}/api/kernels/{alice_kernel}/channels", "y = 1")

    # Bob, in his own browser.
    bob_browser = chromium()
    try:
        bob_sees_none_of(setup, bob_browser, alice_kernel)
    finally:
        close(bob_browser)
    # Her namespace is as she left it.
    c = nb.run("print('x is', x)")
    assert "x is 42" in nb.wait_output(c, "x is", 60)


def bob_sees_none_of(setup, browser, alice_kernel: str) -> None:
    ws = setup.hub.url.replace("http://", "ws://", 1)
    log_in(browser, setup.hub.url, BOB)
    bob_nb = open_notebook(setup, browser, BOB, "bob.ipynb")
    c = bob_nb.run("import os\nprint('bob here, uid', os.getuid())")
    shown = bob_nb.wait_output(c, "bob here", 120)
    if setup.run_as:
        assert f"uid {pwd.getpwnam(BOB).pw_uid}" in shown, shown
    bob_kernel = kernel_id_of(setup, BOB, "bob.ipynb", browser)
    # His JupyterLab's kernels are his own: none of hers.
    r = page_json(browser, f"{setup.hub.url}/user/{BOB}/api/kernels")
    assert r["status"] == 200, r
    ids = [k["id"] for k in json.loads(r["body"])]
    assert bob_kernel in ids and alice_kernel not in ids, ids
    # He asks his server for a session on her kernel's id (jupyter_server then takes the kernel
    # from the gateway by id, with his token): her kernel's channels stay closed to him.
    page_json(browser, f"{setup.hub.url}/user/{BOB}/api/sessions", "POST", {"path": "hers.ipynb", "type": "notebook", "kernel": {"id": alice_kernel}})
    channels = f"{ws}/user/{BOB}/api/kernels/{alice_kernel}/channels"
    assert not runs_code(browser, channels, "x = 'Bob was here'"), "Bob's page ran code in Alice's kernel"
    # Her server is hers: the Hub does not let him in.
    assert page_json(browser, f"{setup.hub.url}/user/{ALICE}/api/kernels")["status"] in (403, 404)


def test_each_kernel_runs_as_its_users_account(setup, browser):
    if os.geteuid() != 0:
        reason = "needs root: the daemon runs kernels as the accounts nbos-alice and nbos-bob"
        if os.environ.get("NBOS_REQUIRE_PRIVILEGED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    assert setup.run_as, f"the daemon does not take [kernel] run_as = \"owner\": {setup.run_as_refused}"
    log_in(browser, setup.hub.url, ALICE)
    nb = open_notebook(setup, browser, ALICE, "whoami.ipynb")
    c = nb.run("import os, pwd\nprint('runs as', pwd.getpwuid(os.getuid()).pw_name)")
    assert f"runs as {ALICE}" in nb.wait_output(c, "runs as", 120)
