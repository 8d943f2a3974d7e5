"""The browser for tests/explain: Debian's headless chromium driven by selenium, or a skip that
says why. scripts/setup.sh starts installing chromium in the background (as root, with apt-get)
while the extension builds; a test that needs it waits for that install, bounded."""
import os
import shutil
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLING = os.path.join(ROOT, "build", "chromium.installing")
LOG = os.path.join(ROOT, "build", "chromium.log")
WAIT_S = 240  # the install takes ~25 s; a stuck apt-get must not hold the suite


def _binaries():
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


def _install_under_way():
    """setup.sh's marker, younger than its install's 300 s bound (an older one was left by a killed set-up)."""
    try:
        return time.time() - os.path.getmtime(INSTALLING) < 330
    except OSError:
        return False


def _wait_for_background_install():
    deadline = time.monotonic() + WAIT_S
    while _install_under_way() and time.monotonic() < deadline:
        time.sleep(0.5)


def _why_absent():
    why = "chromium and chromedriver are not installed (scripts/setup.sh installs Debian's packages " \
          "chromium and chromium-driver when run as root with apt-get; COMMLIB_NO_CHROMIUM=1 turns that off)"
    if os.path.exists(LOG):
        tail = open(LOG, errors="replace").read().strip().splitlines()[-2:]
        why += f"; the install's log ({LOG}) ends: {' / '.join(tail)}"
    return why


@pytest.fixture(scope="session")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements.txt)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    binary, driver = _binaries()
    if not (binary and driver):
        _wait_for_background_install()
        binary, driver = _binaries()
    if not (binary and driver):
        pytest.skip(_why_absent())
    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.binary_location = binary
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_page_load_timeout(30)
    d.set_script_timeout(30)
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture
def shots(tmp_path):
    """Where the browser test saves its screenshots: EXPLORER_SCREENSHOTS (docs/img refreshes
    them: docs/explorer.md) or the test's temporary folder."""
    out = os.environ.get("EXPLORER_SCREENSHOTS") or str(tmp_path)
    os.makedirs(out, exist_ok=True)
    return out
