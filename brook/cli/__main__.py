"""`python -m brook.cli ROLE`: how `brook up`, the tests and the benchmarks start a role."""

import sys

from brook.cli.parser import main

if __name__ == "__main__":
    sys.exit(main())
