"""Who may take part in a swarm: everyone (public), or holders of a ticket signed by the swarm key (private).

A ticket is the swarm key's Ed25519 signature over

    msgpack([TICKET_DOMAIN, swarm public key (32 bytes), peer id (base58), expires (unix s, 0 = never)])

`swarm admit --key FILE --peer-id ID [--expires 30d]` prints one (`Ticket.encode()`: "swt1."
+ base64url of msgpack([swarm key, peer id, expires, signature])); the peer passes it with
`swarm peer --ticket TICKET` (or a file holding it). No server is involved: whoever holds
the swarm key admits, and anyone can check a ticket against the public key in the signed
run spec. A ticket names one libp2p peer id, whose key p2pd proves on every connection, so
it cannot be lent out without also handing over that peer's identity file.

`AdmissionPolicy` is the rule (picklable: the DHT's record validator runs it in the DHT's
own process); `Admission` is a peer's memory of whom it has seen admitted, for message
handlers: a peer presents its ticket on first contact by carrying it in every record it
writes (its stage announcement above all), and a handler asks `admits(sender)`.
Tickets cannot be revoked; give short expiries, or rotate the swarm key.
"""
from __future__ import annotations

import base64
import binascii
import logging
import math
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import msgpack

from swarm.options import opt

from .keys import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, SigningKey, fingerprint_of, verify
from .state_dir import WHERE, state_dir_path
from .work import MAX_BITS

__all__ = ["PEER_ID", "TICKET_DOMAIN", "Admission", "AdmissionError", "AdmissionPolicy", "AdmitOptions", "Ticket",
           "existing_swarm_key", "issue_ticket", "parse_duration", "read_ticket"]

log = logging.getLogger(__name__)

TICKET_DOMAIN = "subspace-swarm/ticket/v1"
_PREFIX = "swt1."
_MAX_TICKET_BYTES = 512
_MAX_REMEMBERED = 4096  # admitted peers a handler remembers, and refused peers it has logged


class AdmissionError(ValueError):
    """A peer without a valid ticket for this swarm; the message says what to do."""


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "15m", "12h", "30d"; "never" is 0 (no expiry)."""
    text = text.strip().lower()
    if text == "never":
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--expires {text!r} is not a duration; write e.g. 3600, 15m, 12h, 30d or never.")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@dataclass(frozen=True)
class Ticket:
    swarm_key: bytes  # raw Ed25519 public key of the swarm (the coordinator's --key)
    peer_id: str
    expires: float  # unix time; 0 = never
    signature: bytes

    @staticmethod
    def signing_bytes(swarm_key: bytes, peer_id: str, expires: float) -> bytes:
        return msgpack.packb([TICKET_DOMAIN, bytes(swarm_key), peer_id, float(expires)], use_bin_type=True)

    @classmethod
    def issue(cls, key: SigningKey, peer_id: str, expires: float = 0.0) -> Ticket:
        if not (isinstance(peer_id, str) and 0 < len(peer_id) <= 128):
            raise ValueError("--peer-id must be the peer's id, as `swarm identity FILE` prints it.")
        public = key.public_bytes()
        return cls(public, peer_id, float(expires), key.sign(cls.signing_bytes(public, peer_id, expires)))

    def to_bytes(self) -> bytes:
        return msgpack.packb([self.swarm_key, self.peer_id, self.expires, self.signature], use_bin_type=True)

    def encode(self) -> str:
        return _PREFIX + base64.urlsafe_b64encode(self.to_bytes()).decode("ascii").rstrip("=")

    @classmethod
    def from_bytes(cls, data: object) -> Ticket:
        """Parse a ticket as it travels in records; AdmissionError if it is not one."""
        if not isinstance(data, bytes) or not 0 < len(data) <= _MAX_TICKET_BYTES:
            raise AdmissionError("the ticket is missing or is not a ticket.")
        try:
            swarm_key, peer_id, expires, signature = msgpack.unpackb(data, raw=False)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            raise AdmissionError("the ticket is not a ticket (it does not decode).") from None
        ok = (isinstance(swarm_key, bytes) and len(swarm_key) == PUBLIC_KEY_BYTES and isinstance(peer_id, str)
              and isinstance(expires, (int, float)) and not isinstance(expires, bool) and math.isfinite(expires)
              and expires >= 0 and isinstance(signature, bytes) and len(signature) == SIGNATURE_BYTES)
        if not ok:
            raise AdmissionError("the ticket is malformed.")
        return cls(swarm_key, peer_id, float(expires), signature)

    @classmethod
    def decode(cls, text: str) -> Ticket:
        """Parse what `swarm admit` printed."""
        text = text.strip()
        if not text.startswith(_PREFIX):
            raise AdmissionError("--ticket must be what `swarm admit` printed (it starts with swt1.), "
                                 "or a file holding it.")
        body = text[len(_PREFIX):]
        try:
            data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise AdmissionError("the ticket is damaged (not base64); copy it again from `swarm admit`.") from None
        return cls.from_bytes(data)

    def verify(self, swarm_key: bytes, peer_id: str, until: float) -> None:
        """Raise AdmissionError unless the swarm key signed this ticket for `peer_id`, valid until `until`."""
        if self.swarm_key != bytes(swarm_key):
            raise AdmissionError(f"the ticket of {peer_id[-8:]} is for the swarm key {fingerprint_of(self.swarm_key)},"
                                 f" not this swarm's {fingerprint_of(swarm_key)}.")
        if self.peer_id != peer_id:
            raise AdmissionError(f"the ticket names peer {self.peer_id[-8:]}, not {peer_id[-8:]}.")
        if not verify(self.swarm_key, self.signing_bytes(self.swarm_key, self.peer_id, self.expires), self.signature):
            raise AdmissionError(f"the ticket of {peer_id[-8:]} is not signed by the swarm key.")
        if self.expires and until > self.expires:
            raise AdmissionError(f"the ticket of {peer_id[-8:]} expired (or expires before {until:.0f}); "
                                 f"ask the coordinator for a new one.")


@dataclass
class AdmitOptions:
    """What `swarm admit` is told; each field is also its flag."""

    key: str | None = opt(None, "the swarm key file, as the coordinator runs with it (default: swarm.key in the "
                          "state folder, the coordinator's default)", metavar="FILE")
    peer_id: str = opt("", "the peer's id, as `swarm identity FILE` prints it", metavar="ID", required=True)
    expires: str = opt("30d", "how long the ticket is valid: seconds, or 15m, 12h, 30d, never", metavar="T")
    state_dir: str | None = opt(None, f"the state folder of the default key (default: {WHERE})", metavar="DIR")


PEER_ID = re.compile(r"[1-9A-HJ-NP-Za-km-z]{32,128}")  # base58btc


def issue_ticket(opts: AdmitOptions, now: float | None = None) -> Ticket:
    """The ticket `swarm admit` prints; ValueError (one sentence) for a missing key or a malformed peer id."""
    key = existing_swarm_key(opts.key, opts.state_dir)
    if not PEER_ID.fullmatch(opts.peer_id):
        raise ValueError(f"--peer-id {opts.peer_id!r} is not a peer id; `swarm identity FILE` prints a peer's id.")
    seconds = parse_duration(opts.expires)
    expires = (time.time() if now is None else now) + seconds if seconds else 0.0
    return Ticket.issue(key, opts.peer_id, expires)


def existing_swarm_key(path: str | None, state_dir: str | None) -> SigningKey:
    """The swarm key at `path` (default: swarm.key in the state folder, the coordinator's); ValueError (one sentence)
    if there is none: a command that signs for the swarm never makes a new key."""
    key = path or str(state_dir_path(state_dir) / "swarm.key")
    if not os.path.isfile(key):
        raise ValueError(f"there is no swarm key at {key}; pass the file the coordinator runs with (--key).")
    return SigningKey.load_or_create(key)


def read_ticket(value: str | None) -> Ticket | None:
    """`--ticket`: the text `swarm admit` printed, or the path of a file holding it."""
    if not value:
        return None
    text = value
    if not value.strip().startswith(_PREFIX):
        try:
            with open(value) as f:
                text = f.read()
        except OSError as e:
            raise AdmissionError(f"--ticket {value!r} is neither a ticket (swt1....) nor a readable file ({e}).") \
                from None
    return Ticket.decode(text)


@dataclass(frozen=True)
class AdmissionPolicy:
    """The swarm's rule, known from the signed run spec (or, until it is read, from this peer's own ticket)."""

    private: bool = False
    swarm_key: bytes = b""  # the coordinator's raw public key; empty while unknown
    coordinator_peer: str = ""  # the coordinator's libp2p peer id (it needs no ticket, nor proof of work)
    work_bits: int = 0  # every peer record carries a proof of this much work for its id (`swarm/trust/work.py`)

    @classmethod
    def for_spec(cls, spec) -> AdmissionPolicy:
        """The policy a signed `protocol.spec.RunSpec` states (`extra["private"]`, its coordinator key and peer,
        `extra["id_work_bits"]`: absent in older coordinators' specs, and then 0)."""
        key = bytes.fromhex(spec.coordinator_key) if spec.coordinator_key else b""
        bits = spec.extra.get("id_work_bits", 0)
        bits = min(max(bits, 0), MAX_BITS) if isinstance(bits, int) and not isinstance(bits, bool) else 0
        return cls(bool(spec.extra.get("private", False)), key, str(spec.extra.get("coordinator_peer", "")), bits)

    @classmethod
    def from_ticket(cls, ticket: Ticket | None) -> AdmissionPolicy:
        return cls(True, ticket.swarm_key) if ticket is not None else cls()

    def check(self, peer_id: str, ticket: bytes | Ticket | None, until: float | None = None) -> Ticket | None:
        """Raise AdmissionError unless `peer_id` may take part until `until` (default: now).

        Public swarm: everyone may. Private: the coordinator, and peers with a valid ticket.
        """
        if not self.private or (self.coordinator_peer and peer_id == self.coordinator_peer):
            return None
        if not self.swarm_key:
            raise AdmissionError("this swarm is private but its key is not known yet; read the run spec first.")
        if ticket is None or ticket == b"":
            raise AdmissionError(f"peer {peer_id[-8:]} has no ticket, and this swarm is private: ask its "
                                 f"coordinator for one (`swarm admit --key KEY --peer-id {peer_id}`) and start the "
                                 f"peer with --ticket.")
        parsed = ticket if isinstance(ticket, Ticket) else Ticket.from_bytes(ticket)
        parsed.verify(self.swarm_key, peer_id, time.time() if until is None else until)
        return parsed


@dataclass
class Admission:
    """A peer's view of who is admitted, for message handlers (`admits`) and records (`learn`)."""

    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    _admitted: OrderedDict[str, float] = field(default_factory=OrderedDict, init=False, repr=False)  # -> expiry
    _logged: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False, repr=False)

    def adopt(self, policy: AdmissionPolicy) -> None:
        """Apply a new rule; peers admitted under another swarm key are forgotten."""
        if policy.swarm_key != self.policy.swarm_key:
            self._admitted.clear()
        self.policy = policy

    def check(self, peer_id: str, ticket: bytes | Ticket | None) -> None:
        """Raise AdmissionError (logged once per peer) unless `peer_id` with this ticket may take part now."""
        try:
            parsed = self.policy.check(peer_id, ticket)
        except AdmissionError as e:
            self._log_refusal(peer_id, str(e))
            raise
        if parsed is not None:
            self._remember(peer_id, parsed.expires)

    def learn(self, peer_id: str, ticket: bytes | Ticket | None) -> bool:
        """Remember a peer whose record carried a valid ticket; False (silently) if it did not."""
        try:
            parsed = self.policy.check(peer_id, ticket)
        except AdmissionError:
            return False
        if parsed is not None:
            self._remember(peer_id, parsed.expires)
        return True

    def admit_coordinator(self, peer_id: str, until: float) -> None:
        """A coordinator whose claim to the seat the swarm key signed (a standby that took over): admitted
        until `until` (unix time), like a ticket holder."""
        self._remember(peer_id, until)

    def knows(self, peer_id: str) -> bool:
        """`admits` without logging a refusal."""
        if not self.policy.private or peer_id == self.policy.coordinator_peer:
            return True
        expires = self._admitted.get(peer_id)
        return expires is not None and (not expires or expires >= time.time())

    def admits(self, peer_id: str) -> bool:
        """May a message from `peer_id` be served? Public: yes. Private: the coordinator, or a peer whose
        valid ticket this process has seen (in its records, or presented through `check`). A refusal is
        logged once per peer."""
        if self.knows(peer_id):
            return True
        self._log_refusal(peer_id, f"peer {peer_id[-8:]} has presented no valid ticket for this private swarm.")
        return False

    def _remember(self, peer_id: str, expires: float) -> None:
        self._admitted[peer_id] = expires
        self._admitted.move_to_end(peer_id)
        if len(self._admitted) > _MAX_REMEMBERED:
            self._admitted.popitem(last=False)

    def _log_refusal(self, peer_id: str, reason: str) -> None:
        if peer_id in self._logged:
            log.debug("refused %s again: %s", peer_id, reason)
            return
        self._logged[peer_id] = None
        if len(self._logged) > _MAX_REMEMBERED:
            self._logged.popitem(last=False)
        log.warning("refused peer %s: %s", peer_id, reason)
