"""The reference models (parity_reference): taps, parameters, grammar, training."""
