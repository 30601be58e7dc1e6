"""`SwarmRecordValidator`: every honest DHT node refuses records their writer could not have written.

hivemind calls a node's validator on every record another node asks it to store, on every
record a lookup brings back (a reply with one bad entry is dropped whole), and on the node's
own writes. Ours runs `envelope.check_envelope` on each, so a forged, misfiled, replayed or
far-expiry record is neither stored nor passed on by honest nodes, and cannot replace or
outlive (lock) its owner's record. hivemind's validators see the key only as its DHTID hash,
so the envelope names its key and we re-derive the hash. The swarm's DHT holds swarm records
only: a value that is not a swarm envelope (a plain value, an unknown key) is refused too.

Store strictly, look up leniently. The expiry bound is the one rule that reads the local
clock, and hivemind drops a whole lookup reply (every peer under that key) if one entry fails.
A record written at the edge of the bound by the storing node's clock would then make every
reader whose clock lags a little drop every honest node's reply for that key: one peer could
hide a whole stage. So the bound is applied when a record is stored (requests from other
nodes, and our own writes) but not to lookup replies (`mark_lookups` tags hivemind's
`call_find`); readers (`SwarmDHT`) still apply it, entry by entry.

The validator lives in the DHT's own process (it is pickled there with the DHT); its
`AdmissionPolicy` is replaced there by `set_policy` once the node learns the swarm's rule
from the signed run spec, which also drops stored records the new rule refuses, so that an
honest node never keeps serving a record its readers will refuse.
"""
from __future__ import annotations

import contextvars
import hashlib
import logging
import warnings
from collections import OrderedDict, deque
from functools import partial

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    import hivemind
    from hivemind.dht.routing import DHTID
    from hivemind.dht.storage import DictionaryDHTValue
    from hivemind.dht.validation import DHTRecord, RecordValidatorBase
    from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.trust.admission import AdmissionPolicy

from .envelope import Envelope, check_envelope
from .records import RecordError

__all__ = ["SwarmRecordValidator", "in_lookup", "mark_lookups", "refused_records", "set_policy"]

log = logging.getLogger(__name__)

_MAX_LOGGED = 1024  # writers whose first refusal was logged as a warning (later ones: debug)
_MAX_ACCEPTED = 8192  # digests of records already accepted: every lookup brings the same ones back

in_lookup: contextvars.ContextVar[bool] = contextvars.ContextVar("swarm_dht_in_lookup", default=False)


class SwarmRecordValidator(RecordValidatorBase):
    def __init__(self, policy: AdmissionPolicy | None = None) -> None:
        self.policy = policy or AdmissionPolicy()
        self.refused = 0
        self.reasons: deque[str] = deque(maxlen=32)
        self._logged: OrderedDict[str, None] = OrderedDict()
        self._accepted: OrderedDict[bytes, None] = OrderedDict()

    def set_policy(self, policy: AdmissionPolicy) -> None:
        self.policy = policy
        self._accepted.clear()  # what the old rule accepted, the new one may not

    def validate(self, record: DHTRecord) -> bool:
        # A record accepted once stays acceptable under the same rule: its signature and ticket do
        # not change, and its expiry only gets further within the bound as time passes.
        digest = hashlib.sha256(b"\0".join((record.key, record.subkey, record.value,
                                             repr(record.expiration_time).encode()))).digest()
        lookup = in_lookup.get()
        if digest in self._accepted:
            self._accepted.move_to_end(digest)
            return True
        claimed = "?"
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            claimed = subkey if isinstance(subkey, str) else "?"
            env = Envelope.from_entry(subkey, MSGPackSerializer.loads(record.value), record.expiration_time)
            if DHTID.generate(source=env.key).to_bytes() != record.key:
                raise RecordError(f"the record names key {env.key[:80]!r} but was filed under another.")
            check_envelope(env, get_dht_time(), self.policy, bound_expiry=not lookup)
        except RecordError as e:
            self._refuse(claimed, str(e))
            return False
        except Exception as e:  # anything that does not even unpack: junk, refused the same way
            self._refuse(claimed, f"the record does not decode ({type(e).__name__}).")
            return False
        if not lookup:  # remembered only if it passed every rule, the expiry bound included
            self._accepted[digest] = None
            if len(self._accepted) > _MAX_ACCEPTED:
                self._accepted.popitem(last=False)
        return True

    def _refuse(self, claimed: str, reason: str) -> None:
        self.refused += 1
        self.reasons.append(reason)
        if claimed in self._logged:
            log.debug("refused a DHT record (subkey %s): %s", claimed, reason)
            return
        self._logged[claimed] = None
        if len(self._logged) > _MAX_LOGGED:
            self._logged.popitem(last=False)
        log.warning("refused a DHT record (subkey %s): %s", claimed, reason)

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, SwarmRecordValidator)  # one is enough


def _ours(node) -> list[SwarmRecordValidator]:
    composite = node.protocol.record_validator
    found = getattr(composite, "_validators", [composite])  # hivemind's CompositeValidator keeps them there
    return [v for v in found if isinstance(v, SwarmRecordValidator)]


def _purge(storage, validator: SwarmRecordValidator) -> int:
    """Drop stored entries `validator` now refuses; returns how many."""
    dropped = 0
    for key_id, (value, expiration) in list(storage.items()):
        if isinstance(value, DictionaryDHTValue):
            for subkey, (item, item_expiration) in list(value.items()):
                record = DHTRecord(key_id.to_bytes(), MSGPackSerializer.dumps(subkey), item, item_expiration)
                if not validator.validate(record):
                    del value[subkey]
                    dropped += 1
        else:
            record = DHTRecord(key_id.to_bytes(), MSGPackSerializer.dumps(None), value, expiration)
            if not validator.validate(record):
                del storage[key_id]
                dropped += 1
    return dropped


async def _mark_lookups(_dht: hivemind.DHT, node) -> None:
    protocol = node.protocol
    find = protocol.call_find

    async def call_find(*args, **kwargs):
        token = in_lookup.set(True)  # this task's context only: concurrent stores stay strict
        try:
            return await find(*args, **kwargs)
        finally:
            in_lookup.reset(token)

    protocol.call_find = call_find  # DHTNode calls it as self.protocol.call_find


def mark_lookups(dht: hivemind.DHT) -> None:
    """Tag the DHT node's lookups, so that its validator checks their replies without the expiry bound."""
    dht.run_coroutine(_mark_lookups)


async def _apply_policy(_dht: hivemind.DHT, node, policy: AdmissionPolicy) -> int:
    dropped = 0
    for validator in _ours(node):
        validator.set_policy(policy)
        dropped += _purge(node.protocol.storage, validator) + _purge(node.protocol.cache, validator)
    return dropped


async def _refused(_dht: hivemind.DHT, node) -> tuple[int, list[str]]:
    return sum(v.refused for v in _ours(node)), [r for v in _ours(node) for r in v.reasons]


async def set_policy(dht: hivemind.DHT, policy: AdmissionPolicy) -> int:
    """Make the DHT node's validator apply `policy` from now on; returns how many stored entries it dropped."""
    return await dht.run_coroutine(partial(_apply_policy, policy=policy), return_future=True)


async def refused_records(dht: hivemind.DHT) -> tuple[int, list[str]]:
    """How many records this DHT node's validator refused so far, and the last reasons."""
    return await dht.run_coroutine(_refused, return_future=True)
