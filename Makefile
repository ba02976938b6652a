# Brook — two commands for a fresh machine: `make up` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint install bench clean down status browser faketime engine images

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[embedded,test,lint,otel]'
	@touch $(STAMP)

install: $(STAMP)

## Start the local three-node replica set, the API and the dispatcher (foreground; Ctrl-C stops all).
up: $(STAMP)
	$(BIN)/brook up

## The browser tests drive Debian's Chromium through its chromedriver; install them if missing
## (as root, or through sudo). Nothing downloads a browser of its own.
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		echo "installing Debian's chromium and chromium-driver for the browser tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null \
		|| echo "WARNING: could not install chromium chromium-driver: the browser tests will fail" >&2; \
	fi

## The clock-skew tests run dispatchers an hour off through Debian's libfaketime (preloaded);
## install it if missing (as root, or through sudo).
faketime:
	@if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then \
		echo "installing Debian's faketime for the clock-skew tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq faketime >/dev/null \
		|| echo "WARNING: could not install faketime: the clock-skew tests will fail" >&2; \
	fi

## Run the whole test suite against a real replica set, in TEST_WORKERS processes (pytest-xdist;
## each has a replica set of its own, see tests/conftest.py). Most tests wait on processes and
## MongoDB, not on the CPU: more workers than cores pay off. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 6
## The docker tests (tests/docker) need a Docker engine: install and start one when missing
## (docker/engine.sh, as root or through sudo). Without one they fail, saying why; never skip.
engine:
	@docker/engine.sh || echo "WARNING: no Docker engine: the docker tests will fail" >&2

## Every API, dispatcher, worker and CLI the suite starts imports Brook: its bytecode is
## compiled here once, since with PYTHONDONTWRITEBYTECODE set (as in some shells and CI
## images) Python writes none and each of those processes would compile it again.
test: $(STAMP) browser faketime engine
	$(BIN)/python -m compileall -q -j 0 brook tests >/dev/null
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; fi; exit $$rc

## Local stand-ins for mongo:7 and python:3.11-slim (no Docker Hub needed); ends with two
## lines for the environment: `env $$(make -s images | tail -n 2) docker-compose up`.
images:
	@PY=$(PY) docker/images/build.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy brook tests bench

bench: $(STAMP)
	$(BIN)/python -m bench.run

down: $(STAMP)
	$(BIN)/brook mongo down

status: $(STAMP)
	$(BIN)/brook mongo status

clean:
	-$(BIN)/brook mongo down
	rm -rf $(VENV) .brook
