"""The attempts' writes: everything a dispatcher writes for the jobs it holds, each fenced by
owner and attempt. Leases and their heartbeat, the watchdog, outcomes, progress, durable
steps, start marks, and the settling of dependents."""
