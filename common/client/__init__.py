"""The client's operations, written once (submit, read, cancel, retry, wait), shared by the
HTTP API, the Python client and a task's context."""
