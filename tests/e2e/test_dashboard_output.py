"""A job's output on its dashboard page, in Debian's Chromium (see test_dashboard.py): a
running job's chunks as they are written, each attempt's apart, and a finished job's."""

from __future__ import annotations

import os
import signal

import httpx
from selenium.webdriver.chrome.webdriver import WebDriver

from tests.e2e.conftest import Cluster
from tests.e2e.test_dashboard import browser, csp_violations, screenshot, text, texts, wait_for
from tests.e2e.test_output import holding

__all__ = ["browser"]  # the fixture, used by name

TASKS = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.output", "BROOK_SSE_PING_SECONDS": "0.5"}
ATTEMPT_1 = "a1-0 a1-1 a1-2 a1-3 a1-4 "
ATTEMPT_2 = "a2-0 a2-1 a2-2 "


def raw_text(driver: WebDriver, css: str) -> list[str]:
    """The text of each element `css` selects, as it is (spaces kept)."""
    found: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", css
    )
    return found


def test_the_job_page_shows_a_running_jobs_output_live_and_a_finished_ones(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    cluster.api(**TASKS)
    disp = cluster.dispatcher(**TASKS)
    job_id = http.post("/jobs", json={"task": "emit_until_killed", "payload": {"n": 5}}).json()[
        "id"
    ]
    browser.get(f"{cluster.api_url}/#/jobs/{job_id}")
    # Attempt 1 emitted five chunks and holds on: they are on the page while it runs.
    wait_for(browser, lambda d: raw_text(d, "#job-output pre") == [ATTEMPT_1], timeout=30)
    wait_for(browser, lambda d: text(d, "#job-status") == "running")  # its own stream
    assert "5 chunks, live" in text(browser, "#job-output-state")
    browser.execute_script("window.notReloaded = true")
    screenshot(browser, "job-output-live.png")
    os.kill(holding(disp, job_id), signal.SIGKILL)  # attempt 2 goes on after its chunks
    wait_for(
        browser, lambda d: raw_text(d, "#job-output pre") == [ATTEMPT_1, ATTEMPT_2], timeout=60
    )
    wait_for(browser, lambda d: "8 chunks, completed" in text(d, "#job-output-state"))
    assert texts(browser, ".output-attempt h3") == ["attempt 1", "attempt 2"]
    assert browser.execute_script("return window.notReloaded") is True  # all of it live
    screenshot(browser, "job-output.png")
    # A finished job's page: its whole output at once.
    browser.refresh()
    wait_for(browser, lambda d: "8 chunks, completed" in text(d, "#job-output-state"))
    assert raw_text(browser, "#job-output pre") == [ATTEMPT_1, ATTEMPT_2]
    assert csp_violations(browser) == []


def test_the_job_page_shows_no_output_panel_for_a_job_without_output(
    cluster: Cluster, browser: WebDriver, http: httpx.Client
) -> None:
    cluster.api(**TASKS)
    cluster.dispatcher(**TASKS)
    job_id = http.post("/jobs", json={"task": "echo", "payload": {"x": 1}}).json()["id"]
    browser.get(f"{cluster.api_url}/#/jobs/{job_id}")
    wait_for(browser, lambda d: text(d, "#job-status") == "completed", timeout=30)
    assert '"x": 1' in text(browser, "#job-result")
    assert browser.execute_script("return document.getElementById('job-output-panel').hidden")
