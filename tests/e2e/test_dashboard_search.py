"""The dashboard's job search and its failures view, grouped by error type and task, in a
real headless Chromium (the fixtures of `test_dashboard`): search by task, status, queue,
key, error type and time; retry a group's failed jobs after a confirmation that shows
their count, and cancel a group's retries."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster
from tests.e2e.test_dashboard import browser, screenshot, text, texts, wait_for  # noqa: F401
from tests.e2e.test_events import api, dispatcher
from tests.e2e.test_faults import wait_all_terminal


def search(driver: WebDriver, **fields: str) -> list[str]:
    """Fill the search form (clearing what is not given), submit, and wait for the rows."""
    for name in ("task", "queue", "key", "error"):
        box = driver.find_element(By.CSS_SELECTOR, f"#search-form [name={name}]")
        box.clear()
        if name in fields:
            box.send_keys(fields[name])
    driver.execute_script(
        "document.querySelector('#search-form [name=status]').value = arguments[0];"
        "document.querySelector('#search-form [name=since]').value = arguments[1];",
        fields.get("status", ""),
        fields.get("since", ""),
    )
    # What the last search showed goes, "no job matches" too: what is waited for below is
    # this search's answer (the empty note of the one before would end the wait at once).
    driver.execute_script(
        "document.querySelector('#search-results tbody').replaceChildren();"
        "document.getElementById('search-empty').hidden = true;"
    )
    driver.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
    wait_for(
        driver,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results tbody tr")
        or d.find_element(By.ID, "search-empty").is_displayed(),
    )
    ids: list[str] = driver.execute_script(
        "return [...document.querySelectorAll('#search-results tbody tr')].map(r => r.dataset.id)"
    )
    return ids


async def test_the_dashboard_searches_jobs_by_each_field(
    cluster: Cluster, browser: WebDriver, http: httpx.Client, store: JobStore  # noqa: F811
) -> None:
    api(cluster)
    dispatcher(cluster)
    jobs = [
        {"task": "echo", "key": "acme", "queue": "mail"},
        {"task": "echo", "key": "globex"},
        {"task": "fail", "payload": {"message": "disk full"}, "max_attempts": 1, "key": "acme"},
        {"task": "noop"},
    ]
    ids = [j["id"] for j in http.post("/jobs/batch", json={"jobs": jobs}).json()["jobs"]]
    await wait_all_terminal(store, 4, timeout=60)
    browser.get(cluster.api_url + "/#/search")
    wait_for(browser, lambda d: d.find_element(By.ID, "search").is_displayed())
    assert sorted(search(browser, task="echo")) == sorted(ids[:2])
    assert search(browser, key="acme", status="failed") == [ids[2]]
    assert search(browser, queue="mail") == [ids[0]]
    assert search(browser, error="Demo") == [ids[2]]  # the start of the type: DemoFailure
    assert "disk full" in text(browser, "#search-results tbody tr .msg")
    assert search(browser, error="demo") == []  # case-sensitive
    assert search(browser, status="completed", task="noop") == [ids[3]]
    later = (datetime.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")  # local time
    assert search(browser, since=later) == []
    assert browser.find_element(By.ID, "search-empty").is_displayed()
    screenshot(browser, "search.png")


async def test_the_failures_view_groups_by_error_and_task_and_retries_a_group_after_confirming(
    cluster: Cluster, browser: WebDriver, http: httpx.Client, store: JobStore  # noqa: F811
) -> None:
    api(cluster)
    dispatcher(cluster)
    specs = [{"task": "fail", "payload": {"message": f"disk {i}"}, "max_attempts": 1} for i in range(4)]
    specs += [{"task": "crash", "max_attempts": 1} for _ in range(2)]
    ids = [j["id"] for j in http.post("/jobs/batch", json={"jobs": specs}).json()["jobs"]]
    await wait_all_terminal(store, 6, timeout=90)
    kind = http.get(f"/jobs/{ids[0]}").json()["error"]["type"]
    browser.get(cluster.api_url + "/#/failures")
    row = f"#failure-groups tr[data-type='{kind}'][data-task='fail']"
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row))
    assert len(texts(browser, "#failure-groups tbody tr")) == 2  # fail, and crash
    assert text(browser, f"{row} .failed-count") == "4"
    assert "Traceback" in browser.execute_script(
        "return document.querySelector(arguments[0]).textContent", f"{row} pre.traceback"
    )
    # Nothing of the group waits for a retry: its "cancel these" has nothing to cancel.
    assert browser.find_element(By.CSS_SELECTOR, f"{row} button[data-bulk=cancel]").get_attribute(
        "disabled"
    ) is not None
    screenshot(browser, "failures.png")
    # Retry these: a confirmation with the count first; going back changes nothing.
    browser.find_element(By.CSS_SELECTOR, f"{row} button[data-bulk=retry]").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "bulk-dialog").get_attribute("open") is not None)
    assert text(browser, "#bulk-count") == "This will retry 4 jobs."
    browser.find_element(By.CSS_SELECTOR, "#bulk-form button[value=cancel]").click()
    assert {http.get(f"/jobs/{i}").json()["attempts"] for i in ids[:4]} == {1}
    browser.find_element(By.CSS_SELECTOR, f"{row} button[data-bulk=retry]").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "bulk-dialog").get_attribute("open") is not None)
    browser.find_element(By.ID, "bulk-confirm").click()
    wait_for(browser, lambda d: text(d, "#bulk-result") == "retry: 4 jobs")
    # They ran again and failed again: a second attempt each; the crashes were not touched.
    wait_for(
        browser,
        lambda d: all(http.get(f"/jobs/{i}").json()["attempts"] == 2 for i in ids[:4]),
        timeout=60,
    )
    assert {http.get(f"/jobs/{i}").json()["attempts"] for i in ids[4:]} == {1}
