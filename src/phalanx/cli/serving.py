"""The TLS of the endpoints `phalanx scheduler` serves, with or without `--shadow`: one reader,
so a bad certificate reads the same one line whichever mode was asked for."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from phalanx.cli.errors import user_errors
from phalanx.core.errors import SpecError
from phalanx.k8s.view.authn import tls_context


def serving_tls(cert_file: Path | None, key_file: Path | None) -> ssl.SSLContext:
    """The given certificate, or a self-made one for this host's names; a file that cannot be
    loaded is a user error naming `--tls-cert-file`."""
    with user_errors():
        try:
            return tls_context(cert_file, key_file, (socket.gethostname(), "localhost", "127.0.0.1"))
        except (OSError, ValueError) as e:
            raise SpecError("--tls-cert-file", f"cannot load the certificate: {e}") from None
