"""`make demo` runs scripts/demo.py, which no other test runs whole."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

IMPORT_DEMO = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("demo", sys.argv[1])
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)
print(callable(demo.main), "airflow" in sys.modules)
"""


def test_the_demo_script_imports_without_airflow():
    """Every cdclake name the demo uses exists (a moved one broke `make demo` before), and
    importing it does not import Airflow, which reads AIRFLOW_HOME once, before the demo
    has set it to the stack's."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_DEMO, str(ROOT / "scripts" / "demo.py")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
