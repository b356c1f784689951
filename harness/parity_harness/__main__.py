"""`python -m parity_harness` is the `parity` command."""

import sys

from parity_harness.cli.main import main

sys.exit(main())
