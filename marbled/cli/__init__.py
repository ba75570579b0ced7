"""Command-line entry points: `marbled` (the broker) and `marble` (its client)."""
