"""progress() logs the start, periodic "still running" lines and the end of long work."""
import logging
import time

from torchair.core.utils import logger, progress


def test_progress_logs_start_ticks_and_end():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        with progress("graph 7: compiling", every=0.05):
            time.sleep(0.18)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    lines = [r.getMessage() for r in records]
    assert lines[0] == "graph 7: compiling ..."
    assert any("still running" in line for line in lines[1:-1])
    assert lines[-1].startswith("graph 7: compiling: done in ")
