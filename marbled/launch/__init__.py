"""Launchers start a job run on a node's GPUs, signal it, and report its exit."""
