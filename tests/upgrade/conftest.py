import sys
from pathlib import Path

# The cluster harness of the Jupyter client tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jupyter"))
