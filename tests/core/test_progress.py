"""progress() logs the start, periodic "still running" lines and the end of long work."""
import logging
import time

from torchair.core.utils import progress


def test_progress_logs_start_ticks_and_end(torchair_log):
    with progress("graph 7: compiling", every=0.05):
        time.sleep(0.18)
    lines = [r.getMessage() for r in torchair_log if r.levelno >= logging.INFO]
    assert lines[0] == "graph 7: compiling ..."
    assert any("still running" in line for line in lines[1:-1])
    assert lines[-1].startswith("graph 7: compiling: done in ")
