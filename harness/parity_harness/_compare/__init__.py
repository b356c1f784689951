"""Judging tensors: the rule, check results, folding into summaries and first divergences, the report, budgets."""
