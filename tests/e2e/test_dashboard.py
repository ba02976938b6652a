"""The dashboard in a real headless browser: Debian's Chromium, driven by Selenium through
Debian's chromedriver (nothing downloads a browser). Screenshots go to `.brook/artifacts/`.

`make test` installs both packages when they are missing. Without them these tests skip
with a message naming the packages, except under CI (`CI` set), where they fail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pymongo import MongoClient
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import ROOT
from tests.e2e.conftest import Cluster
from tests.e2e.test_events import api, dispatcher
from tests.support.poison import not_utf8

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = ROOT / ".brook" / "artifacts"
TOKEN = "dashboard-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    missing = [
        package
        for package, path in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER))
        if not os.path.exists(path)
    ]
    if missing:
        message = (
            f"BROWSER TESTS NOT RUN: the Debian package(s) {' and '.join(missing)} are missing;"
            " `make test` installs them (apt-get install chromium chromium-driver)"
        )
        pytest.fail(message)  # never a skip: a browser test that did not run proves nothing
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1200",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP reports land there
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: WebDriver, condition: Any, timeout: float = 20) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))


def texts(driver: WebDriver, css: str) -> list[str]:
    """The text of every element `css` selects, read at once (the page re-renders live, so
    element handles go stale)."""
    found: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim())", css
    )
    return found


def text(driver: WebDriver, css: str) -> str:
    found = texts(driver, css)
    return found[0] if found else ""


def screenshot(driver: WebDriver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / name))


def set_progress(cluster: Cluster, job_id: str, fraction: float, message: str) -> None:
    """What `ctx.progress` stores on the job (written here directly: this test is about the
    page, not about how a task reports)."""
    client: MongoClient[dict[str, Any]] = MongoClient(cluster.settings.mongo_uri)
    try:
        progress = {"fraction": fraction, "message": message, "at": datetime.now(UTC)}
        client[cluster.settings.db]["jobs"].update_one(
            {"_id": job_id}, {"$set": {"progress": progress}}
        )
    finally:
        client.close()


def test_the_dashboard_shows_counts_and_progress_live_and_cancels_from_the_page(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    api(cluster, BROOK_API_TOKEN=TOKEN, BROOK_METRICS_CACHE_SECONDS="0.2")
    http.headers.update(AUTH)
    browser.get(cluster.api_url + "/")
    # The token is asked once, kept in this tab's sessionStorage, never in the URL.
    wait_for(
        browser, lambda d: d.find_element(By.ID, "token-dialog").get_attribute("open") is not None
    )
    browser.find_element(By.ID, "token-input").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    wait_for(browser, lambda d: text(d, "#count-pending .n") == "0")
    wait_for(browser, lambda d: text(d, "#live") == "live")
    assert browser.execute_script("return sessionStorage.getItem('brook.token')") == TOKEN
    assert TOKEN not in browser.current_url
    browser.execute_script("window.notReloaded = true")

    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    for _ in range(5):
        assert http.post("/jobs", json={"task": "noop", "run_at": later}).status_code == 202
    wait_for(browser, lambda d: text(d, "#count-pending .n") == "5")

    dispatcher(cluster)
    job_id = http.post("/jobs", json={"task": "sleep", "payload": {"seconds": 60}}).json()["id"]
    row = f"#running tr[data-id='{job_id}']"
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row))
    wait_for(browser, lambda d: text(d, "#count-running .n") == "1")
    bar = f"{row} .progress"
    for fraction, message in ((0.25, "a quarter"), (0.75, "three quarters")):
        set_progress(cluster, job_id, fraction, message)
        wait_for(
            browser,
            lambda d, f=fraction: (
                d.find_element(By.CSS_SELECTOR, bar).get_attribute("data-fraction") == str(f)
            ),
        )
        assert message in text(browser, bar)
    width = browser.execute_script(
        "return document.querySelector(arguments[0]).style.width", f"{bar} .bar"
    )
    assert width == "75%"
    screenshot(browser, "dashboard.png")

    browser.find_element(By.CSS_SELECTOR, f"{row} button[data-cancel]").click()
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, row))
    wait_for(browser, lambda d: text(d, "#count-cancelled .n") == "1")
    assert http.get(f"/jobs/{job_id}").json()["status"] == "cancelled"
    assert browser.execute_script("return window.notReloaded") is True  # all of it live


def test_the_job_page_shows_history_payload_result_and_errors(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    api(cluster)
    dispatcher(cluster)
    failed = http.post(
        "/jobs", json={"task": "fail", "payload": {"message": "disk full"}, "max_attempts": 2}
    ).json()["id"]
    done = http.post("/jobs", json={"task": "echo", "payload": {"greeting": "hi"}}).json()["id"]
    browser.get(f"{cluster.api_url}/#/jobs/{failed}")
    wait_for(browser, lambda d: text(d, "#job-status") == "failed", timeout=30)
    assert "DemoFailure: disk full" in text(browser, "#job-error")
    assert "Traceback" in text(browser, "#job-traceback")
    column = "#job-history tbody td:nth-child(2)"
    assert texts(browser, column) == ["pending", "running", "pending", "running", "failed"]
    assert '"message": "disk full"' in text(browser, "#job-payload")
    assert not browser.find_element(By.ID, "job-cancel").is_displayed()
    screenshot(browser, "job.png")
    # Retry (the API offers it): a new attempt budget, the same history, followed live.
    browser.find_element(By.ID, "job-retry").click()
    wait_for(
        browser,
        lambda d: texts(d, column).count("failed") == 2 and text(d, "#job-status") == "failed",
        timeout=60,
    )
    history = texts(browser, column)
    assert history[:5] == ["pending", "running", "pending", "running", "failed"]
    assert history[5] == "pending" and history[-1] == "failed"
    assert http.get(f"/jobs/{failed}").json()["max_attempts"] == 4
    browser.get(f"{cluster.api_url}/#/jobs/{done}")
    browser.refresh()
    wait_for(browser, lambda d: text(d, "#job-status") == "completed")
    assert '"greeting": "hi"' in text(browser, "#job-result")


def csp_violations(driver: WebDriver) -> list[str]:
    return [
        str(entry.get("message"))
        for entry in driver.get_log("browser")  # type: ignore[no-untyped-call]
        if "Content Security Policy" in str(entry.get("message"))
    ]


def test_a_read_only_token_sees_the_dashboard_without_any_action(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    api(cluster, BROOK_API_TOKEN=TOKEN, BROOK_API_READ_TOKEN="read-only")
    dispatcher(cluster)
    http.headers.update(AUTH)
    running = http.post("/jobs", json={"task": "sleep", "payload": {"seconds": 60}}).json()["id"]
    failed = http.post("/jobs", json={"task": "fail", "max_attempts": 1}).json()["id"]
    browser.get(cluster.api_url + "/")
    wait_for(browser, lambda d: d.find_element(By.ID, "token-dialog").get_attribute("open") is not None)
    browser.find_element(By.ID, "token-input").send_keys("read-only")
    browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    row = f"#running tr[data-id='{running}']"
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), timeout=30)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#failures li[data-id='{failed}']"))
    assert not browser.find_elements(By.CSS_SELECTOR, f"{row} button")
    assert not browser.find_elements(By.CSS_SELECTOR, "#failures button, #queues button")
    browser.get(f"{cluster.api_url}/#/jobs/{running}")
    browser.refresh()
    wait_for(browser, lambda d: text(d, "#job-status") == "running")
    assert not browser.find_element(By.ID, "job-cancel").is_displayed()
    browser.get(f"{cluster.api_url}/#/jobs/{failed}")
    wait_for(browser, lambda d: text(d, "#job-status") == "failed")
    assert not browser.find_element(By.ID, "job-retry").is_displayed()
    assert csp_violations(browser) == []
    assert http.get(f"/jobs/{running}").json()["status"] == "running"


def test_the_api_docs_render_offline_from_packaged_assets_under_a_strict_policy(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    api(cluster)
    for path in ("/", "/docs", "/redoc"):
        resp = http.get(path)
        policy = resp.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, path
        assert "unsafe-eval" not in policy and "cdn" not in policy
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["x-frame-options"] == "DENY"
        assert "https://" not in resp.text and "<script>" not in resp.text, path
    browser.get(cluster.api_url + "/docs")
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) > 5, timeout=30)
    assert "/jobs/{job_id}/cancel" in text(browser, ".swagger-ui")
    assert csp_violations(browser) == []
    screenshot(browser, "docs.png")
    browser.get(cluster.api_url + "/redoc")
    wait_for(browser, lambda d: "/jobs/{job_id}/cancel" in text(d, "body"), timeout=30)
    screenshot(browser, "redoc.png")
    # ReDoc's own logo is on its CDN: the policy keeps it out, and that is all it blocks.
    assert all("https://cdn.redoc.ly/" in v for v in csp_violations(browser))
    browser.get(cluster.api_url + "/")
    wait_for(browser, lambda d: text(d, "#live") == "live")
    assert csp_violations(browser) == []


def test_the_job_page_shows_what_a_suspended_job_waits_for_and_its_steps(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    tasks = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.durable"}
    cluster.api(**tasks)
    cluster.dispatcher(**tasks)
    job_id = http.post("/jobs", json={"task": "waiter", "payload": {"key": "dash:1"}}).json()["id"]
    browser.get(f"{cluster.api_url}/#/jobs/{job_id}")
    wait_for(browser, lambda d: "a signal on “dash:1”" in text(d, "#job-waiting"), timeout=30)
    assert text(browser, "#job-status") == "pending"
    screenshot(browser, "job-waiting.png")
    assert http.post("/signals/dash:1", json={"payload": {"ok": True}}).json() == {"woken": 1}
    wait_for(browser, lambda d: text(d, "#job-status") == "completed", timeout=30)
    assert not browser.find_element(By.ID, "job-waiting-panel").is_displayed()
    steps = texts(browser, "#job-steps tbody td:nth-child(1)")
    assert steps == ["signal:dash:1#1"]
    assert texts(browser, "#job-steps tbody td:nth-child(4)")[0].endswith("B")
    screenshot(browser, "job-steps.png")


def test_the_dashboard_shows_each_trigger_its_follower_lag_jobs_made_skipped_and_pauses_it(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    triggered = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.triggered"}
    cluster.api(**triggered)
    disp = cluster.dispatcher(**triggered)
    disp.wait_for_event("trigger.opened", timeout=30)
    client: MongoClient[dict[str, Any]] = MongoClient(cluster.settings.mongo_uri)
    try:
        orders = client[cluster.settings.db]["orders"]
        orders.insert_many([{"_id": n, "status": "paid"} for n in range(3)])
        browser.get(cluster.api_url + "/")
        row = "#triggers tr[data-trigger='paid-orders']"
        wait_for(browser, lambda d: text(d, f"{row} .jobs-made") == "3", timeout=30)
        assert text(browser, f"{row} .follower").split(":")[-2] == str(disp.pid)
        assert text(browser, f"{row} .lag").endswith(" s")
        orders.insert_many([{"_id": n, "status": "paid"} for n in range(3, 5)])
        wait_for(browser, lambda d: text(d, f"{row} .jobs-made") == "5", timeout=30)  # refreshed
        assert text(browser, f"{row} .skipped") == "0"
        orders.insert_one(not_utf8("unreadable"))  # a change that cannot become a job
        wait_for(browser, lambda d: text(d, f"{row} .skipped") == "1", timeout=30)
        title = browser.find_element(By.CSS_SELECTOR, f"{row} .skipped").get_attribute("title")
        assert title is not None and "cannot be read" in title, title
        screenshot(browser, "dashboard-triggers.png")
        browser.find_element(By.CSS_SELECTOR, f"{row} button").click()
        wait_for(browser, lambda d: "(paused)" in text(d, row))
        assert http.get("/triggers").json()["triggers"][0]["paused"] is True
    finally:
        client.close()


def test_the_job_page_links_a_rerun_and_its_source_and_marks_the_carried_steps(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    tasks = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.durable"}
    cluster.api(**tasks)
    cluster.dispatcher(**tasks)
    spec = {"task": "paid_steps", "payload": {"fail_at": 4}, "max_attempts": 1}
    source = http.post("/jobs", json=spec).json()["id"]
    browser.get(f"{cluster.api_url}/#/jobs/{source}")
    wait_for(browser, lambda d: text(d, "#job-status") == "failed", timeout=30)
    rerun = http.post(f"/jobs/{source}/rerun", json={"from_step": "step-3", "payload": {}})
    rerun_id = rerun.json()["id"]
    browser.get(f"{cluster.api_url}/#/jobs/{rerun_id}")
    wait_for(browser, lambda d: text(d, "#job-status") == "completed", timeout=30)
    row = "#job-fields tr.links"
    assert texts(browser, f"{row} th") == ["rerun_of"]
    assert browser.find_element(By.CSS_SELECTOR, f"{row} a").get_attribute("title") == source
    assert texts(browser, "#job-steps tbody td:nth-child(5)") == [
        "0 (carried)",
        "0 (carried)",
        "1",
        "1",
        "1",
    ]
    screenshot(browser, "job-rerun.png")
    browser.find_element(By.CSS_SELECTOR, f"{row} a").click()  # to the job it reruns
    wait_for(browser, lambda d: text(d, "#job-id") == source, timeout=30)
    wait_for(browser, lambda d: texts(d, f"{row} th") == ["reruns"], timeout=30)
    assert browser.find_element(By.CSS_SELECTOR, f"{row} a").get_attribute("title") == rerun_id


def test_the_dashboard_shows_each_quota_and_a_job_a_quota_holds_back(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    tasks = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.quotas"}
    cluster.api(**tasks)
    cluster.dispatcher(**tasks)
    put = http.put("/quotas/openai:gpt-4o", json={"units": {"limit": 100, "per_seconds": 60}})
    assert put.status_code == 200, put.text
    spec = {"task": "quota_sleep", "payload": {"seconds": 0}, "quotas": {"openai:gpt-4o": 100}}
    first = http.post("/jobs", json=spec).json()["id"]
    wait_for(browser, lambda d: http.get(f"/jobs/{first}").json()["status"] == "completed")
    held = http.post("/jobs", json=spec).json()["id"]
    browser.get(f"{cluster.api_url}/#/jobs/{held}")
    wait_for(browser, lambda d: "room in quota “openai:gpt-4o”" in text(d, "#job-waiting"))
    browser.get(f"{cluster.api_url}/")
    row = '#quotas tr[data-quota="openai:gpt-4o"] td'
    wait_for(browser, lambda d: len(texts(d, row)) == 8)
    cells = texts(browser, row)
    assert cells[0] == "openai:gpt-4o" and cells[1] == "units 100/60s"
    assert cells[2] == "units 100" and cells[7] == "100"
    screenshot(browser, "quotas.png")
