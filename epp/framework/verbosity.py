"""The anchors' log verbosity (logr `V(n)`) as Python log levels, so `-v` below 4 means what it means there.

llm-d-router and GIE set zap's level to `-v` (`LoggingOptions.Complete`: level = -1 * v) and log with
`logger.V(n)`: a line at V(n) shows when n <= v. V(0) is plain Info, V(2) the default, V(3) verbose, V(4) debug,
V(5) trace. Python's INFO is V(0) and DEBUG is V(4); V(1)-V(3) sit between them and TRACE below DEBUG, so one
root level (`level(v)`) shows exactly the lines the anchors would. Log a V(n) line with `log.log(V(n), ...)`.
"""

from __future__ import annotations

import logging

DEFAULT = 2
VERBOSE = 3
DEBUG = 4
TRACE = 5

_LEVELS = {0: logging.INFO, 1: logging.INFO - 1, 2: logging.INFO - 2, 3: logging.INFO - 3, 4: logging.DEBUG, 5: 5}


def V(n: int) -> int:
    """The Python level of a line logged at verbosity `n` (and the root level that `-v=n` sets)."""
    if n <= 0:
        return logging.INFO
    if n in _LEVELS:
        return _LEVELS[n]
    return max(1, 5 - (n - TRACE))


for _n in (1, 2, 3):
    logging.addLevelName(V(_n), f"V{_n}")
logging.addLevelName(V(TRACE), "TRACE")
