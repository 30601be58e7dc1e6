"""`BasisRefitter`: the coordinator's side of the Grassmann basis updates (docs/algorithms.md 1.7).

At every re-fit step the receiving stages send their statistic (EMA of C_s U). Once every
stage 1..n-1 has reported for (basis version v, step t), the refitter takes one capped
Grassmann step from U_v, signs (run, v+1, t + switch delay, U_{v+1}) with the swarm key,
stores it in the DHT (where late joiners and peers that missed the push find it) and pushes
it to every announced peer. Statistics that come tagged with an older version than the last
published one mean that update was not taken up (e.g. it arrived too late); the refitter
then starts again from the version the stages are really on.
"""
from __future__ import annotations

import asyncio
import logging

import torch

from protocol.basis_update import BasisUpdate, canonical_basis, decode_stats, encode_update, next_basis
from protocol.model import compute_dtype, spec_basis
from protocol.spec import RunSpec
from protocol.wire import ErrorReply, WireError, encode_message
from swarm.dht import SwarmDHT
from swarm.keys import SigningKey
from swarm.net.transport import Transport

log = logging.getLogger(__name__)


class BasisRefitter:
    def __init__(self, spec: RunSpec, key: SigningKey, sdht: SwarmDHT, transport: Transport, ttl: float,
                 delay: float = 0.0) -> None:
        self.spec, self.key, self.sdht, self.transport, self.ttl = spec, key, sdht, transport, ttl
        self.delay = delay  # seconds between a re-fit and its publication (a slow coordinator, for tests)
        basis = spec_basis(spec)
        self.bases: dict[int, torch.Tensor] = {0: basis.U} if basis is not None else {}
        self._stats: dict[tuple[int, int], dict[int, torch.Tensor]] = {}
        self.published: list[BasisUpdate] = []
        self._lock = asyncio.Lock()

    async def on_stats(self, body: bytes, sender: str) -> bytes:
        try:
            msg = decode_stats(body, self.spec)
        except WireError as e:
            return encode_message(ErrorReply(str(e)))
        if msg.basis_version not in self.bases:
            return encode_message(ErrorReply(f"basis version {msg.basis_version} is unknown to the coordinator."))
        if msg.step % self.spec.basis_interval:
            return encode_message(ErrorReply(f"step {msg.step} is not a re-fit step."))
        got = self._stats.setdefault((msg.basis_version, msg.step), {})
        got.setdefault(msg.stage, msg.M)  # replicas of a stage: the first report counts
        if len(got) == self.spec.n_stages - 1:
            del self._stats[(msg.basis_version, msg.step)]
            asyncio.get_running_loop().create_task(self._refit(msg.basis_version, msg.step, got))
        return b""

    async def _refit(self, version: int, step: int, stats: dict[int, torch.Tensor]) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        async with self._lock:
            U = next_basis(self.bases[version], [stats[s] for s in sorted(stats)], self.spec)
            update = BasisUpdate(self.spec.run_hash, version + 1, step + self.spec.basis_switch_delay, U)
            update.signature = self.key.sign(update.signing_bytes())
            for v in [v for v in self.bases if v > version]:
                del self.bases[v]  # a later version that the stages never took up is abandoned
            self.bases[version + 1] = canonical_basis(U, compute_dtype(self.spec))
            self.published.append(update)
            body = encode_update(update)
            await self.sdht.publish_basis(self.spec.run_hash, update.version, body, self.ttl)
            log.info("basis version %d published, effective at step %d", update.version, update.effective_step)
        await self._push(body)

    async def _push(self, body: bytes) -> None:
        peers = await self.sdht.all_stage_peers(self.spec.run_hash, self.spec.n_stages)
        ids = [a.peer_id for anns in peers.values() for a in anns if a.state == "online"]
        results = await asyncio.gather(*(self.transport.request(p, "basis", body, timeout=10) for p in ids),
                                       return_exceptions=True)
        for peer, res in zip(ids, results):
            if isinstance(res, Exception) or res != b"":
                log.warning("push of a basis update to %s failed (%s); it will fetch it from the DHT",
                            peer[-8:], res if isinstance(res, Exception) else "refused")

    async def republish(self) -> None:
        """Keep every published update alive in the DHT (late joiners need the whole chain)."""
        for update in self.published:
            await self.sdht.publish_basis(self.spec.run_hash, update.version, encode_update(update), self.ttl)
