"""The PyTorch reference for parity's toy GPT-2: config, taps, model, grammar, training.

Importing this package is cheap: `reference.config` and `reference.taps` are pure Python, and
only `reference.model` (and what uses it) imports torch.
"""
