"""The ``embodied-accel`` command's process environment, set before PyTorch loads (``cli`` imports this first).

``OMP_WAIT_POLICY=PASSIVE``: libgomp reads it once, when PyTorch loads it, and sleeping workers leave shared cores
free (:mod:`embodied_accel.geometry.threads`). An explicit setting is kept; nothing is set once PyTorch is loaded.
"""

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
