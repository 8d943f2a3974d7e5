"""``python -m commlib`` == the ``commlib`` command (see commlib/cli.py)."""
import sys

from commlib.cli import main

sys.exit(main())
