"""`brook quota ls|set|show|rm`: the quotas, through a running API. Any failure exits with
one line on stderr (`die`)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from brook.cli.api_commands import UNSET, call_api
from brook.cli.printing import JsonObject, die, print_json


def _path(name: str) -> str:
    return f"/quotas/{quote(name, safe=':/@+')}"


def _limits(q: dict[str, Any]) -> str:
    parts = []
    for name in ("units", "requests"):
        w = q.get(name)
        if w:
            used = (q.get("used") or {}).get(name)
            now = f" ({used:g} in window)" if used else ""
            parts.append(f"{name}={w['limit']}/{w['per_seconds']:g}s{now}")
    if q.get("concurrency") is not None:
        parts.append(f"concurrency={q['concurrency']} ({q.get('running', 0)} running)")
    return " ".join(parts) or "-"


def _state(q: dict[str, Any]) -> str:
    parts = [f"rate x{q.get('effective_rate', 1.0):g}"]
    if q.get("usage_ratio", 1.0) != 1.0:
        parts.append(f"usage x{q['usage_ratio']:g} the estimates")
    if q.get("closed_until"):
        parts.append(f"closed until {q['closed_until']}")
    if q.get("debt"):
        parts.append(f"debt {q['debt']:g}")
    return ", ".join(parts)


def cmd_quota_ls(settings: Any, _: argparse.Namespace) -> int:
    quotas = call_api(settings, "GET", "/quotas")["quotas"]
    print(f"{'quota':<32}  {'limits':<56}  state")
    for q in quotas:
        print(f"{q['name']:<32}  {_limits(q):<56}  {_state(q)}")
    return 0


def cmd_quota_show(settings: Any, args: argparse.Namespace) -> int:
    """The quota as JSON: limits, state (effective rate, closed until, debt) and its ledger
    (units and requests per minute and per day, as a whole and by key)."""
    print_json(call_api(settings, "GET", _path(args.name)))
    return 0


def cmd_quota_set(settings: Any, args: argparse.Namespace) -> int:
    names = ("units", "requests", "concurrency")
    body: JsonObject = {k: getattr(args, k) for k in names if getattr(args, k) is not UNSET}
    if not body:
        die("brook quota set needs --units, --requests and/or --concurrency", 2)
    print_json(call_api(settings, "PUT", _path(args.name), body))
    return 0


def cmd_quota_rm(settings: Any, args: argparse.Namespace) -> int:
    call_api(settings, "DELETE", _path(args.name))
    return 0
