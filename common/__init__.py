"""What every role shares, in rooms: `domain` (the job and its rules), `store` (all MongoDB
access), `operations` (the client's operations), `runtime` (process plumbing) and `protocol`
(the dispatcher↔worker contract). `ingest`, `dispatcher` and `executor` depend on these,
never on each other."""
