"""What the API enforces, said by its OpenAPI document (schemathesis holds them together in
tests/e2e/test_fuzz.py; these name each rule): `Allow` on a 405, the tasks and limits of
the document as served, parameters that are never null, bulk filters that name something,
and text BSON cannot store refused as input, not a 500."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from brook.common.domain.bulk import validate_bulk
from brook.common.domain.errors import InvalidInput
from brook.common.domain.validation import validate_spec
from brook.common.runtime.settings import Settings
from brook.ingest.app import create_app
from brook.ingest.openapi import served

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's own deprecation of its httpx client
    from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(Settings(), {"noop", "echo"})


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/jobs", "GET, POST"),  # Starlette named the first route's only: POST
        ("/jobs/batch", "POST"),  # not the job called `batch`
        ("/jobs/abc", "GET"),
        ("/queues/emails", "PUT"),
    ],
)
def test_a_405_lists_in_allow_every_method_the_path_answers(
    app: Any, path: str, allow: str
) -> None:
    client = TestClient(app, base_url="http://127.0.0.1")  # no lifespan: no database
    resp = client.request("OPTIONS", path)
    assert resp.status_code == 405 and resp.headers["allow"] == allow


def test_the_served_document_names_the_tasks_the_retention_limit_and_no_null_parameters(
    app: Any,
) -> None:
    doc = served(app.openapi(), {"noop", "echo"}, retention_max_s=3600.0)
    spec = doc["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert spec["properties"]["task"]["enum"] == ["echo", "noop"]
    [number] = [b for b in spec["properties"]["retention_s"]["anyOf"] if b.get("type") == "number"]
    assert number["maximum"] == 3600.0
    assert spec["properties"]["payload"]["propertyNames"]["pattern"]
    assert "x-brook" not in str(doc)
    for item in doc["paths"].values():
        for op in item.values():
            for parameter in op.get("parameters", []):
                assert {"type": "null"} not in parameter["schema"].get("anyOf", []), parameter


@pytest.mark.parametrize(
    "body",
    [{}, {"dry_run": True}, {"status": None}, {"status": []}, {"finished_until": 0}],
)
def test_a_bulk_filter_names_at_least_one_thing_and_times_are_iso_8601(body: Any) -> None:
    with pytest.raises(InvalidInput):
        validate_bulk(body)


@pytest.mark.parametrize(
    "spec",
    [
        {"task": "noop", "payload": {"a": "\ud800"}},  # was a 500: BSON cannot store it
        {"task": "noop", "payload": {"\udfff": 1}},
        {"task": "noop", "priority": "1"},
        {"task": "noop", "retention_s": False},
        {"task": "noop", "run_at": 0.5},
    ],
)
def test_input_bson_cannot_store_or_the_document_does_not_allow_is_refused(spec: Any) -> None:
    with pytest.raises(InvalidInput):
        validate_spec(spec)


def test_a_whole_number_written_with_a_point_is_an_integer_as_json_schema_says() -> None:
    assert validate_spec({"task": "noop", "priority": 4.0, "max_attempts": 2.0}).priority == 4
