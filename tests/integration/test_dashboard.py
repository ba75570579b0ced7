"""The web dashboard (GET /dashboard/) in a real headless browser against a live broker.

Debian's chromium and chromium-driver (tests/debian-packages.sh installs them), driven by
selenium, on a broker with a TCP listener running paper job set 3 (Figure 5) as emulated
jobs. The screenshots are saved to the test's tmp_path and to test-artifacts/ at the
repository's root (git-ignored), for people to look at after CI.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import FINAL, require_debian
from tests.scenarios import jobset

pytestmark = pytest.mark.daemon

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run")


def _get(url: str, path: str, headers: dict | None = None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.fixture
def listening(daemon_factory):
    d = daemon_factory("--listen", "127.0.0.1:0", time_scale=0.04)
    url = (d.state_dir / "endpoint").read_text().strip()
    return d, url, (d.state_dir / "token").read_text().strip()


def marble(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MARBLE_URL", "MARBLE_TOKEN")}
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
                           str(state_dir), *args], env=env, capture_output=True, text=True,
                          timeout=30)


def test_the_page_needs_no_token_and_the_api_still_does(listening):
    d, url, token = listening
    status, headers, body = _get(url, "/dashboard")
    assert status == 301 and headers["Location"] == "/dashboard/"
    for path, kind in (("/dashboard/", "text/html"), ("/dashboard/index.html", "text/html"),
                       ("/dashboard/app.js", "text/javascript"),
                       ("/dashboard/style.css", "text/css")):
        status, headers, body = _get(url, path)
        assert status == 200 and headers["Content-Type"].startswith(kind), path
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert token.encode() not in body  # the files hold no data
    status, _, body = _get(url, "/dashboard/marble.db")
    assert status == 404 and "no file" in json.loads(body)["error"]
    for path in ("/v1/status", "/v1/jobs", "/v1/runs", "/dashboard/../v1/jobs",
                 "/dashboard/%2e%2e/v1/jobs"):
        status, _, body = _get(url, path)
        assert status == 401 and "token" in json.loads(body)["error"], path
    status, _, body = _get(url, "/v1/status", {"Authorization": f"Bearer {token}"})
    assert status == 200 and json.loads(body)["pid"] == d.proc.pid


def test_marble_dashboard_prints_the_address_with_the_token(listening):
    d, url, token = listening
    out = marble(d.state_dir, "dashboard")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{url}/dashboard/#token={token}"
    assert "ssh" in out.stderr and "keep it to yourself" in out.stderr
    doc = json.loads(marble(d.state_dir, "dashboard", "--json").stdout)
    assert doc["endpoint"] == url and doc["pid"] == d.proc.pid


def test_marble_dashboard_without_a_listener_says_how_to_get_one(daemon, tmp_path):
    out = marble(daemon.state_dir, "dashboard")
    assert out.returncode == 1
    assert "no TCP listener" in out.stderr and "marbled --listen 127.0.0.1:0" in out.stderr
    out = marble(tmp_path / "none", "dashboard")
    assert out.returncode == 1 and "no broker runs" in out.stderr


@pytest.fixture
def browser(tmp_path):
    require_debian("chromium", "chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.add_argument("--window-size=1440,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def screenshot(driver, tmp_path: Path, name: str) -> Path:
    """The whole page as a PNG, in tmp_path and in test-artifacts/."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1440, max(900, min(int(height) + 20, 3000)))
    path = tmp_path / name
    assert driver.save_screenshot(str(path))
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(path, ARTIFACTS / name)
    return path


def test_the_dashboard_shows_the_jobs_the_timeline_and_updates_live(listening, browser,
                                                                    tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    d, url, token = listening
    started = time.monotonic()

    def wait(what: str, check, timeout: float = 60):
        return WebDriverWait(browser, timeout, poll_frequency=0.2).until(
            lambda _: check(), message=f"the page never showed {what}")

    def page_states() -> dict[int, str]:
        return browser.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#jobs tr[data-job-id]')]"
            ".map(r => [r.dataset.jobId, r.querySelector('td.state .badge').textContent]))")

    def bars() -> set[int]:
        return {int(e.get_attribute("data-run-id"))
                for e in browser.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")}

    def api_runs() -> set[int]:
        return {r["id"] for r in d.client.get("/v1/runs")["runs"]}

    browser.get(f"{url}/dashboard#token={token}")  # the redirect keeps the fragment
    wait("the broker", lambda: str(d.proc.pid) in browser.find_element(By.ID, "broker").text)
    assert "token" not in browser.current_url  # out of the address bar and the screenshots
    browser.execute_script("window.sameDocument = true")  # gone if the page reloads

    d.submit(*jobset(3))  # Figure 5, and a job that waits for job 1 and for GPUs
    d.submit({"model": "resnet-50", "steps": 300, "emulate": True, "after": [1],
              "name": "resnet-50-tune"})
    wait("every job", lambda: set(page_states()) == {"1", "2", "3", "4"})
    wait("job 1 running", lambda: page_states()["1"] == "running")
    names = browser.find_element(By.ID, "jobs").text
    assert all(name in names for name in ("resnet-50", "inception-v3", "vgg-16",
                                          "resnet-50-tune"))
    assert "#4 resnet-50-tune" in browser.find_element(By.ID, "queue").text
    wait("a bar per run", lambda: bars() and bars() == api_runs(), timeout=20)

    # the job clicked shows its runs and events
    browser.find_element(By.CSS_SELECTOR, "#jobs tr[data-job-id='2']").click()
    wait("job 2's detail", lambda: "#2 inception-v3" in browser.find_element(By.ID, "detail").text)
    # ... and where it runs (an API client named none: the broker's working directory)
    assert f"directory\n{os.getcwd()}\n" in browser.find_element(By.ID, "detail").text

    # job 1 ends: the page follows without a reload
    wait("job 1 done", lambda: page_states()["1"] == "done")
    assert browser.execute_script("return window.sameDocument === true")
    assert int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-polls")) > 2

    # job 2 was a secondary, suspended and promoted: two runs, their events in its detail
    wait("job 2 promoted", lambda: len(browser.find_elements(
        By.CSS_SELECTOR, "#detail tr[data-run-id]")) == 2)
    events = browser.find_element(By.CSS_SELECTOR, "#detail .events").text
    assert "suspended" in events and "resumed" in events
    wait("a bar per run", lambda: bars() == api_runs(), timeout=20)
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline rect.bar.secondary")
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline rect.bar.primary")
    d.wait_for(lambda: d.client.get("/v1/jobs/2")["step"] >= 1100, what="job 2 half-way")
    polls = int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-polls"))
    wait("a new poll", lambda: int(browser.find_element(By.TAG_NAME, "body")
                                   .get_attribute("data-polls")) > polls)
    screenshot(browser, tmp_path, "dashboard-live.png")

    # the end: every job done, every run a bar, the schedule of Figure 5
    wait("every job done", lambda: set(page_states().values()) == {"done"}, timeout=90)
    assert {j["state"] for j in d.jobs()} <= FINAL
    wait("a bar per run", lambda: bars() == api_runs(), timeout=20)
    assert browser.execute_script("return window.sameDocument === true")
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)  # every job undimmed
    wait("the detail closed", lambda: "Click a job" in browser.find_element(By.ID, "detail").text)
    screenshot(browser, tmp_path, "dashboard-done.png")

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    print(f"dashboard test: {time.monotonic() - started:.1f} s with the browser")


def test_the_log_tab_shows_a_jobs_output_and_follows_it(listening, browser, tmp_path):
    """The job panel's log tab: the latest run's output (the tail, as `marble logs -n`),
    followed while the tab is open; stdout or stderr."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, url, token = listening
    printer = "for i in $(seq 1 60); do echo line $i; sleep 0.2; done; echo oops >&2"
    (job,) = d.submit({"gpus": 1, "name": "printer", "command": ["sh", "-c", printer]})

    def wait(what: str, check, timeout: float = 30):
        return WebDriverWait(browser, timeout, poll_frequency=0.1).until(
            lambda _: check(), message=f"the page never showed {what}")

    # The panel is drawn anew at every poll: read and click in one script, not through
    # an element found before (it would be stale)
    def text(selector: str) -> str:
        return browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''",
            selector)

    def click(selector: str) -> None:
        browser.execute_script("document.querySelector(arguments[0]).click()", selector)

    def log_text() -> str:
        return text("#detail pre.log")

    browser.get(f"{url}/dashboard#token={token}")
    browser.execute_script("window.sameDocument = true")
    wait("the job", lambda: browser.find_elements(By.CSS_SELECTOR,
                                                  f"#jobs tr[data-job-id='{job['id']}']"))
    browser.find_element(By.CSS_SELECTOR, f"#jobs tr[data-job-id='{job['id']}']").click()
    wait("the job's detail", lambda: "printer" in browser.find_element(By.ID, "detail").text)
    click("#detail [data-tab='log']")
    wait("its output", lambda: log_text().startswith("line 1\n"))
    partial = log_text()
    assert "line 60" not in partial  # it was still printing: what follows comes by polling
    wait("the output as it grows", lambda: "line 60" in log_text())
    assert log_text().splitlines() == [f"line {i}" for i in range(1, 61)]
    (run,) = d.runs()
    assert text("#detail .log-run").startswith(f"run {run['id']} (job {job['id']}): primary, "
                                               "1 GPU on ")
    screenshot(browser, tmp_path, "dashboard-log.png")
    click("#detail [data-stream='stderr']")
    wait("its stderr", lambda: log_text() == "oops\n")
    click("#detail [data-tab='details']")
    wait("the details again", lambda: "Events" in text("#detail") and not log_text())
    assert browser.execute_script("return window.sameDocument === true")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_the_header_says_when_the_store_refuses_writes(listening, browser):
    """While the store refuses writes (lifecycle I4), the header shows how many writes are
    held and, on hover, why. The broker's real status, with its storage part set as a full
    disk sets it (tests/integration/test_storage_full.py fills a real one), drawn by the
    page's own renderHeader in the browser."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, url, token = listening
    browser.get(f"{url}/dashboard#token={token}")
    WebDriverWait(browser, 30).until(
        lambda _: str(d.proc.pid) in browser.find_element(By.ID, "broker").text)
    status = d.client.get("/v1/status")
    assert status["storage"] == {"ok": True, "reason": None, "held": 0}
    assert browser.execute_script("return document.getElementById('storage')") is None
    full = {**status, "storage": {"ok": False, "held": 3, "reason":
                                  "the state directory's disk is full: free space on /scratch"}}
    chip = browser.execute_script(
        "renderHeader(arguments[0]); const e = document.getElementById('storage');"
        "return e && [e.textContent, e.title]", full)
    assert chip == ["storage: 3 write(s) held", full["storage"]["reason"]]


def test_the_page_shows_a_window_of_a_long_history(listening, browser):
    """#window=SECONDS: the page asks for what is unfinished and what ended in that last
    stretch (?since=), draws only those jobs and runs, and says how many ended before."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, url, token = listening
    d.client.post("/v1/jobs", {"jobs": [{"gpus": 1, "command": ["true"]}] * 12})
    d.wait_for(lambda: all(j["state"] == "done" for j in d.jobs()), what="12 jobs done")
    time.sleep(2.5)  # they ended over 2 s ago
    d.submit({"gpus": 1, "command": ["sleep", "60"], "name": "live"})
    d.wait_for(lambda: d.jobs()[-1]["state"] == "running", what="the live job running")
    browser.get(f"{url}/dashboard#token={token}&window=2")

    def shown() -> tuple[list[str], set[int], str]:
        return (browser.execute_script(
            "return [...document.querySelectorAll('#jobs tr[data-job-id]')]"
            ".map(r => r.dataset.jobId)"),
            {int(e.get_attribute("data-run-id"))
             for e in browser.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")},
            browser.find_element(By.ID, "jobs-note").text)

    WebDriverWait(browser, 30, poll_frequency=0.2).until(
        lambda _: shown()[0] == ["13"], message=f"the page showed {shown()}")
    jobs, bars, note = shown()
    (live_run,) = [r["id"] for r in d.client.get("/v1/runs")["runs"] if r["job_id"] == 13]
    assert bars == {live_run}
    assert "12 more ended over 2.0 s ago" in note, note
    d.client.post("/v1/jobs/13/cancel")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
