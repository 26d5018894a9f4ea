"""TLS for the daemon's TCP API, with Python's ``ssl`` only: a token never crosses a network in clear.

The daemon serves TCP over TLS with a certificate it is given (``--tls-cert``/``--tls-key``) or
one it makes itself once (``--tls self-signed``: an ECDSA P-256 key and a 10-year self-signed
certificate under ``<state dir>/tls/``, made with the ``openssl`` command, since ``ssl`` cannot
make certificates), and prints the certificate's SHA-256 fingerprint. A client pins that
fingerprint (``--fingerprint``/``COLLOCATE_FINGERPRINT``): it completes the handshake, compares
the peer's certificate with the pin, and sends its token only when they match. Pinning needs no
certificate authority and no host name, which suits a lab's head node reached by IP; a site
with its own CA gives the daemon that certificate and the client ``--ca-file`` instead.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import ssl
import subprocess
from pathlib import Path

from collocate.common.errors import CollocateError, InputError

SELF_SIGNED = "self-signed"


def read_secret(path: Path, what: str) -> str:
    """A token file's text, refused (like ssh refuses a private key) when the group or others
    may read or write it: a token others could read is a token others hold."""
    path = Path(path).expanduser()
    mode = path.stat().st_mode
    if mode & 0o077:
        raise InputError(f"{what} {path} is readable or writable by other users (mode {mode & 0o777:o}); "
                         "a token others can read is a token others hold",
                         hint=f"chmod 600 {path} (and make a new token if others may have read it)")
    return path.read_text()


def fingerprint(der: bytes) -> str:
    """A certificate's SHA-256 fingerprint as ``openssl x509 -fingerprint -sha256`` prints it
    (``AB:CD:...``)."""
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def normalized(pin: str) -> str:
    """A pin as given (colons or not, any case, an optional ``sha256:`` / ``SHA256=`` prefix)."""
    text = pin.strip().split("=")[-1].removeprefix("sha256:").replace(":", "").upper()
    if len(text) != 64 or any(c not in "0123456789ABCDEF" for c in text):
        raise InputError(f"cannot read the fingerprint {pin!r}",
                         hint="give the SHA-256 fingerprint `collocate serve` printed, e.g. AB:CD:... (32 pairs)")
    return ":".join(text[i:i + 2] for i in range(0, 64, 2))


def cert_fingerprint(cert_file: Path) -> str:
    return fingerprint(ssl.PEM_cert_to_DER_cert(cert_file.read_text()))


def self_signed(folder: Path, host: str) -> tuple[Path, Path]:
    """The daemon's own certificate and key under ``folder``, made once (``openssl``)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    if cert.exists() and key.exists():
        return cert, key
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    names = ["DNS:localhost", "IP:127.0.0.1", f"DNS:{socket.gethostname()}"]
    if host and host not in ("0.0.0.0", "::", "127.0.0.1", "localhost"):
        names.append(f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}")
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "3650", "-subj", "/CN=collocate", "-addext",
            "subjectAltName=" + ",".join(names), "-keyout", str(key), "-out", str(cert)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise CollocateError("--tls self-signed needs the `openssl` command, which is not installed",
                             hint="install openssl, or pass --tls-cert FILE --tls-key FILE") from None
    if done.returncode != 0:
        raise CollocateError(f"openssl could not make a certificate: {done.stderr.strip()[-500:]}",
                             hint="pass --tls-cert FILE --tls-key FILE instead")
    key.chmod(0o600)
    return cert, key


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"cannot load the TLS certificate {cert} and key {key}: {exc}",
                         hint="give a PEM certificate and its private key, or --tls self-signed") from None
    return context


def client_socket(sock: socket.socket, *, pin: str | None, ca_file: Path | None, host: str) -> ssl.SSLSocket:
    """``sock`` after a TLS handshake with a daemon whose certificate matches ``pin`` (or is
    signed by ``ca_file``'s CA for ``host``); raises ``CollocateError`` otherwise, before
    anything (the token) is sent."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        context.load_verify_locations(ca_file)
    else:  # pinned: the fingerprint is the check
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        wrapped = context.wrap_socket(sock, server_hostname=host if ca_file is not None else None)
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        raise CollocateError(f"no TLS connection to the daemon at {host}: {exc}",
                             hint="is it served with --tls? check COLLOCATE_HOST and COLLOCATE_FINGERPRINT") from None
    if pin is not None:
        der = wrapped.getpeercert(binary_form=True) or b""
        seen = fingerprint(der)
        if not hmac.compare_digest(seen, normalized(pin)):
            wrapped.close()
            raise CollocateError(f"the daemon at {host} shows another certificate ({seen}) than the "
                                 "fingerprint you pinned; nothing was sent",
                                 hint="check the fingerprint `collocate serve` printed; if the daemon's "
                                      "certificate changed on purpose, pin the new one")
    return wrapped
