"""The API's routers: `jobs` (the job resource), `ops` (health, readiness, metrics), `docs`."""
