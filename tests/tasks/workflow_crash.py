"""Fault injection for a workflow test, loaded as a task module (`BROOK_TASKS`) by the
dispatcher it is meant to kill: that dispatcher exits at once (`os._exit`, as if SIGKILLed)
right after a completion that has dependents to settle is written, before it settles them.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from brook.common.client.dependents import Via
from brook.dispatcher.attempts import dependents

_settle = dependents.Dependents.parents_ended


def _die_first(self: dependents.Dependents, job_ids: Collection[str], via: Via) -> None:
    if job_ids and via == "completion":
        os._exit(137)
    _settle(self, job_ids, via)


dependents.Dependents.parents_ended = _die_first  # type: ignore[method-assign]
