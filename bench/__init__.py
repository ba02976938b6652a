"""Brook's benchmark: real `brook api` / `brook dispatcher` processes on a real replica set.

Run it with `python -m bench.run` (or `make bench`); see `bench/RESULTS.md` for figures.
"""
