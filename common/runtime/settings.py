"""One `Settings` object, built once at start from `BROOK_*` variables and passed down."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from brook.common.domain.errors import ConfigError
from brook.common.domain.models import QUEUE_NAME

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_QUEUE_NAME = re.compile(QUEUE_NAME)
WEEK_S = 7 * 86400.0
MONTH_S = 30 * 86400.0
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")
# Claims ahead of the workers, at most (BROOK_PREFETCH unset): enough for claims of many
# jobs each (the claimer refills when half is free: claims of up to 64), so short tasks
# cost few claim round trips. The time cap (`AHEAD_S` of work) binds long before it for
# any task over a few milliseconds.
DEFAULT_PREFETCH = 128


def _default_concurrency() -> int:
    return os.cpu_count() or 1


class Settings(BaseSettings):
    """Every knob Brook reads from the environment (prefix `BROOK_`)."""

    model_config = SettingsConfigDict(env_prefix="BROOK_", frozen=True, extra="ignore")

    # Never in a repr: a URI may carry a password (`redacted()` is what others may see).
    mongo_uri: str | None = Field(default=None, repr=False)
    db: str = Field(default="brook", min_length=1, max_length=60, pattern=r"^[A-Za-z0-9_-]+$")
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    api_token: SecretStr | None = None
    # Safe to expose (docs/security.md): a token that may only read; running open (no token)
    # on an address other than loopback only when asked for in so many words.
    api_read_token: SecretStr | None = None
    allow_no_token: bool = False
    # `Host` names the API answers to (DNS rebinding); unset: the loopback names on a
    # loopback bind, any elsewhere (the token guards those). "*": any.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    concurrency: int = Field(default_factory=_default_concurrency, ge=1, le=1024)
    lease_seconds: float = Field(default=30.0, ge=1.0, le=86400.0)
    tasks: Annotated[tuple[str, ...], NoDecode] = ()
    demo_tasks: bool = True
    log_level: str = "INFO"
    # Queue -> local worker slots ("default:8,emails:2"); None: every queue, sharing
    # `concurrency`.
    queues: Annotated[dict[str, int] | None, NoDecode] = None
    retention_seconds: float = Field(default=WEEK_S, ge=0.0, le=100 * 365 * 86400.0)
    # The most a client's `retention_s` may ask for over HTTP (a longer one: 422).
    retention_max_seconds: float = Field(default=MONTH_S, ge=0.0, le=100 * 365 * 86400.0)
    # How long a signal (`client.signal`, `POST /signals/{key}`) is kept: a wait that starts
    # within it returns the signal at once.
    signal_retention_seconds: float = Field(default=WEEK_S, ge=1.0, le=100 * 365 * 86400.0)
    # The most jobs claimed ahead of the workers, per dispatcher (per queue with `queues`);
    # None: the slots, at least DEFAULT_PREFETCH.
    prefetch: int | None = Field(default=None, ge=0, le=4096)
    # Shared jobs (`@task(..., shared=N)`): the worker processes that run them, many at once
    # each as asyncio tasks, beside the `concurrency` processes that run one job each; the
    # most shared jobs in flight per dispatcher; how long a shared job stopped (timeout,
    # cancel, lost lease, shutdown) may take to end before its process is killed; how long
    # a shared process's event loop may be blocked before it is reported; and after how
    # many jobs, or past how much resident memory (MiB), a shared process is replaced once
    # it drains (0: never).
    shared_processes: int = Field(default=1, ge=1, le=64)
    shared_max: int = Field(default=1000, ge=1, le=100_000)
    shared_stop_grace_seconds: float = Field(default=5.0, gt=0.0, le=3600.0)
    loop_blocked_seconds: float = Field(default=1.0, gt=0.0, le=3600.0)
    shared_recycle: int = Field(default=0, ge=0, le=100_000_000)
    shared_memory_mib: int = Field(default=0, ge=0, le=16_777_216)
    # Priority aging: a waiting job's effective priority rises by one per this many seconds
    # it has waited (dispatcher/claiming/aging.py); None: off.
    priority_aging_seconds: float | None = Field(default=None, gt=0.0, le=30 * 86400.0)

    # Beyond the contract: tuning knobs with safe defaults.
    home: Path = Path(".brook")
    mongo_port: int = Field(default=27217, ge=1024, le=65533)
    sweep_seconds: float = Field(default=5.0, ge=0.05, le=3600.0)
    # Hear of new jobs from the primary's oplog, a replication round before the change
    # stream (dispatcher/claiming/insert_hints.py); off, or where the oplog cannot be read:
    # the stream alone.
    oplog_hints: bool = True
    retry_base_seconds: float = Field(default=1.0, ge=0.0, le=3600.0)
    retry_cap_seconds: float = Field(default=300.0, ge=0.0, le=86400.0)
    default_timeout_s: float | None = Field(default=None, gt=0)
    shutdown_grace_seconds: float = Field(default=10.0, ge=0.0, le=3600.0)
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    server_selection_timeout_ms: int = Field(default=10_000, ge=100)
    # How long an operation may wait for a member's reply (unset: as long as TCP keeps the
    # connection; see docs/configuration.md for why it is not set by default), and how long
    # the driver's monitor waits on a member (plus the 10 s heartbeat) before it calls it
    # gone and interrupts what waits on it.
    mongo_socket_timeout_ms: int | None = Field(default=None, ge=1_000, le=3_600_000)
    mongo_connect_timeout_ms: int = Field(default=20_000, ge=100, le=600_000)
    dispatcher_name: str | None = None

    # Watching it live: dispatcher metrics, event streams (SSE).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9464, ge=0, le=65535)  # a dispatcher's /metrics; 0 = off
    metrics_cache_seconds: float = Field(default=2.0, ge=0.0, le=3600.0)
    sse_ping_seconds: float = Field(default=15.0, gt=0.0, le=3600.0)
    sse_buffer: int = Field(default=1000, ge=1, le=1_000_000)  # events queued per SSE client
    # The bytes of the events an API process keeps for resuming from memory (its live hub's
    # ring; the oldest go first; 0: none, every resume reads the oplog).
    live_ring_bytes: int = Field(default=64 * 1024 * 1024, ge=0, le=64 * 1024**3)
    # Caps per API process: event streams open at once, catch-ups (a cursor each) at once,
    # and HTTP connections held (beyond it, the one idle the longest is closed, or with
    # none idle the new one's request gets 503: `brook.ingest.connection_guard`).
    sse_max_clients: int = Field(default=1000, ge=1, le=100_000)
    sse_max_catch_ups: int = Field(default=8, ge=1, le=1000)
    max_connections: int = Field(default=2000, ge=8, le=200_000)
    # The longest a listing, search or grouping read may run on the server (`maxTimeMS`):
    # one that needs longer answers `search_too_broad` (the API's job counts, read in the
    # background, get ten times as long).
    query_max_ms: int = Field(default=5_000, ge=1, le=600_000)
    # A job's output stream (`ctx.emit`): its cap, every attempt together (past it, `emit`
    # raises `OutputLimitExceeded`), and the batching window of a worker process's writes
    # (at most one write of output per window).
    output_max_chunks: int = Field(default=100_000, ge=1, le=10_000_000)
    output_max_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024, le=1024**3)
    output_window_ms: float = Field(default=25.0, ge=1.0, le=1000.0)
    # How long a connection may sit idle before its request's headers are in (from when it
    # opens, or from its last response): then it is closed.
    header_timeout_seconds: float = Field(default=10.0, ge=0.1, le=3600.0)

    @field_validator("tasks", mode="before")
    @classmethod
    def _split_tasks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip().lower() for part in value.split(",") if part.strip())
        return value

    @field_validator("api_token", "api_read_token", mode="before")
    @classmethod
    def _not_blank(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("is empty or blank: set a real token, or unset the variable")
            return value.strip()
        return value

    @model_validator(mode="after")
    def _tokens_together(self) -> Settings:
        if self.api_read_token is None:
            return self
        if self.api_token is None:
            raise ValueError("BROOK_API_READ_TOKEN needs BROOK_API_TOKEN (the admin token)")
        if self.api_read_token.get_secret_value() == self.api_token.get_secret_value():
            raise ValueError("BROOK_API_READ_TOKEN must differ from BROOK_API_TOKEN")
        return self

    @field_validator("queues", mode="before")
    @classmethod
    def _parse_queues(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_queues(value)
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _check_level(cls, value: Any) -> Any:
        if isinstance(value, str):
            level = value.strip().upper()
            if level not in LOG_LEVELS:
                raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
            return level
        return value

    @field_validator("mongo_uri", mode="before")
    @classmethod
    def _check_uri(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return None
            if not value.startswith(("mongodb://", "mongodb+srv://")):
                raise ValueError("must start with mongodb:// or mongodb+srv://")
        return value

    def redacted(self) -> Settings:
        """These settings with the password of `mongo_uri` replaced by `***`: what a task's
        `ctx.settings`, a log line or the CLI may show."""
        return self.model_copy(update={"mongo_uri": redact_uri(self.mongo_uri)})

    @property
    def host_names(self) -> frozenset[str] | None:
        """The `Host` names the API answers to; None: any."""
        if "*" in self.allowed_hosts:
            return None
        if self.allowed_hosts:
            return frozenset(self.allowed_hosts)
        return frozenset(LOOPBACK_NAMES) if is_loopback(self.api_host) else None

    @property
    def worker_slots(self) -> int:
        """Worker processes of a dispatcher: the sum of its queues' slots, else `concurrency`."""
        return sum(self.queues.values()) if self.queues else self.concurrency

    def prefetch_for(self, slots: int) -> int:
        """How many jobs a dispatcher (or one of its queues) with `slots` slots may hold
        claimed ahead of its workers."""
        return max(slots, DEFAULT_PREFETCH) if self.prefetch is None else self.prefetch

    @property
    def heartbeat_seconds(self) -> float:
        """Leases are renewed at a third of their length, well before they expire."""
        return max(self.lease_seconds / 3.0, 0.2)


def parse_queues(text: str) -> dict[str, int] | None:
    """`"default:8,emails:2"` -> `{"default": 8, "emails": 2}`; blank -> None (every queue)."""
    queues: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, slots = part.partition(":")
        name = name.strip()
        if not sep or not slots.strip().isdigit() or int(slots) < 1:
            raise ValueError(f"{part!r}: write each queue as name:slots, slots >= 1")
        if not _QUEUE_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a queue name (letters, digits, '_', '.', '-')")
        if name in queues:
            raise ValueError(f"queue {name!r} is listed twice")
        queues[name] = int(slots)
    return queues or None


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the port on this machine."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def check_exposure(settings: Settings) -> None:
    """Refuse to serve the API open (no token) beyond this machine, unless asked to, and
    then only to the `Host` names it is told (with any name, a page whose name was
    re-pointed at the API, DNS rebinding, passes the Origin check)."""
    if settings.api_token is not None or is_loopback(settings.api_host):
        return
    if not settings.allow_no_token:
        raise ConfigError(
            f"BROOK_API_HOST: {settings.api_host} is not a loopback address and "
            "BROOK_API_TOKEN is not set; set a token, or BROOK_ALLOW_NO_TOKEN=1 to "
            "serve the API open to the network on purpose"
        )
    if not settings.allowed_hosts:
        raise ConfigError(
            f"BROOK_ALLOWED_HOSTS: an API open to the network (BROOK_ALLOW_NO_TOKEN=1 on "
            f"{settings.api_host}) must name the hosts it answers to, or any page a browser "
            "opens could reach it by DNS rebinding; set them (or a token)"
        )


def load_settings(**overrides: Any) -> Settings:
    """Build `Settings` from the environment; a bad value raises one line naming the variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:  # a rule between variables: its message names them
            raise ConfigError(str(first["msg"]).removeprefix("Value error, ")) from None
        field = str(first["loc"][0])
        raise ConfigError(f"BROOK_{field.upper()}: {first['msg']}") from None


def redact_uri(uri: str | None) -> str | None:
    """`mongodb://user:secret@host/...` → `mongodb://user:***@host/...`; a URI without a
    password is returned as it is."""
    if uri is None:
        return None
    scheme, sep, rest = uri.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return uri
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hosts}"
