"""A trigger whose task nobody registers: a dispatcher loading it must refuse to start."""

from __future__ import annotations

from brook import trigger

trigger("orphan", collection="orders", task="no-such-task")
