"""A directory laid out as the kubelet mounts a Secret and updated as it updates one; certificates to put in it.

The kubelet writes each version of the Secret into a new hidden directory, then points the
``..data`` symlink at it with one rename (atomic), then removes the previous directory; each key
is a symlink ``name -> ..data/name`` made once.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509

from roles.common.tls import CA_FILE, CERT_FILE, KEY_FILE, generate_serving_certificate


@dataclass(frozen=True, slots=True)
class Pem:
    """A generated serving certificate's files (each from a CA of its own), as bytes."""

    cert: bytes
    key: bytes
    ca: bytes

    @property
    def serial(self) -> int:
        return x509.load_pem_x509_certificate(self.cert).serial_number

    def files(self) -> dict[str, bytes]:
        return {CERT_FILE: self.cert, KEY_FILE: self.key, CA_FILE: self.ca}


def make_pem(directory: Path, *, expired: bool = False) -> Pem:
    """A new CA and a serving certificate for localhost and 127.0.0.1 (``expired``: two days ago, for one day)."""
    now = datetime.now(UTC) - timedelta(days=2) if expired else None
    valid_for = timedelta(days=1) if expired else timedelta(days=30)
    cert = generate_serving_certificate(directory, dns_names=["localhost"], valid_for=valid_for, now=now)
    return Pem(cert=cert.cert_file.read_bytes(), key=cert.key_file.read_bytes(), ca=cert.ca_bundle)


@dataclass(slots=True)
class SecretVolume:
    """A mounted Secret in ``root``; :meth:`write` puts a new version in place."""

    root: Path
    _versions: itertools.count[int] = field(default_factory=itertools.count)

    def path(self, name: str) -> Path:
        return self.root / name

    def write(self, files: Mapping[str, bytes]) -> None:
        """Make ``files`` the Secret's contents, as the kubelet does: a new directory, one rename of ``..data``."""
        self.root.mkdir(parents=True, exist_ok=True)
        data = self.root / "..data"
        previous = data.resolve() if data.is_symlink() else None
        version = self.root / f"..version_{next(self._versions)}"
        version.mkdir()
        for name, content in files.items():
            (version / name).write_bytes(content)
        staged = self.root / "..data_tmp"
        staged.symlink_to(version.name)
        os.replace(staged, data)
        for name in files:
            if not self.path(name).is_symlink():
                self.path(name).symlink_to(f"..data/{name}")
        if previous is not None:
            shutil.rmtree(previous)
