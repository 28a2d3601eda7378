import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# rich sizes tables to the terminal; tests that read CLI output must not depend on who runs them
os.environ["COLUMNS"] = "160"
