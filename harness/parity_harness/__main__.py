"""`python -m parity_harness` is the `parity` command."""

import sys

from parity_harness._cli.main import main

sys.exit(main())
