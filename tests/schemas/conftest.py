"""Lets the codec tests and bench.codec share `records.py` (example records)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
