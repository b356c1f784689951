"""The comparison rules: the judge, its checks, the error budget, diagnosis, differential runs."""
