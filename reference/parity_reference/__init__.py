"""The PyTorch reference for parity's toy GPT-2: config, taps, model, grammar, training.

Importing this package is cheap: `parity_reference.config` and `parity_reference.taps` are pure Python, and
only `parity_reference.model` (and what uses it) imports torch.
"""
