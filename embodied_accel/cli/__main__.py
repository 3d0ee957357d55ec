"""``python -m embodied_accel.cli``: the ``embodied-accel`` command."""

import sys

from . import main

sys.exit(main())
