"""A trigger whose match filters on a document field without `fullDocument.`: the import
fails, so a dispatcher loading it refuses to start."""

from __future__ import annotations

from brook import trigger

trigger("bad-match", collection="orders", match={"status": "paid"}, task="noop")
