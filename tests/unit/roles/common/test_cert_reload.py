"""Reloading a rotated serving certificate: when the files are loaded, what is refused, and what is then served."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography import x509
from structlog.testing import capture_logs

from roles.common.cert_reload import ReloadingCertificate, Stamps, Step, Watch, check_files, loaded, next_step, refused
from roles.common.config import ConfigError, load_config
from roles.common.tls import CA_FILE, CERT_FILE, KEY_FILE, ServingCertificate, TlsError
from tests.unit.containers.secret_volume import Pem, SecretVolume, make_pem

A: Stamps = ((1, 10, 500, 1000), (1, 11, 200, 1000))
B: Stamps = ((1, 20, 510, 2000), (1, 11, 200, 1000))
C: Stamps = ((1, 20, 510, 2000), (1, 21, 200, 3000))


def served_serial(context: ssl.SSLContext) -> int:
    """The serial of the certificate a server with ``context`` presents (handshake in memory)."""
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.check_hostname = False
    client_context.verify_mode = ssl.CERT_NONE
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(to_client, to_server)
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = context.wrap_bio(server_in, server_out, server_side=True)
    for _ in range(10):
        try:
            client.do_handshake()
        except ssl.SSLWantReadError:
            pass
        else:
            der = client.getpeercert(binary_form=True)
            assert der is not None
            return x509.load_der_x509_certificate(der).serial_number
        server_in.write(to_server.read())
        with contextlib.suppress(ssl.SSLWantReadError):
            server.do_handshake()
        to_client.write(server_out.read())
    raise AssertionError("the in-memory handshake did not finish")


# ------------------------------------------------------------------------------------------ when to load


def test_unchanged_files_keep_the_served_certificate() -> None:
    """A look that finds the files as served does nothing."""
    assert next_step(loaded(A), A) == (loaded(A), Step.KEEP)


def test_a_change_is_loaded_once_the_files_held_still_for_one_look() -> None:
    """A change is waited on for one look (the writer may not be done), then loaded."""
    watch, step = next_step(loaded(A), B)
    assert step is Step.WAIT
    watch, step = next_step(watch, B)
    assert step is Step.LOAD
    assert next_step(loaded(B), B)[1] is Step.KEEP


def test_files_still_changing_are_not_loaded() -> None:
    """Files that change at every look (a writer replacing them one by one) are loaded once they stop."""
    watch, first = next_step(loaded(A), B)
    watch, second = next_step(watch, C)
    watch, third = next_step(watch, C)
    assert (first, second, third) == (Step.WAIT, Step.WAIT, Step.LOAD)


def test_refused_files_are_not_tried_again_until_they_change() -> None:
    """Files refused once are left alone (one warning, not one a look); their next change is loaded."""
    watch = refused(Watch(served=A, seen=B), B)
    for _ in range(3):
        watch, step = next_step(watch, B)
        assert step is Step.KEEP
    watch, step = next_step(watch, C)
    assert step is Step.WAIT
    assert next_step(watch, C)[1] is Step.LOAD


def test_files_put_back_as_served_after_a_refusal_change_nothing() -> None:
    """Going back to the files served, after a refused change, is no change at all."""
    watch = refused(Watch(served=A, seen=B), B)
    assert next_step(watch, A)[1] is Step.KEEP


# ----------------------------------------------------------------------------------------- what to refuse


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pem]:
    """Certificates A and B (each from its own CA), and one expired yesterday."""
    root = tmp_path_factory.mktemp("pems")
    return {
        "a": make_pem(root / "a"),
        "b": make_pem(root / "b"),
        "expired": make_pem(root / "expired", expired=True),
    }


def _check(cert: bytes, key: bytes, ca: bytes | None = None) -> x509.Certificate:
    ca_file = Path("/tls/ca.crt") if ca is not None else None
    contents = (cert, key) if ca is None else (cert, key, ca)
    return check_files(
        contents, cert_file=Path("/tls/tls.crt"), key_file=Path("/tls/tls.key"), ca_file=ca_file, now=datetime.now(UTC)
    )


def test_a_matching_pair_is_accepted(pems: dict[str, Pem]) -> None:
    """A certificate with its own key (and a CA file of certificates) may be served."""
    a = pems["a"]
    assert _check(a.cert, a.key, a.ca).serial_number == a.serial


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "key of another certificate",
            r"the private key in /tls/tls.key does not belong to the certificate in /tls/tls.crt",
        ),
        ("half-written certificate", r"/tls/tls.crt holds no PEM certificate"),
        ("half-written key", r"/tls/tls.key holds no unencrypted PEM private key"),
        ("empty key", r"/tls/tls.key holds no unencrypted PEM private key"),
        ("half-written CA", r"/tls/ca.crt holds no PEM certificates"),
        ("expired certificate", r"the certificate in /tls/tls.crt expired at "),
    ],
)
def test_unusable_files_are_refused_naming_the_file(pems: dict[str, Pem], case: str, message: str) -> None:
    """Whatever cannot be served is refused with the file that is wrong in the message."""
    a, b, expired = pems["a"], pems["b"], pems["expired"]
    contents = {
        "key of another certificate": (b.cert, a.key, b.ca),
        "half-written certificate": (b.cert[: len(b.cert) // 2], b.key, b.ca),
        "half-written key": (b.cert, b.key[: len(b.key) // 2], b.ca),
        "empty key": (b.cert, b"", b.ca),
        "half-written CA": (b.cert, b.key, b.ca[:40]),
        "expired certificate": (expired.cert, expired.key, expired.ca),
    }[case]
    with pytest.raises(TlsError, match=message):
        _check(*contents)


def test_an_expired_certificate_is_accepted_when_there_is_no_other(pems: dict[str, Pem]) -> None:
    """At start (no time given) expiry is not checked: an expired certificate is still the only one."""
    expired = pems["expired"]
    cert = check_files((expired.cert, expired.key), cert_file=Path("c"), key_file=Path("k"), ca_file=None, now=None)
    assert cert.serial_number == expired.serial


# ------------------------------------------------------------------------------- what is then served


def _mounted(volume: SecretVolume, pem: Pem) -> ReloadingCertificate:
    volume.write(pem.files())
    return ReloadingCertificate(
        ServingCertificate(
            cert_file=volume.path(CERT_FILE),
            key_file=volume.path(KEY_FILE),
            ca_bundle=b"",
            ca_file=volume.path(CA_FILE),
        )
    )


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


def test_a_rotated_secret_is_served_once_it_held_still(tmp_path: Path, pems: dict[str, Pem]) -> None:
    """After the kubelet's swap to B, the next look waits, the one after serves B (and its CA), logged once."""
    a, b = pems["a"], pems["b"]
    volume = SecretVolume(tmp_path / "tls")
    certificate = _mounted(volume, a)
    before = certificate.context()
    assert (served_serial(before), certificate.certificate.ca_bundle) == (a.serial, a.ca)
    volume.write(b.files())
    with capture_logs() as logs:
        assert not certificate.poll(structlog.get_logger())
        assert certificate.context() is before
        assert certificate.poll(structlog.get_logger())
        assert not certificate.poll(structlog.get_logger())
    assert (served_serial(certificate.context()), certificate.certificate.ca_bundle) == (b.serial, b.ca)
    assert served_serial(before) == a.serial  # what connections made before still hold
    (reloaded,) = _events(logs, "certificate_reloaded")
    assert reloaded["serial"] == f"{b.serial:x}"
    assert str(reloaded["not_after"]) == x509.load_pem_x509_certificate(b.cert).not_valid_after_utc.isoformat()


@pytest.mark.parametrize("broken", ["key of another certificate", "missing key", "expired certificate"])
def test_a_broken_rotation_is_refused_once_and_the_certificate_kept(
    tmp_path: Path, pems: dict[str, Pem], broken: str
) -> None:
    """Files that cannot be served are refused with one warning naming the file; A stays until usable files come."""
    a, b, expired = pems["a"], pems["b"], pems["expired"]
    volume = SecretVolume(tmp_path / "tls")
    certificate = _mounted(volume, a)
    files, culprit = {
        "key of another certificate": ({**b.files(), KEY_FILE: a.key}, KEY_FILE),
        "missing key": ({CERT_FILE: b.cert, CA_FILE: b.ca}, KEY_FILE),
        "expired certificate": (expired.files(), CERT_FILE),
    }[broken]
    volume.write(files)
    with capture_logs() as logs:
        for _ in range(5):
            assert not certificate.poll(structlog.get_logger())
    assert (served_serial(certificate.context()), certificate.certificate.ca_bundle) == (a.serial, a.ca)
    (refusal,) = _events(logs, "certificate_refused")
    assert str(volume.path(culprit)) in str(refusal["error"])
    assert (refusal["kept_serial"], refusal["log_level"]) == (f"{a.serial:x}", "warning")
    volume.write(b.files())
    certificate.poll(structlog.get_logger())
    assert certificate.poll(structlog.get_logger())
    assert served_serial(certificate.context()) == b.serial


def test_files_written_again_with_the_same_contents_change_nothing(tmp_path: Path, pems: dict[str, Pem]) -> None:
    """A Secret written again unchanged (new inodes, same bytes) keeps the context and logs nothing."""
    volume = SecretVolume(tmp_path / "tls")
    certificate = _mounted(volume, pems["a"])
    before = certificate.context()
    volume.write(pems["a"].files())
    with capture_logs() as logs:
        for _ in range(3):
            assert not certificate.poll(structlog.get_logger())
    assert certificate.context() is before
    assert logs == []


def test_a_role_does_not_start_with_unusable_files(tmp_path: Path, pems: dict[str, Pem]) -> None:
    """At start there is nothing to keep: a key of another certificate is an error naming it."""
    volume = SecretVolume(tmp_path / "tls")
    volume.write({**pems["b"].files(), KEY_FILE: pems["a"].key})
    with pytest.raises(TlsError, match="does not belong"):
        ReloadingCertificate(
            ServingCertificate(cert_file=volume.path(CERT_FILE), key_file=volume.path(KEY_FILE), ca_bundle=b"")
        )


@pytest.mark.parametrize("role", ["cloud", "controller"])
def test_the_reload_interval_is_a_positive_number_of_seconds(role: str) -> None:
    """``tlsReloadInterval`` defaults to 5 seconds; zero is refused, naming the field."""
    cfg = load_config(role, None, {})
    assert cfg.tls_reload_interval == 5.0  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="tlsReloadInterval"):
        load_config(role, None, {"tlsReloadInterval": 0})
