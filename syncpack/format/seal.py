"""Sealing packet bodies to the recipient: X25519 + HKDF-SHA256 + ChaCha20-Poly1305, streamed.

The compressed body is cut into chunks of ``CHUNK`` bytes, each sealed with a nonce made of a
96-bit big-endian chunk counter whose top byte marks the final chunk (the STREAM construction),
so a gigabyte body is sealed and opened in constant memory, and truncating, reordering or
dropping chunks fails authentication.  The key comes from an ephemeral X25519 key pair per
packet (its public half travels in the signed header) and the recipient's X25519 key from the
roster; HKDF binds it to the packet id and both public keys.  The sender still signs the
header, which holds the hash of the sealed bytes: anyone can check who sent a packet, only the
recipient can read it.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO, Iterator

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from syncpack.errors import SealError

FEATURE = "seal-x25519-chacha20poly1305"
CHUNK = 64 * 1024
TAG = 16
INFO = b"syncpack seal v1"




def _raw(pub: X25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _key(shared: bytes, epk: bytes, recipient_pub: bytes, packet_id: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=epk + recipient_pub,
                info=INFO + packet_id).derive(shared)


def _nonce(counter: int, last: bool) -> bytes:
    return (b"\x01" if last else b"\x00") + counter.to_bytes(11, "big")


def ephemeral(seed: bytes | None, packet_id: bytes) -> X25519PrivateKey:
    """Random by default; derived from the reproducibility seed for golden vectors only."""
    if seed is None:
        return X25519PrivateKey.generate()
    return X25519PrivateKey.from_private_bytes(
        hashlib.blake2b(b"seal" + seed + packet_id, digest_size=32).digest())


def overhead(n: int) -> int:
    """Bytes sealing adds to a body of ``n`` compressed bytes."""
    return (n // CHUNK + 1) * TAG


class SealWriter:
    """A write-only file object that seals what it is given into ``sink``."""

    def __init__(self, sink: BinaryIO, recipient_pub: bytes, packet_id: bytes,
                 seed: bytes | None = None):
        eph = ephemeral(seed, packet_id)
        self.epk = _raw(eph.public_key())
        shared = eph.exchange(X25519PublicKey.from_public_bytes(recipient_pub))
        self._aead = ChaCha20Poly1305(_key(shared, self.epk, recipient_pub, packet_id))
        self._sink = sink
        self._buf = bytearray()
        self._n = 0

    def write(self, b: bytes) -> int:
        self._buf += b
        while len(self._buf) > CHUNK:   # keep at least one byte back for the final chunk
            chunk = bytes(self._buf[:CHUNK])
            del self._buf[:CHUNK]
            self._sink.write(self._aead.encrypt(_nonce(self._n, False), chunk, None))
            self._n += 1
        return len(b)

    def close_stream(self) -> None:
        self._sink.write(self._aead.encrypt(_nonce(self._n, True), bytes(self._buf), None))
        self._buf.clear()


def opener(recipient_key: X25519PrivateKey, recipient_pub: bytes, epk: bytes, packet_id: bytes):
    try:
        shared = recipient_key.exchange(X25519PublicKey.from_public_bytes(epk))
    except ValueError:
        # X25519 refuses an all-zero shared secret: the key is zero or a low-order point.
        raise SealError("sealed packet carries a malformed ephemeral key (zero or a "
                        "low-order X25519 point); it cannot be opened",
                        hint="the sender's software is broken or the packet was forged by "
                             "a member; it was not applied") from None
    return ChaCha20Poly1305(_key(shared, epk, recipient_pub, packet_id))


def unseal(chunks: Iterator[bytes], aead: ChaCha20Poly1305) -> Iterator[bytes]:
    """Plaintext of a sealed body given as arbitrary slices of its bytes."""
    buf = bytearray()
    n = 0
    step = CHUNK + TAG
    for piece in chunks:
        buf += piece
        while len(buf) > step:
            c = bytes(buf[:step])
            del buf[:step]
            try:
                yield aead.decrypt(_nonce(n, False), c, None)
            except InvalidTag:
                raise SealError("sealed body does not authenticate (wrong recipient key, "
                                "or damaged)") from None
            n += 1
    try:
        yield aead.decrypt(_nonce(n, True), bytes(buf), None)
    except InvalidTag:
        raise SealError("sealed body does not authenticate (wrong recipient key, truncated, "
                        "or damaged)") from None
