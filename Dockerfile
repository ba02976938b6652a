# Brook: one image for both roles (`brook api`, `brook dispatcher`); see compose.yaml.
# BASE_IMAGE: any Python 3.11+ image with pip; `make images` builds a local stand-in for
# machines that cannot pull python:3.11-slim (compose passes it as BROOK_BASE_IMAGE).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The dependencies first, from pyproject.toml alone: a layer that an edit of the code does
# not invalidate, so a rebuild after one reinstalls Brook itself only (seconds, not the
# whole dependency tree). No `embedded` extra: in a container MongoDB is a separate service
# and BROOK_MONGO_URI points at it.
COPY pyproject.toml /app/
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the project (one import package, `brook`, the role folders linked below it, and the
# `brook` console script).
COPY . /app
RUN pip install --no-deps . \
    && rm -rf /app/build /app/*.egg-info

# Run as an unprivileged user.
RUN groupadd --system --gid 10001 brook \
    && useradd --system --uid 10001 --gid brook --home-dir /home/brook --create-home \
       --shell /usr/sbin/nologin brook
USER brook:brook
WORKDIR /home/brook

# Inside a container the API must listen on all interfaces to be reachable.
ENV BROOK_API_HOST=0.0.0.0 \
    BROOK_API_PORT=8000
EXPOSE 8000

CMD ["brook", "api"]
