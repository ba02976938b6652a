"""A trigger on Brook's own jobs collection: a dispatcher loading it must refuse to start."""

from __future__ import annotations

from brook import trigger

trigger("loop", collection="jobs", task="noop")
