"""`python -m parity_harness` is the `parity` command."""

from parity_harness._cli.main import entry

entry()
