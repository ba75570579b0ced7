"""Pure scheduling core: no I/O, no clocks, no processes."""
