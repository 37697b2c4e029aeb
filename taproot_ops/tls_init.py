"""A throwaway CA and one certificate for every role of a cluster (`[tls]
auto = true`: the embedded cluster, `make run`; or `taproot tls init`),
made with the `cryptography` library. For production, give `[tls]` the
files of your own CA instead."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

import conf

VALID_DAYS = 90


def host_names(config: conf.ClusterConfig) -> list[str]:
    hosts = {"127.0.0.1", "localhost", "::1"}
    hosts.update(n.host for n in config.nodes)
    hosts.update(p.host for p in config.proxies)
    return sorted(h for h in hosts if h and h not in ("0.0.0.0", "::"))


def make(directory: Path, names: list[str], cluster: str) -> tuple[Path, Path, Path]:
    """Write ca.pem, cluster.pem and cluster-key.pem (mode 0600) into
    `directory`: a new CA, and a certificate it signs for `names` (IP
    addresses and DNS names), good for servers and clients (mutual TLS)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    until = now + dt.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Taproot throwaway CA ({cluster})")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"taproot {cluster}")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ca.pem", directory / "cluster.pem", directory / "cluster-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return paths


def ensure(config: conf.ClusterConfig) -> bool:
    """With `[tls] enabled` and `auto`, make the throwaway files if any is
    missing; True if they were made."""
    tls = config.tls
    if not (tls.enabled and tls.auto) or tls.ca_file:
        return False
    files = [Path(p) for p in tls.files(config.local_dir)]
    if all(f.exists() for f in files):
        return False
    make(files[0].parent, host_names(config), config.name)
    return True
