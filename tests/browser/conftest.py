"""Browser tests: a failing test leaves a screenshot of every open browser and the
JupyterLab log in $NBOS_TEST_ARTIFACTS (default target/test-artifacts/browser)."""

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "jupyter"))
# The test kit (launcher, config, run_cell) shared with the other suites.
sys.path.insert(0, str(HERE.parent / "support" / "python"))

import lab_harness  # noqa: E402

ARTIFACTS = lab_harness.ARTIFACTS_DIR


@pytest.fixture(scope="session", autouse=True)
def chromium_installed():
    """Without Chromium and its driver the browser tests cannot run: they fail under
    NBOS_REQUIRE_PRIVILEGED=1 (CI, where scripts/install-deps.sh installs them) and
    are skipped elsewhere, saying why."""
    missing = [p for p in (lab_harness.CHROMIUM, lab_harness.CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        reason = f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver (scripts/install-deps.sh)"
        if os.environ.get("NBOS_REQUIRE_PRIVILEGED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for n, driver in enumerate(lab_harness.OPEN_BROWSERS):
        path = ARTIFACTS / f"{item.name}-{n}.png"
        try:
            driver.save_screenshot(str(path))
            report.sections.append(("browser", f"screenshot: {path}"))
        except Exception as e:  # a dead browser must not hide the test's own failure
            report.sections.append(("browser", f"no screenshot ({e})"))
    for n, lab in enumerate(lab_harness.OPEN_LABS):
        shutil.copy(lab.log_path, ARTIFACTS / f"{item.name}-jupyterlab-{n}.log")
    # A cluster test's daemons: their logs too.
    cluster = item.funcargs.get("cluster")
    if cluster is not None:
        (ARTIFACTS / f"{item.name}-daemons.log").write_text(cluster.logs())
    # A JupyterHub test's Hub and daemon (hub_harness.HubSetup).
    hub_setup = item.funcargs.get("setup")
    if hub_setup is not None and hasattr(hub_setup, "logs"):
        (ARTIFACTS / f"{item.name}-hub-and-daemon.log").write_text(hub_setup.logs())
