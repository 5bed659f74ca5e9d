"""JupyterLab from the venv with `--gateway-url` at notebookosd (or at a load
balancer in front of several), and headless Debian Chromium driven by Selenium:
what a data scientist runs, driven as they would drive it.

Chromium and ChromeDriver are Debian's (`chromium`, `chromium-driver`, installed by
scripts/install-deps.sh); Selenium is told their paths so it never tries to
download a driver (CI has no network beyond the package registries).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

from nbos_harness import free_port

# Screenshots and logs of failed tests, and figures the tests measure.
ARTIFACTS_DIR = Path(os.environ.get("NBOS_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "target" / "test-artifacts" / "browser")
CHROMIUM = os.environ.get("NBOS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("NBOS_CHROMEDRIVER", "/usr/bin/chromedriver")
# The text JupyterLab shows when the server says a kernel restarted on its own.
CRASH_DIALOG_TEXT = "appears to have died"
# What is open now, for the screenshots and logs of a failed test (conftest.py).
OPEN_BROWSERS: list[webdriver.Chrome] = []
OPEN_LABS: list["Lab"] = []


def wait_until(predicate, timeout: float, what: str, every: float = 0.1):
    """Polls `predicate` (exceptions of a re-rendering page count as 'not yet')."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (StaleElementReferenceException, WebDriverException) as e:
            last_error = e
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


class Lab:
    """`jupyter lab --gateway-url=URL` with its own root, settings and token."""

    def __init__(self, gateway_url: str, gateway_token: str, root: Path, extra_args: list[str] | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.token = uuid.uuid4().hex
        self.url = f"http://127.0.0.1:{self.port}"
        settings = root / ".lab-settings"
        # No news prompt or other first-run toasts over the notebook.
        notify = settings / "@jupyterlab" / "apputils-extension"
        notify.mkdir(parents=True, exist_ok=True)
        (notify / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        self.log_path = root / ".lab.log"
        self.log = open(self.log_path, "wb")
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
            "JUPYTER_CONFIG_DIR": str(root / ".config"),
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces"),
        }
        env.pop("JUPYTER_GATEWAY_URL", None)
        env.pop("JUPYTER_GATEWAY_AUTH_TOKEN", None)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                f"--gateway-url={gateway_url}",
                f"--GatewayClient.auth_token={gateway_token}",
                f"--IdentityProvider.token={self.token}",
                "--allow-root",
                "--no-browser",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.root_dir={root}",
                *(extra_args or []),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(self.log_path.read_text())
            try:
                urllib.request.urlopen(f"{self.url}/api?token={self.token}", timeout=2)
                return True
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(up, 90, "JupyterLab to start", every=0.2)
        OPEN_LABS.append(self)

    def new_notebook(self, name: str, kernel: str) -> str:
        """Writes an empty notebook bound to kernelspec `kernel`; returns its URL."""
        nb = {
            "cells": [{"cell_type": "code", "execution_count": None, "id": "c0", "metadata": {}, "outputs": [], "source": ""}],
            "metadata": {"kernelspec": {"display_name": kernel, "language": "python", "name": kernel}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (self.root / name).write_text(json.dumps(nb))
        # `reset`: a workspace with only this notebook open (no tabs of earlier tests).
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"

    def session_kernel(self, notebook: str) -> dict:
        """The kernel of `notebook` as JupyterLab's server knows it (same id as on the gateway)."""
        with urllib.request.urlopen(f"{self.url}/api/sessions?token={self.token}", timeout=30) as r:
            sessions = json.loads(r.read())
        return next(s["kernel"] for s in sessions if s["path"] == notebook)

    def stop(self) -> None:
        if self in OPEN_LABS:
            OPEN_LABS.remove(self)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def chromium() -> webdriver.Chrome:
    """Headless Debian Chromium through Debian's ChromeDriver."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    OPEN_BROWSERS.append(driver)
    return driver


def close(driver: webdriver.Chrome) -> None:
    if driver in OPEN_BROWSERS:
        OPEN_BROWSERS.remove(driver)
    driver.quit()


class Notebook:
    """A notebook open in JupyterLab, driven through the page as a user would."""

    def __init__(self, driver: webdriver.Chrome, url: str) -> None:
        self.driver = driver
        driver.get(url)
        wait_until(lambda: self.cells(), 120, "the notebook to open")
        self.wait_kernel_idle(180)

    def panel(self) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden)")

    def cells(self) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell")

    def kernel_status(self) -> str:
        """What the status bar shows for the kernel, e.g. `Python 3 (NotebookOS) | Idle`."""
        el = self.driver.find_elements(By.CSS_SELECTOR, "#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel']")
        return el[0].text if el else ""

    def kernel_name(self) -> str:
        """The kernel's display name on the notebook's toolbar."""
        el = self.driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-KernelName")
        return el[0].text if el else ""

    def wait_kernel_idle(self, timeout: float = 60) -> None:
        wait_until(lambda: self.kernel_status().endswith("| Idle"), timeout, "the kernel to be idle")

    def dialogs(self) -> list[str]:
        return [d.text for d in self.driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog")]

    def run(self, code: str) -> WebElement:
        """Types `code` into the last cell and runs it with Shift+Enter; returns that cell."""
        cell = self.cells()[-1]
        editor = cell.find_element(By.CSS_SELECTOR, ".cm-content")
        editor.click()
        editor.send_keys(code)
        editor.send_keys(Keys.SHIFT, Keys.ENTER)
        return cell

    def output_of(self, cell: WebElement) -> str:
        return "\n".join(o.text for o in cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output"))

    def wait_output(self, cell: WebElement, text: str, timeout: float = 60) -> str:
        return wait_until(lambda: text in self.output_of(cell) and self.output_of(cell), timeout, f"{text!r} in the cell's output (it shows {self.output_of(cell)!r})")

    def prompt_of(self, cell: WebElement) -> str:
        """The execution prompt: `[ ]:`, `[*]:` while running, `[3]:` when done."""
        return cell.find_element(By.CSS_SELECTOR, ".jp-InputPrompt").text

    def wait_done(self, cell: WebElement, timeout: float = 60) -> str:
        return wait_until(lambda: (p := self.prompt_of(cell)) and "*" not in p and any(ch.isdigit() for ch in p) and p, timeout, "the cell to finish")

    def command(self, menu: str, item_command: str) -> None:
        """Clicks a menu of the top bar and the item that runs `item_command`."""
        bar = self.driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")
        wait_until(lambda: [b for b in self.driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if b.text == menu], 10, f"the {menu} menu")[0].click()
        item = wait_until(lambda: self.driver.find_elements(By.CSS_SELECTOR, f'.lm-Menu-item[data-command="{item_command}"]'), 10, f"menu item {item_command}")[0]
        item.click()
        del bar

    def accept_dialog(self, button_text: str, timeout: float = 10) -> None:
        def button():
            for b in self.driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog .jp-Dialog-button"):
                if b.text.strip() == button_text:
                    return b
            return None

        wait_until(button, timeout, f"a dialog with a {button_text!r} button").click()
        wait_until(lambda: not self.dialogs(), timeout, "the dialog to close (dialogs shown: {})".format(self.dialogs()))
