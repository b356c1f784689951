"""parity run: the full gate, lanes, deadlines, decoding, dumps and merging of reports."""
