"""TLS certificates and SuperNode key pairs for a deployment's tests and trials: a CA
made on the spot, the SuperLink's certificate for its host names, and one OpenSSH key
pair per hospital (`dpfl deploy certs`, the loopback cluster). A production deployment
takes its certificate from a real CA and lets each hospital make its own key
(docs/deployment.md, "Certificates and keys")."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dpfl.files import replacing

CA_NAME = "dpfl trial CA"


class Tls(NamedTuple):
    """The files `certificates` writes."""

    ca: Path
    """ca.crt: the CA certificate every hospital and the coordinator trust."""
    certificate: Path
    """server.pem: the SuperLink's certificate, signed by the CA."""
    key: Path
    """server.key: the SuperLink's private key (readable by its owner only)."""


def _address(host: str) -> x509.GeneralName:
    """A host as a certificate names it: an IP address, or a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def certificates(folder: Path, hosts: Sequence[str], *, days: float = 1 / 24) -> Tls:
    """A new CA (P-256) and the SuperLink's certificate for `hosts` (names or IP
    addresses) and key, valid from five minutes ago for `days`, written to `folder`
    (created; a file already there is refused, never overwritten). The CA's private key
    is not kept: nothing more can be signed with it."""
    if not hosts:
        raise ValueError("give the SuperLink's host name or address (at least one)")
    if not days > 0:
        raise ValueError(f"days must be > 0, got {days!r}")
    paths = Tls(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    _refuse_existing(paths)
    now = datetime.datetime.now(datetime.UTC)

    def signed(name: str, key: ec.EllipticCurvePrivateKey, ca: bool) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = signed(CA_NAME, ca_key, True).sign(ca_key, hashes.SHA256())
    names = x509.SubjectAlternativeName([_address(h) for h in hosts])
    cert = signed(hosts[0], key, False).add_extension(names, critical=False)
    folder.mkdir(parents=True, exist_ok=True)
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.certificate.write_bytes(
        cert.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    )
    _private(
        paths.key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return paths


def keys(folder: Path, names: Sequence[str]) -> dict[str, Path]:
    """Each hospital's SuperNode key pair (OpenSSH, P-384, as `ssh-keygen -t ecdsa -b
    384` makes): NAME.key (private, readable by its owner only) and NAME.key.pub in
    `folder` (created; a file already there is refused). By name, the private key."""
    paths = {name: folder / f"{name}.key" for name in names}
    _refuse_existing([p for path in paths.values() for p in (path, _public(path))])
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths.values():
        key = ec.generate_private_key(ec.SECP384R1())
        _private(
            path,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            ),
        )
        _public(path).write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
        )
    return paths


def _public(private: Path) -> Path:
    return private.with_name(private.name + ".pub")


def _refuse_existing(paths: Sequence[Path]) -> None:
    there = [str(p) for p in paths if p.exists()]
    if there:
        raise FileExistsError(f"{', '.join(there)} already exist: give another folder")


def _private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only (0600 before any byte is in it)."""
    with replacing(path) as partial:
        partial.write_bytes(b"")
        partial.chmod(0o600)
        partial.write_bytes(data)
