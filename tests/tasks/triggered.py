"""A trigger for tests (`BROOK_TASKS=tests.tasks.basic,tests.tasks.triggered`): every order
inserted or updated as `paid` in the `orders` collection of Brook's database makes one
`on_paid` job, which returns what it was given of the change."""

from __future__ import annotations

from typing import Any

from brook import task, trigger


@task("on_paid")
def on_paid(change: dict[str, Any]) -> dict[str, Any]:
    doc = change["full_document"] or {}
    return {
        "operation": change["operation"],
        "id": change["document_key"]["_id"],
        "n": doc.get("n"),
        "trigger": change["trigger"],
    }


trigger(
    "paid-orders",
    collection="orders",
    operations=["insert", "update"],
    match={"fullDocument.status": "paid"},
    task="on_paid",
)
