"""`dpfl deploy certs`: a CA, the SuperLink's certificate for the hosts hospitals dial,
and SuperNode key pairs, for tests and trials (the loopback cluster makes its own the
same way)."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from dpfl.cli import app


def test_dpfl_deploy_certs_makes_a_ca_a_server_certificate_and_hospital_keys(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tls"
    command = ["deploy", "certs", str(out), "--host", "coordinator.example.org"]
    command += ["--host", "10.0.0.5", "--hospital", "hospital-0", "--hospital", "hospital-1"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["coordinator.example.org"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    valid = server.not_valid_after_utc - server.not_valid_before_utc
    assert round(valid.total_seconds() / 86400, 2) == 30.0  # the default 30 days and 5 min
    key = serialization.load_pem_private_key((out / "server.key").read_bytes(), None)
    assert key.public_key() == server.public_key()
    for name in ("hospital-0", "hospital-1"):
        private = serialization.load_ssh_private_key((out / f"{name}.key").read_bytes(), None)
        public = serialization.load_ssh_public_key((out / f"{name}.key.pub").read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.public_key() == public and private.curve.name == "secp384r1"
        assert stat.S_IMODE((out / f"{name}.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "server.key").stat().st_mode) == 0o600


def test_dpfl_deploy_certs_never_overwrites_a_key(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    assert CliRunner().invoke(app, ["deploy", "certs", str(out), "--host", "h"]).exit_code == 0
    before = (out / "server.key").read_bytes()
    again = CliRunner().invoke(app, ["deploy", "certs", str(out), "--host", "h"])
    assert again.exit_code == 2 and "already exist: give another folder" in again.output
    assert "Traceback" not in again.output
    assert (out / "server.key").read_bytes() == before
