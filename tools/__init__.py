"""Project tooling (not installed; run from the repository)."""
