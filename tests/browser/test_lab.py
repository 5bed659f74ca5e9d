"""JupyterLab 4 in headless Chromium, its kernels on one notebookosd (`--gateway-url`),
used as a data scientist uses it: open a notebook, run cells and read their output,
interrupt, restart (no crash dialog, a fresh namespace), switch to a GPU kernel and see
why a cell waits, shut the kernel down."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
import uuid

import pytest
import websocket
from lab_harness import CRASH_DIALOG_TEXT, Lab, Notebook, chromium, close, wait_until
from nbos_harness import Daemon
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(fake_gpus=1, idle_release="1s")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def lab(daemon, tmp_path_factory):
    lab = Lab(daemon.url, daemon.token, tmp_path_factory.mktemp("lab"))
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    close(driver)


def api(d: Daemon, method: str, path: str, body=None):
    req = urllib.request.Request(d.url + path, method=method, data=json.dumps(body).encode() if body else None, headers=d.headers())
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


def toolbar_button(nb: Notebook, title: str):
    return nb.driver.find_element(By.CSS_SELECTOR, f".jp-NotebookPanel:not(.lm-mod-hidden) jp-button[title='{title}']")


def no_crash_dialog(nb: Notebook) -> bool:
    shown = [t for t in nb.dialogs() if CRASH_DIALOG_TEXT in t]
    assert not shown, f"JupyterLab shows its crash dialog: {shown}"
    return True


def test_cells_run_and_their_output_shows(lab, browser):
    nb = Notebook(browser, lab.new_notebook("cells.ipynb", "python3"))
    c = nb.run("x = 41\nprint('x + 1 =', x + 1)")
    assert "x + 1 = 42" in nb.wait_output(c, "x + 1 = 42")
    c = nb.run("x * 2")
    assert nb.wait_output(c, "82").strip() == "82"
    assert nb.wait_done(c) == "[2]:"
    c = nb.run("1 / 0")
    assert "ZeroDivisionError" in nb.wait_output(c, "ZeroDivisionError")


def test_a_running_cell_is_interrupted_from_the_toolbar(lab, browser):
    nb = Notebook(browser, lab.new_notebook("interrupt.ipynb", "python3"))
    c = nb.run("import time\nfor i in range(600):\n    time.sleep(0.5)")
    wait_until(lambda: "*" in nb.prompt_of(c) and nb.kernel_status().endswith("| Busy"), 30, "the cell to run")
    toolbar_button(nb, "Interrupt the kernel").click()
    assert "KeyboardInterrupt" in nb.wait_output(c, "KeyboardInterrupt", 30)
    nb.wait_kernel_idle(30)
    c = nb.run("print('still here', i < 600)")
    assert "still here True" in nb.wait_output(c, "still here True")


def test_restart_shows_no_crash_dialog_and_starts_a_fresh_namespace(lab, daemon, browser):
    nb = Notebook(browser, lab.new_notebook("restart.ipynb", "python3"))
    c = nb.run("secret = 'kept'\nprint(secret)")
    nb.wait_output(c, "kept")
    kernel = lab.session_kernel("restart.ipynb")
    old_pids = api(daemon, "GET", f"/api/kernels/{kernel['id']}")["pids"]
    toolbar_button(nb, "Restart the kernel").click()
    nb.accept_dialog("Restart")
    # Through the restart and a moment after it, JupyterLab must not think the kernel died.
    wait_until(lambda: no_crash_dialog(nb) and nb.kernel_status().endswith("| Idle") and api(daemon, "GET", f"/api/kernels/{kernel['id']}")["pids"] != old_pids, 60, "the restarted kernel")
    settle = time.monotonic() + 2
    while time.monotonic() < settle:
        no_crash_dialog(nb)
        time.sleep(0.1)
    assert lab.session_kernel("restart.ipynb")["id"] == kernel["id"], "a restart keeps the kernel"
    c = nb.run("print(secret)")
    assert "NameError" in nb.wait_output(c, "NameError")
    c = nb.run("print('runs again')")
    assert "runs again" in nb.wait_output(c, "runs again")
    no_crash_dialog(nb)


def test_a_kernel_that_dies_is_restarted_and_the_notebook_says_so(lab, daemon, browser):
    """A crash, unlike a requested restart, is what JupyterLab's dialog is for: the
    daemon restarts the kernel as jupyter_server's auto-restart does and says so."""
    nb = Notebook(browser, lab.new_notebook("crash.ipynb", "python3"))
    c = nb.run("import os\nprint('pid', os.getpid())")
    nb.wait_output(c, "pid")
    kernel = lab.session_kernel("crash.ipynb")
    old_pids = api(daemon, "GET", f"/api/kernels/{kernel['id']}")["pids"]
    os.kill(old_pids[0], signal.SIGKILL)
    wait_until(lambda: any(CRASH_DIALOG_TEXT in t for t in nb.dialogs()), 30, "JupyterLab to say the kernel died and restarts")
    nb.accept_dialog("Ok")
    wait_until(lambda: api(daemon, "GET", f"/api/kernels/{kernel['id']}")["pids"] not in ([], old_pids), 60, "a new kernel process")
    nb.wait_kernel_idle(60)
    c = nb.run("print('alive again')")
    assert "alive again" in nb.wait_output(c, "alive again")


def occupy_the_gpu(d: Daemon) -> tuple[str, websocket.WebSocket]:
    """Another user's GPU kernel, directly on the daemon, holding the host's only GPU."""
    k = api(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})
    ws = websocket.create_connection(d.url.replace("http", "ws") + f"/api/kernels/{k['id']}/channels", header=[f"Authorization: token {d.token}"], timeout=60)
    ws.send(json.dumps({"header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "session": "other"}, "content": {"code": "import time; time.sleep(600)"}}))
    wait_until(lambda: api(d, "GET", "/api/v1/gpus")["holders"] == [f"committed:{k['id']}"], 30, "the other kernel to hold the GPU")
    return k["id"], ws


def test_switching_to_a_gpu_kernel_and_waiting_for_a_gpu_as_the_user_sees_it(lab, daemon, browser):
    nb = Notebook(browser, lab.new_notebook("gpu.ipynb", "python3"))
    nb.driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-KernelName").click()
    select = wait_until(lambda: nb.driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog select"), 10, "the kernel selector")[0]
    Select(select).select_by_value(json.dumps({"name": "notebookos-python-1gpu"}, separators=(",", ":")))
    nb.accept_dialog("Select")
    wait_until(lambda: nb.kernel_name() == "Python 3 (NotebookOS, 1 GPU per cell)", 60, "the GPU kernel's name on the toolbar")
    nb.wait_kernel_idle(120)
    kernel = lab.session_kernel("gpu.ipynb")
    assert kernel["name"] == "notebookos-python-1gpu"
    c = nb.run("import os\nprint('gpus per cell:', os.environ['NOTEBOOKOS_GPUS'])")
    assert "gpus per cell: 1" in nb.wait_output(c, "gpus per cell: 1")

    other, other_ws = occupy_the_gpu(daemon)
    try:
        c = nb.run("print('trained on the GPU')")
        # The reason is in the cell's output, in words, while the cell waits.
        shown = nb.wait_output(c, "waiting for 1 GPU(s)", 30)
        assert "all 1 are in use" in shown and "trained on the GPU" not in shown, shown
        assert "*" in nb.prompt_of(c)
        api(daemon, "POST", f"/api/kernels/{other}/interrupt")
        assert "trained on the GPU" in nb.wait_output(c, "trained on the GPU", 60)
    finally:
        other_ws.close()
        api(daemon, "DELETE", f"/api/kernels/{other}")


def test_shutting_the_kernel_down_from_the_kernel_menu(lab, daemon, browser):
    nb = Notebook(browser, lab.new_notebook("shutdown.ipynb", "python3"))
    c = nb.run("print('before shutdown')")
    nb.wait_output(c, "before shutdown")
    kernel = lab.session_kernel("shutdown.ipynb")
    nb.command("Kernel", "kernelmenu:shutdown")
    wait_until(lambda: "No Kernel" in nb.kernel_status(), 30, "the notebook to show no kernel")
    wait_until(lambda: all(k["id"] != kernel["id"] for k in api(daemon, "GET", "/api/kernels")), 30, "the daemon to drop the kernel")
