"""A throw-away certificate authority and broker certificate for the local broker's SASL_SSL listener.

Made fresh at every start and kept in the broker's own data directory, so nothing about it is a secret worth
keeping: it proves only that clients verify the broker (a client without the CA's file must fail). The broker
reads its key and chain as a PEM keystore; clients trust ``ca.pem`` (librdkafka's ``ssl.ca.location``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from dagster_streamgroup.extras import missing_extra


@dataclass(frozen=True)
class BrokerTls:
    ca_file: Path
    """The CA certificate clients trust (``ssl.ca.location``)."""
    keystore_file: Path
    """The broker's unencrypted private key followed by its certificate chain, PEM (``ssl.keystore.type=PEM``)."""


def make_broker_tls(directory: Path, host: str = "127.0.0.1", days: int = 2) -> BrokerTls:
    """A CA and a certificate for ``host`` (and ``localhost``) signed by it, written under ``directory``."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise missing_extra("cryptography", "local", "the local broker's SASL_SSL listener (--sasl-user)") from exc

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamgroup local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(broker_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    keystore_file = directory / "broker-keystore.pem"
    key_pem = broker_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    keystore_file.write_bytes(key_pem + broker_cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    keystore_file.chmod(0o600)
    return BrokerTls(ca_file=ca_file, keystore_file=keystore_file)
