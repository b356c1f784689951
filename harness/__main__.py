"""`python -m harness` is the `parity` command."""

import sys

from harness.cli import main

sys.exit(main())
