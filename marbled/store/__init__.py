"""Persistent state of a broker (SQLAlchemy over SQLite)."""
