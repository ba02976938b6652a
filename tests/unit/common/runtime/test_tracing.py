"""Tracing without a database, each case in a fresh interpreter (a tracer provider is set once
per process, and whether OpenTelemetry was imported is the very thing checked): the
untraced path imports nothing of it, and a run continues its submitter's trace, in an
in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT


def run_python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "BROOK_"))}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


UNTRACED_PATH = """
    import asyncio, sys
    from datetime import UTC, datetime

    def otel_modules():
        return sorted(m for m in sys.modules if m.startswith("opentelemetry"))

    import brook
    from brook.common.domain.models import JobSpec
    from brook.common.client.core import _stamped
    from brook.common.protocol.runner import RunJob
    from brook.common.runtime import tracing
    from brook.common.runtime.settings import Settings
    from brook.executor.registry import load_tasks
    from brook.executor.worker import run_one
    from brook.dispatcher.dispatcher import Dispatcher
    from brook.dispatcher.following.triggers import TriggerFollower

    settings = Settings()
    load_tasks(settings)
    configured = tracing.configure("dispatcher")
    [spec] = _stamped([JobSpec(task="echo", payload={})])
    run = RunJob(job_id="j1", attempt=1, task="echo", payload={"a": 1},
                 due_at=datetime.now(UTC), trace=None)
    done = asyncio.run(run_one(run, settings))
    brooks = otel_modules()  # the dispatcher's, the worker's and the client's paths
    import fastapi  # FastAPI may import OpenTelemetry's API for its own native telemetry
    fastapis = otel_modules()
    from brook.ingest.app import create_app
    create_app(settings, ["echo"])
    print(configured, spec.trace, done.ok, done.result, brooks, set(otel_modules()) - set(fastapis))
"""


def test_without_otel_variables_nothing_of_opentelemetry_is_imported() -> None:
    out = run_python(UNTRACED_PATH, BROOK_LOG_LEVEL="WARNING")
    assert out.strip().splitlines()[-1] == "False None True {'a': 1} [] set()"


def test_with_otel_variables_but_without_the_extra_a_brook_process_says_so_and_runs_on() -> None:
    blocked = """
        import sys

        class NoOtel:  # as if the `otel` extra (the SDK, the exporter) were not installed
            def find_spec(self, name, path=None, target=None):
                if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
                    raise ImportError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoOtel())
    """
    code = textwrap.dedent(blocked) + textwrap.dedent(UNTRACED_PATH)
    out = run_python(code, OTEL_TRACES_EXPORTER="console", BROOK_LOG_LEVEL="WARNING")
    lines = out.strip().splitlines()
    assert "tracing.unavailable" in lines[0] and "pip install 'brook[otel]'" in lines[0]
    assert lines[-1].startswith("False None True {'a': 1} ")  # untraced, ran as ever


def test_a_run_continues_its_submitters_trace_with_its_wait_and_links_in_memory() -> None:
    out = run_python(
        """
        import asyncio, json
        from datetime import UTC, datetime, timedelta

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)

        from brook.common.domain.models import JobSpec
        from brook.common.client.core import _stamped
        from brook.common.protocol.runner import RunJob
        from brook.common.runtime import tracing
        from brook.common.runtime.settings import Settings
        from brook.executor.registry import load_tasks
        from brook.executor.worker import run_one

        settings = Settings()
        load_tasks(settings)
        with tracing.span("parent job"):
            parent = tracing.inject()
        with tracing.span("submit", kind="PRODUCER") as submit:
            [spec] = _stamped([JobSpec(task="fail", payload={"message": "no"})])
        run = RunJob(
            job_id="j1", attempt=2, task="fail", payload={"message": "no"}, queue="q",
            trigger="receipts", due_at=datetime.now(UTC) - timedelta(seconds=1),
            trace=spec.trace, links=(parent,),
        )
        asyncio.run(run_one(run, settings))
        spans = {s.name: s for s in exporter.get_finished_spans()}
        submit_ctx, parent_ctx = spans["submit"].context, spans["parent job"].context
        wait, ran = spans["brook.wait fail"], spans["brook.run fail"]
        print(json.dumps({
            "traceparent": spec.trace["traceparent"].split("-")[1:3],
            "submit": [format(submit_ctx.trace_id, "032x"), format(submit_ctx.span_id, "016x")],
            "same_trace": ran.context.trace_id == submit_ctx.trace_id == wait.context.trace_id,
            "run_parent": ran.parent.span_id == submit_ctx.span_id,
            "wait_parent": wait.parent.span_id == submit_ctx.span_id,
            "wait_s": round((wait.end_time - wait.start_time) / 1e9),
            "links": [l.context.span_id == parent_ctx.span_id for l in ran.links],
            "kind": str(ran.kind),
            "attributes": dict(ran.attributes),
        }))
        """,
        BROOK_LOG_LEVEL="WARNING",
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got["traceparent"] == got["submit"]  # the stored context is the submit's span
    assert got["same_trace"] and got["run_parent"] and got["wait_parent"]
    assert got["wait_s"] == 1 and got["links"] == [True] and got["kind"] == "SpanKind.CONSUMER"
    attributes = got["attributes"]
    assert attributes.pop("brook.wait_ms") >= 1000
    assert attributes == {
        "brook.job.id": "j1",
        "brook.task": "fail",
        "brook.queue": "q",
        "brook.attempt": 2,
        "brook.trigger": "receipts",
        "brook.outcome": "failed",
        "brook.error.type": "DemoFailure",
    }
