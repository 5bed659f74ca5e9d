import sys
from pathlib import Path

# The test kit (launcher, config, run_cell) shared with the other suites.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support" / "python"))
