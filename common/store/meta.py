"""The only code that touches `brook_meta`: small documents of the deployment itself, one
per `_id` (today: the secret that signs event ids)."""

from __future__ import annotations

import os

from bson.binary import Binary
from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from brook.common.domain.models import Doc

META = "brook_meta"


async def deployment_secret(db: AsyncDatabase[Doc], name: str) -> bytes:
    """A random secret named `name`, shared by every process of this deployment: made by
    the first process that asks (32 random bytes), kept in MongoDB (majority written, as
    Brook's database handle writes), the same for every process after it, across
    restarts."""
    meta = db[META]
    for _ in range(2):  # two first askers at once: one inserts, the other finds it
        try:
            doc = await meta.find_one_and_update(
                {"_id": name},
                {"$setOnInsert": {"secret": Binary(os.urandom(32))}},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:
            continue
        if doc is not None:
            return bytes(doc["secret"])
    raise RuntimeError(f"no {name} secret in {META}")
