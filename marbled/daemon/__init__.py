"""The broker daemon: event loop, GPU discovery, start-up and drain."""
