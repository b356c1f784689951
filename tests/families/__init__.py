"""Model families as data (families/*.json); each family's own tests in its folder."""
