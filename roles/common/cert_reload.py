"""Serving certificates that follow their files: a rotated certificate is served without a restart.

In Kubernetes the files change under a running process: cert-manager renews a Certificate, or
``nodetaskd certs create --rotate`` replaces the Secret, and the kubelet swaps the mounted Secret's
``..data`` symlink over to a directory holding the new files. :class:`ReloadingCertificate` looks at
the files' stat every few seconds (device, inode, size and modification time, through the symlinks,
so a swapped link shows as new inodes) and builds a new :class:`ssl.SSLContext` when they changed.
Servers ask :meth:`ReloadingCertificate.context` for the context of each connection they accept:
new connections get the new certificate, and the open ones keep theirs (an SSL connection holds
its own reference to the certificate it was made with), so no connection is dropped.

When to load and what to refuse are decided by pure functions (:func:`next_step`, :func:`check_files`):

- a change is loaded once the files have held still for one poll, so that files a writer replaces
  one by one, in place (unlike the kubelet), are read once it is done with all of them;
- a certificate or key that cannot be read or parsed, a key that does not belong to the certificate,
  an unparsable CA file or a certificate already expired is refused, with one warning naming the
  file, and the certificate served until then is kept; the same files are not tried again until
  they change again;
- files whose contents are those already served (touched, or written again) change nothing.
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn, final

import anyio
import structlog
from cryptography import x509

from roles.common.tls import ServingCertificate, TlsError, check_bundle, check_pair, server_ssl_context

__all__ = [
    "ReloadingCertificate",
    "Stamps",
    "Step",
    "Watch",
    "check_files",
    "file_stamps",
    "next_step",
]

Log = structlog.typing.FilteringBoundLogger

Stamp = tuple[int, int, int, int]
"""A file's (device, inode, size, modification time in ns), through symlinks."""
Stamps = tuple[Stamp | None, ...]
"""One stamp per watched file, in order; None for a file that cannot be stat'ed (gone or unreadable)."""


def file_stamps(files: Sequence[Path]) -> Stamps:
    """The stamps of ``files`` now (symlinks followed: a swapped ``..data`` link gives new inodes)."""

    def stamp(path: Path) -> Stamp | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    return tuple(stamp(path) for path in files)


class Step(enum.Enum):
    """What to do after a look at the files."""

    KEEP = "keep"
    """Nothing changed since the certificate served, or since the files last refused."""
    WAIT = "wait"
    """They changed since the last look: give the writer one more interval to finish."""
    LOAD = "load"
    """They changed and then held still: load them."""


@dataclass(frozen=True, slots=True)
class Watch:
    """What the poller knows about the files."""

    served: Stamps
    """The files as they were when the served certificate was read from them."""
    seen: Stamps
    """The files at the last look."""
    refused: Stamps | None = None
    """The files as they were when last refused: not tried again until they change."""


def next_step(watch: Watch, now: Stamps) -> tuple[Watch, Step]:
    """The watch after a look that found the files at ``now``, and what to do. Pure.

    After :attr:`Step.LOAD`, the caller records the outcome with :func:`loaded` or :func:`refused`.
    """
    if now in (watch.served, watch.refused):
        return replace(watch, seen=now), Step.KEEP
    if now != watch.seen:
        return replace(watch, seen=now), Step.WAIT
    return watch, Step.LOAD


def loaded(now: Stamps) -> Watch:
    """The watch once the files at ``now`` are served (or found to hold what is served)."""
    return Watch(served=now, seen=now)


def refused(watch: Watch, now: Stamps) -> Watch:
    """The watch once the files at ``now`` were refused: the served certificate stays."""
    return replace(watch, seen=now, refused=now)


def check_files(
    pems: Sequence[bytes], *, cert_file: Path, key_file: Path, ca_file: Path | None, now: datetime | None
) -> x509.Certificate:
    """The certificate of the files' contents ``pems`` (certificate, key and, with ``ca_file``, the CA),
    if they may be served. Pure.

    Errors:
        :class:`TlsError` naming the file: no PEM certificate or key in it (e.g. caught half-written),
        a key of another certificate, a CA file without certificates, or a certificate expired at ``now``
        (the one served until then is better for every client; None: not checked, as at start, where
        there is no other).
    """
    cert = check_pair(pems[0], pems[1], cert_file=cert_file, key_file=key_file)
    if ca_file is not None:
        check_bundle(pems[2], ca_file=ca_file)
    if now is not None and cert.not_valid_after_utc <= now:
        raise TlsError(f"the certificate in {cert_file} expired at {cert.not_valid_after_utc.isoformat()}")
    return cert


@dataclass(frozen=True, slots=True)
class _Served:
    certificate: ServingCertificate
    context: ssl.SSLContext
    pems: tuple[bytes, ...]
    leaf: x509.Certificate


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read {path}: {exc.strerror}") from None


@final
class ReloadingCertificate:
    """A serving certificate whose SSL context follows its files; :meth:`watch` looks at them.

    Usage::

        certificate = ReloadingCertificate(load_serving_certificate(cert_file, key_file))
        tg.start_soon(functools.partial(certificate.watch, interval=cfg.tls_reload_interval, log=log))
        await tg.start(functools.partial(serve_http, handler, ..., ssl_context=certificate.context))
    """

    def __init__(self, certificate: ServingCertificate) -> None:
        """Serve ``certificate``'s files (read again here, as they are now).

        Errors:
            :class:`TlsError` naming the file, as :meth:`poll` would refuse it: a role does not start
            without a usable certificate.
        """
        self._files = (certificate.cert_file, certificate.key_file) + (
            (certificate.ca_file,) if certificate.ca_file is not None else ()
        )
        self._ca_file = certificate.ca_file
        now = file_stamps(self._files)
        self._served = self._load(tuple(_read(path) for path in self._files), now=None)
        self._watch = loaded(now)

    def context(self) -> ssl.SSLContext:
        """The context for a connection accepted now."""
        return self._served.context

    @property
    def certificate(self) -> ServingCertificate:
        """The certificate served to new connections (its ``ca_bundle`` is the CA file as read with it)."""
        return self._served.certificate

    async def watch(self, *, interval: float, log: Log) -> NoReturn:
        """Look at the files every ``interval`` seconds and serve what they hold once changed, until cancelled.

        Never raises for what is in the files: whatever is refused is logged and the certificate
        served until then is kept.
        """
        log = log.bind(cert_file=str(self._files[0]))
        while True:
            await anyio.sleep(interval)
            self.poll(log)

    def poll(self, log: Log) -> bool:
        """Look at the files once (:meth:`watch` does, every interval); whether new connections now get another
        certificate.

        Reads a few small files synchronously: they are on a local (in Kubernetes, in-memory) file system.
        """
        now = file_stamps(self._files)
        self._watch, step = next_step(self._watch, now)
        if step is not Step.LOAD:
            return False
        try:
            pems = tuple(_read(path) for path in self._files)
            if pems == self._served.pems:
                self._watch = loaded(now)  # written again, same contents: nothing to tell
                return False
            served = self._load(pems, now=datetime.now(UTC))
        except TlsError as exc:
            self._refuse(now, log, error=str(exc))
            return False
        except Exception as exc:
            # Supervision boundary: whatever the files hold, the servers keep serving what they served.
            self._refuse(now, log, error=repr(exc), exc_info=True)
            return False
        self._served = served
        self._watch = loaded(now)
        log.info("certificate_reloaded", **_describe(served.leaf))
        return True

    def _refuse(self, now: Stamps, log: Log, *, error: str, exc_info: bool = False) -> None:
        self._watch = refused(self._watch, now)
        kept = _describe(self._served.leaf)
        log.warning(
            "certificate_refused",
            error=error,
            kept_serial=kept["serial"],
            kept_not_after=kept["not_after"],
            exc_info=exc_info,
        )

    def _load(self, pems: tuple[bytes, ...], *, now: datetime | None) -> _Served:
        """The certificate in ``pems``, checked by :func:`check_files`, and its context."""
        cert_file, key_file = self._files[0], self._files[1]
        leaf = check_files(pems, cert_file=cert_file, key_file=key_file, ca_file=self._ca_file, now=now)
        certificate = ServingCertificate(
            cert_file=cert_file,
            key_file=key_file,
            ca_bundle=pems[2] if self._ca_file is not None else pems[0],
            ca_file=self._ca_file,
        )
        # OpenSSL reads the files again: should they have changed since the stamps were taken, the next
        # look sees new stamps and loads them again, so what is served always ends up as on disk.
        return _Served(certificate=certificate, context=server_ssl_context(certificate), pems=pems, leaf=leaf)


def _describe(cert: x509.Certificate) -> dict[str, str]:
    return {"serial": f"{cert.serial_number:x}", "not_after": cert.not_valid_after_utc.isoformat()}
