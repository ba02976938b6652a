"""The API's routers: `jobs`, `queues`, `ops` (health, readiness, metrics), `docs`."""
