"""Named points where a test may kill the scheduler process (`PHALANX_FAILPOINT=<name>`).

A crash between two API writes is the failure a restart must recover from; a test double
cannot show that the real API server and a fresh process do. The variable is read at each
point, so an unset one costs a dictionary lookup. Names: `plan-written`,
`reservation-made`, `configmap-written`, `bound`.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("phalanx.k8s")
EXIT_CODE = 86


def hit(name: str) -> None:
    if os.environ.get("PHALANX_FAILPOINT") == name:
        log.error("failpoint %s: exiting now", name)
        logging.shutdown()
        os._exit(EXIT_CODE)
