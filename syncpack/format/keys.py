"""Site key pairs: Ed25519 for signing packets, X25519 for sealing them to a recipient.

Private keys are written owner-only (mode 0600, created with that mode so they are never
readable by others even for an instant).  The public key file handed to ``mkreplica export``
also names the site and its id, so a key cannot be attached to the wrong site by mistake.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from syncpack.errors import SiteError, UsageError
from syncpack.format.names import check_site_name

KEY_DIR = "keys"
SIGN_KEY = "sign.key"
BOX_KEY = "box.key"
PUBLIC_FILE = "site.pub"


@dataclass(frozen=True)
class PublicIdentity:
    site: str
    site_id: bytes
    ed25519: bytes
    x25519: bytes

    def to_json(self) -> str:
        return json.dumps({"syncpack_public_key": 1, "site": self.site,
                           "site_id": self.site_id.hex(), "ed25519": self.ed25519.hex(),
                           "x25519": self.x25519.hex()}, indent=2) + "\n"


def _serialization():
    """cryptography's key-file formats, loaded only by what reads or writes key files: an
    import or a get verifies with raw public keys and starts ~10 ms sooner without them."""
    from cryptography.hazmat.primitives import serialization
    return serialization


def _raw_pub(k) -> bytes:
    serialization = _serialization()
    return k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _write_private(path: Path, raw: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o600)  # in case a umask or filesystem widened it


def generate(site_dir: Path, site: str, site_id: bytes) -> PublicIdentity:
    kd = site_dir / KEY_DIR
    kd.mkdir(mode=0o700, exist_ok=True)
    sk = Ed25519PrivateKey.generate()
    bk = X25519PrivateKey.generate()
    serialization = _serialization()
    pem = serialization.PrivateFormat.PKCS8
    enc = serialization.NoEncryption()
    _write_private(kd / SIGN_KEY, sk.private_bytes(serialization.Encoding.PEM, pem, enc))
    _write_private(kd / BOX_KEY, bk.private_bytes(serialization.Encoding.PEM, pem, enc))
    ident = PublicIdentity(site, site_id, _raw_pub(sk), _raw_pub(bk))
    (kd / PUBLIC_FILE).write_text(ident.to_json())
    return ident


def public_path(site_dir: Path) -> Path:
    return site_dir / KEY_DIR / PUBLIC_FILE


_RESTORE_KEYS = "restore the site's keys directory from its backup"


def _load_private(site_dir: Path, name: str, kind: type, what: str):
    p = site_dir / KEY_DIR / name
    try:
        k = _serialization().load_pem_private_key(p.read_bytes(), password=None)
    except FileNotFoundError:
        raise SiteError(f"{what} key {p} is missing", hint=_RESTORE_KEYS) from None
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # the library's own words name its internals and a web page, not the file's problem
        raise SiteError(f"{what} key {p} is damaged: it is not a private key file",
                        hint=_RESTORE_KEYS) from None
    if not isinstance(k, kind):
        raise SiteError(f"{p} is not an {kind.__name__.removesuffix('PrivateKey')} key",
                        hint=_RESTORE_KEYS)
    return k


def read_own_public(site_dir: Path) -> PublicIdentity:
    """This site's own public key file, which a site needs and never gets from anyone."""
    try:
        return read_public_file(public_path(site_dir))
    except UsageError as e:
        raise SiteError(e.message, hint=_RESTORE_KEYS) from None


def load_signing_key(site_dir: Path) -> Ed25519PrivateKey:
    return _load_private(site_dir, SIGN_KEY, Ed25519PrivateKey, "signing")


def load_box_key(site_dir: Path) -> X25519PrivateKey:
    return _load_private(site_dir, BOX_KEY, X25519PrivateKey, "sealing")


def unsealer(site_dir: Path):
    """A callable that, given a sealed packet's header, returns the AEAD that opens its body.
    The private key is loaded only when a sealed packet shows up."""
    def open_for(header):
        from syncpack.format import seal
        k = load_box_key(site_dir)
        return seal.opener(k, _raw_pub(k), header.seal_epk, header.packet_id)

    return open_for


def read_public_file(path: Path) -> PublicIdentity:
    try:
        d = json.loads(Path(path).read_text())
        if d.get("syncpack_public_key") != 1:
            raise ValueError("not a syncpack public key file")
        ident = PublicIdentity(d["site"], bytes.fromhex(d["site_id"]),
                               bytes.fromhex(d["ed25519"]), bytes.fromhex(d["x25519"]))
        if len(ident.site_id) != 8 or len(ident.ed25519) != 32 or len(ident.x25519) != 32:
            raise ValueError("wrong key or id length")
    except FileNotFoundError:
        raise UsageError(f"public key file {path} does not exist",
                         hint="pass the site.pub that 'syncpack keygen' made in the new site's "
                              "keys directory (DIR/keys/site.pub)") from None
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not a syncpack public key file ({e})",
                         hint="use the file 'syncpack keygen' printed") from None
    check_site_name(ident.site, UsageError)
    return ident


def verify(public_raw: bytes, signature: bytes, data: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, data)
        return True
    except (InvalidSignature, ValueError):
        return False


def fingerprint(public_raw: bytes) -> str:
    """A short, readable digest of a public key, to compare over the phone."""
    import hashlib
    h = hashlib.sha256(b"syncpack key\0" + public_raw).hexdigest()[:32]
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))
