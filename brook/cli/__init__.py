"""`brook`: run the roles (up, api, dispatcher), the embedded replica set, and talk to the API.

`parser` holds the arguments and `main` (the console script `brook`), `up` the supervisor
of `brook up`, `serve` the roles run in this process (api, dispatcher, mongo), and
`api_commands` the commands that call the HTTP API. `python -m brook.cli` runs `main`.
"""

from brook.cli.parser import build_parser, main, parse_concurrency, parse_rate

__all__ = ["build_parser", "main", "parse_concurrency", "parse_rate"]
