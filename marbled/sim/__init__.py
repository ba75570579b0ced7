"""Discrete-event simulation driving the same policies as the daemon."""
