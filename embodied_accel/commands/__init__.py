"""The ``embodied-accel`` commands, one module per command (``cli.py`` dispatches to them)."""
