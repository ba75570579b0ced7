"""HTTP API of the broker."""
