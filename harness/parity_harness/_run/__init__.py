"""Running backends and collecting results: the runner, the decoding check, dumps, and merging them."""
