"""The API's routers, one per resource: `jobs`, `queues`, `schedules`, `triggers`,
`signals`, `events` (live events), `health` (health, readiness, metrics), `docs` (OpenAPI),
`dashboard`."""
