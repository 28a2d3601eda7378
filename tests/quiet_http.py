"""An HTTP server for the tests' stand-ins that says nothing when a client hangs up.

A client that drops its connection (the API server giving up on a webhook, a watch cut at the end
of a test) makes `socketserver` print a traceback from the handler's thread, often after the test
has ended, straight into the terminal. Those are expected; any other error still shows.
"""

from __future__ import annotations

import ssl
import sys
from http.server import ThreadingHTTPServer
from typing import Any

HUNG_UP = (ConnectionError, TimeoutError, ssl.SSLError)


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], HUNG_UP):
            return
        super().handle_error(request, client_address)
