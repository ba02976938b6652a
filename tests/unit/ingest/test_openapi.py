"""The OpenAPI document: every operation documents the errors it can answer."""

from __future__ import annotations

from typing import Any

from ingest.openapi import document_errors


def test_every_operation_documents_the_errors_it_can_answer() -> None:
    schema: dict[str, Any] = {
        "paths": {
            "/healthz": {"get": {"responses": {"200": {}}}},
            "/jobs": {"post": {"requestBody": {"required": True}, "responses": {"202": {}}}},
            "/jobs/{job_id}/cancel": {
                "post": {"parameters": [{"name": "job_id"}], "responses": {"200": {}}}
            },
        }
    }
    document_errors(schema)
    codes = {
        (path, method): set(op["responses"])
        for path, item in schema["paths"].items()
        for method, op in item.items()
    }
    assert codes[("/healthz", "get")] == {"200"}
    assert codes[("/jobs", "post")] == {"200", "202", "401", "413", "422", "503"}
    assert codes[("/jobs/{job_id}/cancel", "post")] == {"200", "401", "404", "409", "422", "503"}
