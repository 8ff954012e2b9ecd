"""``python -m gateway.cli``: the same as the ``pybench-eval`` command."""

import sys

from gateway.cli import main

sys.exit(main())
