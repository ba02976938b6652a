"""Configuration: defaults from the contract; a bad value fails at start naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from brook.common.domain.errors import ConfigError
from brook.common.runtime.settings import (
    Settings,
    check_exposure,
    is_loopback,
    load_settings,
    parse_queues,
)
from tests.conftest import ROOT


def test_defaults_follow_the_contract() -> None:
    s = load_settings()
    assert s.mongo_uri is None and s.db == "brook"
    assert (s.api_host, s.api_port) == ("127.0.0.1", 8000)
    assert s.concurrency == (os.cpu_count() or 1) and s.lease_seconds == 30
    assert s.api_token is None and s.tasks == () and s.demo_tasks and s.log_level == "INFO"


def test_values_are_read_from_brook_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROOK_TASKS", "a.tasks, b.tasks")
    monkeypatch.setenv("BROOK_DEMO_TASKS", "0")
    monkeypatch.setenv("BROOK_CONCURRENCY", "7")
    monkeypatch.setenv("BROOK_LOG_LEVEL", "debug")
    monkeypatch.setenv("BROOK_API_TOKEN", "hunter2")
    s = load_settings()
    assert s.tasks == ("a.tasks", "b.tasks") and not s.demo_tasks and s.concurrency == 7
    assert (
        s.log_level == "DEBUG"
        and s.api_token is not None
        and s.api_token.get_secret_value() == "hunter2"
    )
    assert "hunter2" not in repr(s)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("BROOK_CONCURRENCY", "zero"),
        ("BROOK_CONCURRENCY", "0"),
        ("BROOK_LEASE_SECONDS", "-3"),
        ("BROOK_API_PORT", "70000"),
        ("BROOK_LOG_LEVEL", "LOUD"),
        ("BROOK_MONGO_URI", "http://nope"),
        ("BROOK_DB", "bad name!"),
        ("BROOK_DEMO_TASKS", "maybe"),
        ("BROOK_API_TOKEN", ""),
        ("BROOK_API_TOKEN", " \t "),
        ("BROOK_SSE_MAX_CLIENTS", "0"),
        ("BROOK_RETENTION_MAX_SECONDS", "-1"),
    ],
)
def test_a_bad_value_raises_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith(f"{var}:") and "\n" not in message


def run_dispatcher(**brook_env: str) -> subprocess.CompletedProcess[str]:
    """`brook dispatcher` with only these BROOK_* variables set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
    env.update(brook_env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "brook.cli", "dispatcher"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_exits_non_zero_with_a_one_line_error_on_bad_config() -> None:
    proc = run_dispatcher(BROOK_CONCURRENCY="lots")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("brook: error: BROOK_CONCURRENCY:")


def test_an_unimportable_task_module_fails_at_start_naming_brook_tasks() -> None:
    proc = run_dispatcher(
        BROOK_TASKS="no.such.module",
        BROOK_MONGO_URI="mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100",
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("brook: error: BROOK_TASKS: cannot import 'no.such.module'")


def test_brook_queues_parses_names_and_slots() -> None:
    assert parse_queues("default:8, emails:2") == {"default": 8, "emails": 2}
    assert parse_queues(" ") is None
    for bad in ("default", "a:0", "a:-1", "a b:1", "a:1,a:2"):
        with pytest.raises(ValueError):
            parse_queues(bad)
    settings = Settings(queues="default:3,emails:2", concurrency=9)  # type: ignore[arg-type]
    assert settings.worker_slots == 5 and Settings(concurrency=4).worker_slots == 4


def test_a_read_token_needs_an_admin_token_and_must_differ_from_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BROOK_API_READ_TOKEN", "reader")
    with pytest.raises(ConfigError, match="BROOK_API_READ_TOKEN needs BROOK_API_TOKEN"):
        load_settings()
    monkeypatch.setenv("BROOK_API_TOKEN", "reader")
    with pytest.raises(ConfigError, match="must differ"):
        load_settings()
    monkeypatch.setenv("BROOK_API_TOKEN", " admin ")
    s = load_settings()
    assert s.api_token is not None and s.api_token.get_secret_value() == "admin"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("127.0.0.2", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
     ("brook.example.com", False)],
)
def test_an_open_api_may_bind_only_to_loopback_unless_allowed(
    monkeypatch: pytest.MonkeyPatch, host: str, loopback: bool
) -> None:
    monkeypatch.setenv("BROOK_API_HOST", host)
    assert is_loopback(host) is loopback
    if loopback:
        check_exposure(load_settings())
    else:
        with pytest.raises(ConfigError, match="BROOK_ALLOW_NO_TOKEN"):
            check_exposure(load_settings())
    monkeypatch.setenv("BROOK_ALLOW_NO_TOKEN", "1")
    if loopback:
        check_exposure(load_settings())
    else:  # open to the network, to any Host name: DNS rebinding
        with pytest.raises(ConfigError, match=r"^BROOK_ALLOWED_HOSTS: .*DNS rebinding"):
            check_exposure(load_settings())
    for hosts in ("brook.internal", "*"):
        monkeypatch.setenv("BROOK_ALLOWED_HOSTS", hosts)
        check_exposure(load_settings())
    monkeypatch.delenv("BROOK_ALLOWED_HOSTS")
    monkeypatch.delenv("BROOK_ALLOW_NO_TOKEN")
    monkeypatch.setenv("BROOK_API_TOKEN", "t")
    check_exposure(load_settings())


def test_allowed_hosts_default_to_loopback_names_on_a_loopback_bind_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().host_names == frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
    monkeypatch.setenv("BROOK_API_HOST", "0.0.0.0")
    monkeypatch.setenv("BROOK_API_TOKEN", "t")
    assert load_settings().host_names is None
    monkeypatch.setenv("BROOK_ALLOWED_HOSTS", "Brook.Example.com, 10.0.0.5")
    assert load_settings().host_names == frozenset({"brook.example.com", "10.0.0.5"})
    monkeypatch.setenv("BROOK_ALLOWED_HOSTS", "*")
    assert load_settings().host_names is None


def test_the_mongodb_password_is_never_shown() -> None:
    from brook.common.runtime.settings import redact_uri

    uri = "mongodb://brook:s3cret@m1:27017,m2:27017/?replicaSet=rs0&authSource=admin"
    settings = Settings(mongo_uri=uri)
    assert settings.redacted().mongo_uri == (
        "mongodb://brook:***@m1:27017,m2:27017/?replicaSet=rs0&authSource=admin"
    )
    assert "s3cret" not in repr(settings) and "s3cret" not in str(settings)
    assert settings.mongo_uri == uri  # the process's own clients still connect with it
    assert redact_uri("mongodb://127.0.0.1:27017/?replicaSet=brook") == (
        "mongodb://127.0.0.1:27017/?replicaSet=brook"
    )
    assert redact_uri("mongodb+srv://only-user@cluster.example/") == (
        "mongodb+srv://only-user@cluster.example/"
    )
    assert redact_uri("mongodb://u:p@ss:w@rd@h/") == "mongodb://u:***@h/"
