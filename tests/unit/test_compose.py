"""Static checks of the Docker deployment: compose.yaml, the mongo scripts and the Dockerfile.

No Docker engine is needed: the files are parsed and checked for the shape the contract
promises (three `mongo` containers in replica set rs0 with keyfile auth, `api` and
`dispatcher` built from the Dockerfile, no secret committed, non-root image).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ENV_EXAMPLE = ROOT / ".env.example"
MONGO_DIR = ROOT / "docker" / "mongo-replicaset"
INIT_SCRIPT = MONGO_DIR / "init-replica.sh"
KEYFILE_SCRIPT = MONGO_DIR / "keyfile.sh"

MONGO_SERVICES = ("mongo1", "mongo2", "mongo3")
MEMBERS = tuple(f"{name}:27017" for name in MONGO_SERVICES)
SECRET_KEY = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|KEY", re.IGNORECASE)
# `${VAR}`, `${VAR?msg}`, `${VAR:?msg}` or `${VAR:-}`: the value comes from the environment.
# A non-empty default (`${VAR:-hunter2}`) would be a committed secret, so it does not count.
ENV_ONLY = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?\?[^}]*|:-)?\}")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "compose.yaml must be a mapping"
    return data


def _services() -> dict[str, dict[str, Any]]:
    services = _compose().get("services")
    assert isinstance(services, dict) and services, "compose.yaml defines no services"
    return services


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list)
    return [str(part) for part in command]


def _environment(service: dict[str, Any]) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (str(item).partition("=") for item in env)
        return {key: (value if sep else None) for key, sep, value in pairs}
    assert isinstance(env, dict)
    return {str(k): (None if v is None else str(v)) for k, v in env.items()}


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {str(name): "service_started" for name in deps}
    assert isinstance(deps, dict)
    return {str(k): str((v or {}).get("condition", "service_started")) for k, v in deps.items()}


def _option(command: list[str], flag: str) -> str | None:
    for i, part in enumerate(command):
        if part == flag and i + 1 < len(command):
            return command[i + 1]
        if part.startswith(flag + "="):
            return part.split("=", 1)[1]
    return None


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    return instructions


def test_compose_file_uses_the_compose_spec_without_a_version_key() -> None:
    assert "version" not in _compose()
    # `name:` is compose v2 only; COMPOSE_PROJECT_NAME (.env.example) works for 1.29 too.
    assert "name" not in _compose()
    assert re.search(r"^COMPOSE_PROJECT_NAME=brook$", ENV_EXAMPLE.read_text(), re.MULTILINE)


def test_three_mongo_members_form_replica_set_rs0_with_keyfile_auth() -> None:
    services = _services()
    mongod_services = {name for name, svc in services.items() if "mongod" in _command(svc)[:1]}
    assert mongod_services == set(MONGO_SERVICES)
    for name in MONGO_SERVICES:
        svc = services[name]
        # The user's default is the official image; `make images` may stand in for it.
        assert str(svc.get("image", "")) == "${BROOK_MONGO_IMAGE:-mongo:7}", name
        command = _command(svc)
        assert _option(command, "--replSet") == "rs0", name
        assert "--bind_ip_all" in command, name
        keyfile = _option(command, "--keyFile")
        assert keyfile, f"{name} runs without --keyFile"
        mounts = [str(v).split(":") for v in svc.get("volumes", [])]
        assert any(len(m) >= 2 and keyfile.startswith(m[1].rstrip("/") + "/") for m in mounts), (
            f"{name}: the keyfile {keyfile} is not on a mounted volume"
        )


def test_keyfile_is_generated_at_runtime_before_any_mongod_starts() -> None:
    services = _services()
    generators = [
        name
        for name, svc in services.items()
        if any("keyfile" in part for part in [*_command(svc), str(svc.get("entrypoint", ""))])
        and name not in MONGO_SERVICES
    ]
    assert generators, "no one-shot service generates the keyfile"
    for name in MONGO_SERVICES:
        deps = _depends_on(services[name])
        assert any(deps.get(g) == "service_completed_successfully" for g in generators), name
    committed = [p.name for p in MONGO_DIR.iterdir() if p.suffix not in {".sh", ".md"}]
    assert not [n for n in committed if "key" in n.lower()], f"keyfile committed: {committed}"


def _stub(bin_dir: Path, name: str, exit_code: int = 0) -> Path:
    """A fake `name` on PATH that records each call's arguments (one JSON list a line)."""
    calls = bin_dir / f"{name}.calls"
    stub = bin_dir / name
    stub.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    stub.chmod(0o755)
    return calls


def _calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _run(script: Path, shell: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which(shell)
    assert executable is not None, f"{shell} is needed to run {script.name}"
    return subprocess.run(
        [executable, str(script), *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_keyfile_script_writes_a_private_random_key_for_mongodb_once(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    chown = _stub(bin_dir, "chown")  # the real one would need root
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    keyfile = tmp_path / "volume" / "keyfile"
    first = _run(KEYFILE_SCRIPT, "sh", str(keyfile), **env)
    assert first.returncode == 0, first.stderr
    key = keyfile.read_text()
    assert len(base64.b64decode("".join(key.split()))) == 756  # mongod accepts 6 to 1024 chars
    assert stat.S_IMODE(keyfile.stat().st_mode) == 0o400  # mongod refuses a readable keyfile
    assert _calls(chown) == [["999:999", str(keyfile)]]  # the image's mongodb user
    again = _run(KEYFILE_SCRIPT, "sh", str(keyfile), **env)
    assert again.returncode == 0, again.stderr
    assert keyfile.read_text() == key  # kept: restarted members still recognise each other
    other = tmp_path / "other" / "keyfile"
    assert _run(KEYFILE_SCRIPT, "sh", str(other), **env).returncode == 0
    assert other.read_text() != key  # random, not a committed constant


def _init(
    tmp_path: Path, *, members_answer: bool = True, **env: str
) -> tuple[int, list[list[str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    mongosh = _stub(bin_dir, "mongosh", 0 if members_answer else 1)
    proc = _run(
        INIT_SCRIPT, "bash", PATH=f"{bin_dir}:{os.environ['PATH']}", RS_WAIT_SECONDS="0", **env
    )
    return proc.returncode, _calls(mongosh)


def _js(call: list[str]) -> str:
    """The script passed with --eval, without its comments."""
    code = call[call.index("--eval") + 1]
    return "\n".join(line for line in code.splitlines() if not line.strip().startswith("//"))


def test_init_script_initiates_rs0_with_all_three_members_once(tmp_path: Path) -> None:
    code, calls = _init(
        tmp_path,
        MONGO_ROOT_USER="root",
        MONGO_ROOT_PASSWORD="pw-never-on-argv",
        MONGO_BROOK_PASSWORD="brook-pw-never-on-argv",
    )
    assert code == 0
    pings, initiate, user = calls[:-2], calls[-2], calls[-1]
    # Every member answers a ping before anything else happens.
    assert [c[1] for c in pings] == [f"mongodb://{m}/admin?directConnection=true" for m in MEMBERS]
    assert all("ping" in _js(c) for c in pings)
    assert initiate[1] == f"mongodb://{MEMBERS[0]}/admin?directConnection=true"
    js = _js(initiate)
    assert "_id: 'rs0'" in js
    for member in MEMBERS:
        assert f"host: '{member}'" in js
    # Initiated only when rs.status() says the set does not exist yet, then wait for a PRIMARY.
    assert js.index("rs.status()") < js.index("rs.initiate(config)")
    assert "NotYetInitialized" in js
    assert "stateStr === 'PRIMARY'" in js
    # Credentials reach mongosh through its environment, never on a command line.
    assert "process.env.MONGO_ROOT_PASSWORD" in js
    assert not any("pw-never-on-argv" in arg for call in calls for arg in call)
    # Then Brook's own user, on the primary: a role with readWrite on its database, not root.
    assert user[1] == "mongodb://" + ",".join(MEMBERS) + "/admin?replicaSet=rs0"
    js = _js(user)
    assert "role: 'readWrite', db: brookDb" in js and "'root'" not in js
    assert "process.env.MONGO_BROOK_PASSWORD" in js
    assert not any("brook-pw-never-on-argv" in arg for call in calls for arg in call)


def test_init_script_stops_without_credentials_or_when_a_member_never_answers(
    tmp_path: Path,
) -> None:
    code, calls = _init(tmp_path / "a", MONGO_ROOT_USER="root")
    assert code != 0 and calls == []  # no MONGO_ROOT_PASSWORD: nothing is attempted
    code, calls = _init(
        tmp_path / "b",
        members_answer=False,
        MONGO_ROOT_USER="root",
        MONGO_ROOT_PASSWORD="pw",
        MONGO_BROOK_PASSWORD="pw2",
    )
    assert code != 0
    assert len(calls) == 1 and not any("rs.initiate" in _js(c) for c in calls)


def test_mongo_init_runs_the_script_after_all_members_are_healthy() -> None:
    services = _services()
    init = services.get("mongo-init")
    assert init is not None
    invocation = " ".join([*_command(init), str(init.get("entrypoint", ""))])
    assert "init-replica.sh" in invocation
    deps = _depends_on(init)
    for name in MONGO_SERVICES:
        assert deps.get(name) == "service_healthy", name


def test_mongo_services_are_healthy_once_mongod_listens_on_their_own_name() -> None:
    """A TCP connect to the member's own service name (the entrypoint's temporary mongod
    listens on localhost only), from bash: no Node.js start every few seconds."""
    services = _services()
    for name in MONGO_SERVICES:
        check = services[name].get("healthcheck")
        assert isinstance(check, dict), f"{name} has no healthcheck"
        test = check.get("test")
        assert test == ["CMD", "bash", "-c", f"exec 3<>/dev/tcp/{name}/27017"], name


def test_api_and_dispatcher_are_built_from_the_dockerfile_and_reach_all_members() -> None:
    services = _services()
    for name in ("api", "dispatcher"):
        svc = services.get(name)
        assert svc is not None, f"missing service {name}"
        build = svc.get("build")
        if isinstance(build, dict):
            assert build.get("context", ".") == "."
            assert build.get("dockerfile", "Dockerfile") == "Dockerfile"
        else:
            assert build == "."
        assert _command(svc) == ["brook", name]
        uri = _environment(svc).get("BROOK_MONGO_URI") or ""
        assert uri.startswith("mongodb://")
        for member in MEMBERS:
            assert member in uri, f"{name}: {member} missing from BROOK_MONGO_URI"
        assert "replicaSet=rs0" in uri
        assert _depends_on(svc).get("mongo-init") == "service_completed_successfully"


def test_api_listens_on_all_interfaces_publishes_8000_and_checks_healthz() -> None:
    api = _services()["api"]
    assert _environment(api).get("BROOK_API_HOST") == "0.0.0.0"
    ports = [str(p.get("target")) if isinstance(p, dict) else str(p) for p in api["ports"]]
    # Published on the host's loopback unless BROOK_API_PUBLISHED_HOST says otherwise.
    assert ports == [
        "${BROOK_API_PUBLISHED_HOST:-127.0.0.1}:${BROOK_API_PUBLISHED_PORT:-8000}:8000"
    ]
    test = api["healthcheck"]["test"]
    text = " ".join(test) if isinstance(test, list) else str(test)
    assert "/healthz" in text and "urllib" in text


def test_only_the_api_holds_the_token_and_the_demo_tasks_are_off_by_default() -> None:
    services = _services()
    token = _environment(services["api"]).get("BROOK_API_TOKEN") or ""
    assert token.startswith("${BROOK_API_TOKEN:?")
    # Every task process a dispatcher starts inherits its environment: no token there, nor
    # anywhere else but the API.
    for name, svc in services.items():
        assert "env_file" not in svc, name
        if name != "api":
            assert not [k for k in _environment(svc) if "TOKEN" in k.upper()], name
    # `crash` and `cpu` are demos, not for a deployment: on only when asked for.
    for name in ("api", "dispatcher"):
        assert _environment(services[name]).get("BROOK_DEMO_TASKS") == "${BROOK_DEMO_TASKS:-0}"


def test_no_secret_is_hard_coded_in_any_service_environment() -> None:
    for name, svc in _services().items():
        for key, value in _environment(svc).items():
            if SECRET_KEY.search(key):
                # No value at all means "pass through from the host when set": not a literal.
                assert value is None or ENV_ONLY.fullmatch(value), (
                    f"{name}: {key} must come from the environment, got {value!r}"
                )
            if value and "://" in value and "@" in value:
                userinfo = value.split("://", 1)[1].rsplit("@", 1)[0]
                match = re.fullmatch(r"(\$\{[^}]*\}):(\$\{[^}]*\})", userinfo)
                assert match, f"{name}: {key} embeds literal credentials"
                assert ENV_ONLY.fullmatch(match.group(2)), f"{name}: {key} password has a default"


def test_compose_file_contains_no_literal_password_assignment() -> None:
    assignment = re.compile(
        r"(?<![\w{$])(?P<key>\w*(?:password|passwd|pwd|secret|token)\w*)\s*[:=]\s*(?P<value>[^\s#]*)",
        re.IGNORECASE,
    )
    flag = re.compile(r"(?:--password|\s-p)[\s=]+(?P<value>[^\s\"',\]]+)")
    uri = re.compile(r"://[^\s:/@\"'$]+:(?P<value>[^\s@\"'$][^\s@\"']*)@")
    for number, line in enumerate(COMPOSE.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for pattern in (assignment, flag, uri):
            for match in pattern.finditer(line):
                value = match.group("value").strip("\"'")
                assert not value or value.startswith("$"), (
                    f"compose.yaml:{number}: literal secret-looking value {value!r}"
                )


def test_env_example_documents_every_required_variable_without_values() -> None:
    required = set(re.findall(r"\$\{(\w+):?\?", COMPOSE.read_text(encoding="utf-8")))
    assert {"MONGO_ROOT_USER", "MONGO_ROOT_PASSWORD", "MONGO_BROOK_PASSWORD"} <= required
    assert "BROOK_API_TOKEN" in required  # the API is never published without a token
    example = ENV_EXAMPLE.read_text(encoding="utf-8")
    for var in required:
        assert re.search(rf"^#?\s*{var}=", example, re.MULTILINE), f"{var} not in .env.example"
    for line in example.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#") and SECRET_KEY.search(key):
            assert not value.strip(), f".env.example ships a value for {key}"


def test_dockerfile_installs_the_project_and_does_not_run_as_root() -> None:
    instructions = _dockerfile_instructions()
    bases = [args for kw, args in instructions if kw == "FROM"]
    assert bases == ["${BASE_IMAGE}"], bases
    args = [args for kw, args in instructions if kw == "ARG"]
    assert "BASE_IMAGE=python:3.11-slim" in args  # what a user with Docker Hub pulls
    runs = [args for kw, args in instructions if kw == "RUN"]
    assert any(re.search(r"pip install(?: [-\w=]+)* \.(?:\s|\[|$)", r) for r in runs), runs
    users = [args for kw, args in instructions if kw == "USER"]
    assert users, "the image must switch to a non-root USER"
    final_user = users[-1].split(":")[0]
    assert final_user not in {"root", "0"}
    cmd = [args for kw, args in instructions if kw == "CMD"]
    assert cmd and "brook" in cmd[-1] and "api" in cmd[-1]


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    entries = {
        line.strip().strip("/").removeprefix("**/")
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".brook", ".git", "__pycache__", ".env"} <= entries


@pytest.mark.parametrize(
    ("shell", "script"), [("bash", INIT_SCRIPT), ("sh", KEYFILE_SCRIPT)], ids=["init", "keyfile"]
)
def test_mongo_shell_scripts_parse(shell: str, script: Path) -> None:
    executable = shutil.which(shell)
    assert executable is not None, f"{shell} is needed to check the script"
    result = subprocess.run(
        [executable, "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
