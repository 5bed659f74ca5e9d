import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The test kit (launcher, config, run_cell) shared with the other suites.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support" / "python"))
