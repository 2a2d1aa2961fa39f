"""A PySpark driver that waits forever, guarded like jobs/load.py (used by a test)."""

import time

from cdclake.lifecycle import exit_with_parent

exit_with_parent()
print("driver ready", flush=True)
time.sleep(600)
