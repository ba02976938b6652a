"""The OpenAPI document: every operation documents the errors it can answer."""

from __future__ import annotations

import json
from typing import Any

from brook.ingest.openapi import document_errors, hoist_defs


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
    # Any route may meet a foreign Host (400); a state change, a read-only token or another
    # site's page (403) and a body that is not JSON (415).
    assert codes[("/healthz", "get")] == {"200", "400"}
    # A submit's `depends_on` may name a parent that is no job (404).
    assert codes[("/jobs", "post")] == {
        "200", "202", "400", "401", "403", "404", "413", "415", "422", "503"
    }
    assert codes[("/jobs/{job_id}/cancel", "post")] == {
        "200", "400", "401", "403", "404", "409", "415", "422", "503"
    }


def test_nested_models_of_hand_declared_bodies_are_components_of_the_document() -> None:
    schema: dict[str, Any] = {
        "paths": {
            "/queues/{name}": {
                "put": {
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "properties": {"rate": {"$ref": "#/$defs/RateSpec"}},
                                    "$defs": {"RateSpec": {"type": "object"}},
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    hoist_defs(schema)
    text = json.dumps(schema)
    assert "$defs" not in text and "#/components/schemas/RateSpec" in text
    assert schema["components"]["schemas"]["RateSpec"] == {"type": "object"}
