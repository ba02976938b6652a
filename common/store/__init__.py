"""Persistence: the only code that talks to MongoDB (the client factory, one module per
collection, the query builders, the change-stream pipelines)."""
