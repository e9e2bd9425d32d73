"""A private CA and a server certificate for 127.0.0.1, made with the openssl CLI.

The `cryptography` package is not a dependency of this project; openssl is on every
machine that runs these tests. The CA is self-signed, so no system trust store trusts it:
a client verifies the server only when given ``ca``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path  # PEM CA certificate (what --upstream-ca-file takes)
    cert: Path  # server certificate, SAN IP:127.0.0.1 and DNS:localhost, signed by ca
    key: Path  # its private key


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(out: Path) -> Certs:
    out.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=prefix-router test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=out)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=out)
    (out / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                    "extendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
             cwd=out)
    return Certs(out / "ca.pem", out / "server.pem", out / "server.key")
