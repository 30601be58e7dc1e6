"""An in-memory stand-in for `hivemind.DHT` on a clock the test moves: what `SwarmDHT` calls (store, get,
run_coroutine), with hivemind's rules that matter to record lifetimes (a subkey keeps the later expiry; an
expired entry is never returned)."""
from __future__ import annotations

from hivemind.utils import ValueWithExpiration


class Clock:
    """DHT time in seconds, moved by the test (`advance`)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class MemoryDHT:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.data: dict[str, dict[str, tuple[object, float]]] = {}  # key -> subkey -> (value, expiration)

    async def store(self, key: str, value: object, expiration: float, subkey: str, return_future: bool = True) -> bool:
        held = self.data.setdefault(key, {})
        if subkey in held and held[subkey][1] >= expiration:
            return False
        held[subkey] = (value, expiration)
        return True

    async def get(self, key: str, latest: bool = True, return_future: bool = True) -> ValueWithExpiration | None:
        live = {sk: ValueWithExpiration(v, e) for sk, (v, e) in self.data.get(key, {}).items() if e > self.clock()}
        return ValueWithExpiration(live, max(v.expiration_time for v in live.values())) if live else None

    async def run_coroutine(self, fn, return_future: bool = True) -> int:
        return 0  # the validator's policy (set_policy): nothing stored here to drop
