"""pytest setup: the repository root on sys.path, so the tests can use golden/ (the NumPy
references written from the specs) as their oracles."""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
