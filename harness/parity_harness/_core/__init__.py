"""Plain types and safe IO that every layer may use: errors, statuses, settings, text, atomic writes, input caps."""
