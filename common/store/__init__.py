"""Persistence: the only code that talks to MongoDB.

One module per collection: `jobs` (a package, one module per concern), `queues`
(`brook_queues`), `schedules` (`brook_schedules`), `presence` (`brook_dispatchers`) and
`state` (`brook_state`: saved resume tokens); `transactions` (Brook's writes inside a
caller's or a task's transaction). Every job state change is a named pure builder in
`queries` (built of `fields`), every change-stream pipeline and the oplog filter are in
`pipelines`, the server clock is `clock`, the client factory and error classes are
`db`, and riding out a failover (retrying while a failure is transient) is
`failover_retry`.
"""
