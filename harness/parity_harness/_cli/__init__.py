"""The command line: parsing, dispatch, and the one place exit codes are decided."""
