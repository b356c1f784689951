"""The core's guarantees: sanitized text, safe files, where writes land."""
