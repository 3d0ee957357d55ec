"""The ``embodied-accel`` command's process environment, set before PyTorch is loaded (``cli`` imports it before anything that loads PyTorch).

OpenMP's workers sleep between parallel regions instead of spinning: libgomp reads ``OMP_WAIT_POLICY`` once, when
PyTorch loads it (see :mod:`embodied_accel.geometry.threads` for what spinning costs). An explicit setting in the
environment is kept, and nothing is set once PyTorch is loaded (the setting would no longer describe the process).
"""

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
