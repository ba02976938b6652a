"""The API's state, typed: built once by the app's lifespan, reached through `ingest.deps`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from brook.common.client.core import ClientCore
from brook.common.client.task_directory import TaskDirectory
from brook.common.domain.models import Doc, JobSpec
from brook.common.runtime.group_commit import GroupCommit
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore, Submitted
from brook.common.store.output import OutputStore
from brook.ingest.caps import Slots
from brook.ingest.eventids import DeploymentIds
from brook.ingest.live import Hub
from brook.ingest.livestats import LiveStats
from brook.ingest.metrics import ApiMetrics, DepthCache
from brook.ingest.output_hub import OutputHub

API_SERVER_SELECTION_CAP_MS = 5000  # the API answers 503 quickly rather than hang a client
INDEX_TIMEOUT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class ApiState:
    settings: Settings
    known_tasks: frozenset[str]
    client: AsyncMongoClient[Doc]
    store: JobStore
    # Validation, task-name check, writes and their log lines, as for the Python client;
    # its single submits go through a group commit (concurrent submits share one write).
    core: ClientCore
    metrics: ApiMetrics
    hub: Hub  # this process's one change stream, fanned out to event-stream clients
    stats: LiveStats  # throughput and latency over the last minutes, fed by the hub
    depth: DepthCache  # jobs by queue and status: one aggregation, refreshed in the background
    ids: DeploymentIds  # signs and checks event ids (Last-Event-ID)
    streams: Slots  # event streams open now, at most BROOK_SSE_MAX_CLIENTS
    catch_ups: Slots  # catch-up cursors open now, at most BROOK_SSE_MAX_CATCH_UPS
    # The readers of jobs' output: one more change stream, open while anyone reads.
    output_hub: OutputHub


async def _submit_batch(store: JobStore, specs: Sequence[JobSpec]) -> list[Submitted]:
    if len(specs) == 1:
        return [await store.submit(specs[0])]  # one round trip: the upsert returns the job
    return await store.submit_many(specs)


async def _ensure_indexes(store: JobStore) -> None:
    """The indexes, built or checked; without a primary, said and left to a later start."""
    try:
        await asyncio.wait_for(store.ensure_indexes(), INDEX_TIMEOUT_S)
    except (PyMongoError, TimeoutError) as exc:
        log_event(
            Event.MONGO_UNAVAILABLE, level="warning", op="ensure_indexes", error=str(exc)[:200]
        )


async def open_state(
    settings: Settings, known_tasks: frozenset[str], metrics: ApiMetrics
) -> ApiState:
    """Connect, make sure the indexes exist, and log `api.started`.

    The API starts even when no primary is reachable: `/readyz` says 503 until one is.
    """
    client = make_client(
        settings,
        appname="brook-api",
        serverSelectionTimeoutMS=min(
            settings.server_selection_timeout_ms, API_SERVER_SELECTION_CAP_MS
        ),
    )
    store = JobStore(
        database(client, settings),
        retention_s=settings.retention_seconds,
        query_max_ms=settings.query_max_ms,
    )
    # The API accepts its own tasks, and those a live dispatcher runs.
    directory = TaskDirectory(store.presence, lambda: known_tasks, open_while_none_live=False)
    depth = DepthCache(store, settings.metrics_cache_seconds)
    submits: GroupCommit[JobSpec, Submitted] = GroupCommit(
        lambda specs: _submit_batch(store, specs)
    )
    await _ensure_indexes(store)
    log_event(
        Event.API_STARTED,
        host=settings.api_host,
        port=settings.api_port,
        tasks=sorted(known_tasks),
        auth=settings.api_token is not None,
    )
    stats = LiveStats()
    return ApiState(
        settings=settings,
        known_tasks=known_tasks,
        client=client,
        store=store,
        core=ClientCore(
            store,
            directory,
            submit_one=submits.submit,
            count_by_queue=depth.get,
            signal_retention_s=settings.signal_retention_seconds,
        ),
        metrics=metrics,
        hub=Hub(
            store,
            buffer=settings.sse_buffer,
            ring_bytes=settings.live_ring_bytes,
            observe=stats.observe,
        ),
        stats=stats,
        depth=depth,
        ids=DeploymentIds(store.db),
        streams=Slots(settings.sse_max_clients),
        catch_ups=Slots(settings.sse_max_catch_ups),
        output_hub=OutputHub(OutputStore(store.db), buffer=settings.sse_buffer),
    )

