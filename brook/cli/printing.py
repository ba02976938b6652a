"""What every `brook` command prints on its way out: a JSON document, or one error line."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

from brook.terminal import safe

JsonObject = dict[str, Any]  # a JSON object as the API sends it


def die(message: str, code: int = 1) -> NoReturn:
    print(f"brook: error: {safe(message)}", file=sys.stderr)
    sys.exit(code)


def print_json(doc: JsonObject) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False))
