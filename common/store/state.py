"""`TokenStore`: the only code that touches the `brook_state` collection.

The change streams' saved resume tokens, one document per stream (`stream:<name>`), each
with the version of the pipeline it belongs to: a token of another pipeline is never used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.models import Doc

STATE = "brook_state"


class TokenStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.state: AsyncCollection[Doc] = db[STATE]

    async def load(self, name: str, version: str) -> Mapping[str, Any] | None:
        """The stream's saved token, if it belongs to this `version` of its pipeline."""
        doc = await self.state.find_one({"_id": f"stream:{name}"})
        if doc is None or doc.get("version") != version:
            return None
        token: Mapping[str, Any] | None = doc.get("token")
        return token

    async def save(self, name: str, version: str, token: Mapping[str, Any]) -> None:
        await self.state.update_one(
            {"_id": f"stream:{name}"},
            {"$set": {"token": token, "version": version}, "$currentDate": {"saved_at": True}},
            upsert=True,
        )

    async def drop(self, name: str) -> None:
        await self.state.delete_one({"_id": f"stream:{name}"})
