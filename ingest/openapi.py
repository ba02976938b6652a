"""The OpenAPI document describes every error a route can answer, by one set of rules.

FastAPI documents what a route returns on success; the errors come from the edges every
route shares (the token, MongoDB's availability, path ids, validation, the body limit),
so they are added here, by rule, to every operation, including routes added later:

- every route: `400` (a `Host` the API does not answer to, `BROOK_ALLOWED_HOSTS`);
- every route behind the token: `401`; every route but `/healthz`: `503` + `Retry-After`
  (no primary, or a cap on streams or connections reached);
- every state change (not GET): `403` (a read-only token, or another site's page) and
  `415` (a body that is not JSON);
- a path with an `{id}`, and a submit (a `depends_on` parent that is no job): `404`;
- parameters or a body: `422` (`detail` is a message, or the list of validation errors);
- a body: `413`;
- `POST` on an action of one resource (`/jobs/{job_id}/cancel`, …): `409` (not in a state
  that allows it).

With a token set, it also names the bearer scheme on every route behind it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from brook.common.domain.instants import years_up_to
from brook.common.domain.quota_specs import QUOTA_NAMES_MARK
from brook.common.domain.validation import (
    MAX_HORIZON_S,
    RETENTION_MARK,
    RUN_AT_MARK,
    TASK_MARK,
)

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# Where a spec's `depends_on` may name a parent that is no job: `404`.
SUBMITS = frozenset({"/jobs", "/jobs/batch"})

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object"}},
            ]
        }
    },
}

_DESCRIPTIONS = {
    400: "A `Host` this API does not answer to (`BROOK_ALLOWED_HOSTS`), a bad "
    "`Last-Event-ID`, or an unknown field in `include`.",
    401: "Missing or wrong bearer token (when `BROOK_API_TOKEN` is set).",
    404: "No such job (or other resource; for a submit, a `depends_on` parent).",
    403: "A read-only token (`BROOK_API_READ_TOKEN`) asked for a state change, or a page "
    "of another site (`Origin`) did.",
    409: "The job is not in a state that allows this.",
    413: "Body larger than `BROOK_MAX_BODY_BYTES`.",
    415: "A body (or content type) that is not `application/json`.",
    422: "Invalid input: `detail` says what.",
    503: "No MongoDB primary reachable, or this process is at a cap (event streams, "
    "catch-ups); retry after `Retry-After` seconds.",
}

_HEADERS = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}}},
    503: {"Retry-After": {"schema": {"type": "string"}}},
}


def error_response(code: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS[code],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if code in _HEADERS:
        response["headers"] = _HEADERS[code]
    return response


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """Error responses to declare on a route by hand (the rules add them anyway)."""
    return {code: error_response(code) for code in codes}


PROTECTED = responses(401, 503)

# Successes a route sends besides its declared status (the routes return plain responses).
OTHER_SUCCESSES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("post", "/jobs"): {
        "200": {
            "description": "The job its `idempotency_key` already names (nothing new stored).",
            "content": {"application/json": {"schema": {}}},
        }
    },
}


def _error_codes(path: str, method: str, operation: dict[str, Any]) -> list[int]:
    codes: list[int] = [400]
    if path not in OPEN_PATHS:
        codes.append(401)
    if method not in ("get", "head", "options"):
        codes += [403, 415]
    if path != "/healthz":
        codes.append(503)
    if "{" in path or (method == "post" and path in SUBMITS):
        codes.append(404)
    if operation.get("parameters") or operation.get("requestBody"):
        codes.append(422)
    if operation.get("requestBody"):
        codes.append(413)
    parts = path.strip("/").split("/")
    if method == "post" and len(parts) == 3 and parts[1].startswith("{"):
        codes.append(409)
    return codes


def document_bearer(schema: dict[str, Any]) -> None:
    components = schema.setdefault("components", {})
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in schema.get("paths", {}).items():
        if path in OPEN_PATHS:
            continue
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                operation["security"] = [{"bearer": []}]


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            for code in _error_codes(path, method, operation):
                if code == 422 or str(code) not in responses:  # 422: ours, not FastAPI's
                    responses[str(code)] = error_response(code)
            for code_text, response in OTHER_SUCCESSES.get((method, path), {}).items():
                operation["responses"].setdefault(code_text, response)
    # Every 422 is ours now, not FastAPI's default shape.
    schema["components"]["schemas"].pop("HTTPValidationError", None)
    schema["components"]["schemas"].pop("ValidationError", None)
    return schema


def hoist_defs(schema: dict[str, Any]) -> dict[str, Any]:
    """Bodies declared by hand carry pydantic's own schema, whose nested models are in a
    local `$defs` referred to as `#/$defs/Name`: in the whole document that points at
    nothing (ReDoc refuses it), so they move to `components/schemas`."""
    found: dict[str, Any] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            found.update(node.pop("$defs", {}))
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                node["$ref"] = "#/components/schemas/" + ref.removeprefix("#/$defs/")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        return node

    walk(schema.get("paths", {}))
    walk(found)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in found.items():
        schemas.setdefault(name, definition)
    return schema


def install_openapi(app: FastAPI, *, bearer: bool) -> None:
    """Generate the document once, with the errors and the auth documented."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            hoist_defs(schema)
            without_null_parameters(schema)
            document_errors(schema)
            if bearer:
                document_bearer(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def served(
    schema: dict[str, Any],
    tasks: Iterable[str],
    retention_max_s: float,
    quotas: Iterable[str] = (),
) -> dict[str, Any]:
    """A copy of the document as this API serves it now: its job specs name the tasks a
    submit may use (the API's own and the live dispatchers'; any other is a `422`),
    `retention_s` its operator's maximum (`BROOK_RETENTION_MAX_SECONDS`) and `run_at` the
    latest year it may name (JSON Schema has no bound on a time: the rest of that year
    past 365 days ahead is said in its description only); a job's `quotas` name the quotas
    set now (`quotas`)."""
    names = sorted(tasks)
    quota_names = sorted(quotas)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {key: walk(value) for key, value in node.items()}
            if out.pop(TASK_MARK, False):
                out["enum"] = names
            _name_quotas(out, quota_names)
            if out.pop(RUN_AT_MARK, False):
                latest = datetime.now(UTC) + timedelta(seconds=MAX_HORIZON_S)
                for branch in out.get("anyOf", [out]):
                    if branch.get("type") == "string":
                        branch["pattern"] = years_up_to(latest.year)
            if out.pop(RETENTION_MARK, False):
                for branch in out.get("anyOf", [out]):
                    if branch.get("type") == "number":
                        branch["maximum"] = min(
                            branch.get("maximum", retention_max_s), retention_max_s
                        )
            return out
        if isinstance(node, list):
            return [walk(value) for value in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


def _name_quotas(node: dict[str, Any], names: list[str]) -> None:
    keys = node.get("propertyNames")
    if isinstance(keys, dict) and keys.pop(QUOTA_NAMES_MARK, False):
        if names:
            keys["enum"] = names
        else:
            node["maxProperties"] = 0  # no quota set: a job can name none


def without_null_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter left out is how a client sends none (a query, a header, a path is text:
    it cannot be null), so the `null` FastAPI lists for optional ones goes."""
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                inner = parameter.get("schema", {})
                branches = [b for b in inner.get("anyOf", []) if b != {"type": "null"}]
                if "anyOf" in inner and len(branches) == 1:
                    del inner["anyOf"]
                    inner.update(branches[0])
                    if inner.get("default", 0) is None:
                        del inner["default"]
    return schema
