"""The engine zoo (`tests/watch/zoo/`) imports as `zoo`, from the tests and from the scripts they run."""

import sys
from pathlib import Path

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
