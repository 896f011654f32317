"""The block index: request key → which (pod, tier) hold that block, plus each pod's engine-key map.

`MemoryIndex` is compact by construction: pods are interned as small slot numbers and each request key
maps to one int bitmask of (pod, tier) slots (`pod_slot * 4 + tier`), so a (block, pod) entry costs a
share of one dict slot and one int. Identical masks are interned. The engine-key → request-key map is
per pod, so clearing a pod is O(1): its slot bits are retired (lookups ignore them at once) and swept
from the values incrementally. Removals are reference counted per (pod, tier, block): a second store of
a block the slot already holds (another DP rank or KV-cache group) bumps a counter that a removal must
drain before the block leaves the index. `max_keys` bounds the index (LRU by key) and
`max_pods_per_key` bounds the entries per key. `engine_run_size` selects the compact engine-key maps
(`EngineMap`: sorted uint64 runs): less memory per block at scale, slower removals (see docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from epp.framework.types import PrefixMatch

TIER_GPU, TIER_CPU, TIER_DISK, TIER_OTHER = 0, 1, 2, 3
TIER_NAMES = ("gpu", "cpu", "disk", "other")
NT = 4  # slots per pod
_TIER_ALIASES = {
    "": TIER_GPU,
    "gpu": TIER_GPU,
    "hbm": TIER_GPU,
    "cpu": TIER_CPU,
    "dram": TIER_CPU,
    "disk": TIER_DISK,
    "storage": TIER_DISK,
    "shared_storage": TIER_DISK,
    "local_file": TIER_DISK,
}
DEFAULT_TIER_WEIGHTS = {"gpu": 1.0, "cpu": 0.8, "disk": 0.5, "other": 1.0}


def tier_index(medium: str | None) -> int:
    """An event's `medium` as a tier: empty → gpu (the engine's own cache), unknown names → other."""
    if not medium:
        return TIER_GPU
    return _TIER_ALIASES.get(medium.lower(), TIER_OTHER)


class Index(Protocol):
    """What the event path and the scorer need from a backend.

    Writes are synchronous and cheap (in-process bookkeeping); `flush()` pushes them to a remote store if
    the backend has one. Reads are async because a remote backend needs a round trip.
    """

    def add(self, engine_keys: Sequence[int] | None, request_keys: Sequence[int], pod: str, tier: int) -> None: ...

    def evict(self, engine_keys: Iterable[int], pod: str, tier: int) -> int: ...

    def request_key(self, pod: str, engine_key: int) -> int | None: ...

    def engine_request_keys(self, pod: str, engine_key: int) -> tuple[int, ...]: ...

    def clear_pod(self, pod: str) -> None: ...

    def add_speculative(self, request_keys: Sequence[int], pod: str, ttl: float) -> None: ...

    async def flush(self) -> None: ...

    async def lookup(
        self, request_keys: Sequence[int], pods: Iterable[str] | None = None
    ) -> dict[str, PrefixMatch]: ...

    def pods(self) -> list[str]: ...


class EngineMap:
    """One pod's engine key → request key(s) map, compact: recent entries in a dict; every `run_size` of
    them are spilled into an immutable sorted pair of uint64 arrays (16 B per entry instead of ~70 B for a
    dict slot plus the engine-key int). Lookups check the dict, then the runs newest first (binary search);
    removals tombstone (value 0) and a run more than half dead is compacted. Tuples (1:many block sizes)
    stay in the dict. Spilling sorts at most `run_size` keys, so no step is large."""

    __slots__ = ("recent", "run_size", "runs")

    def __init__(self, run_size: int = 65536) -> None:
        self.recent: dict[int, int | tuple[int, ...]] = {}
        self.run_size = run_size
        self.runs: list[tuple[np.ndarray, np.ndarray, list[int]]] = []  # keys, values, [dead count]

    def get(self, e: int) -> int | tuple[int, ...] | None:
        v = self.recent.get(e)
        if v is not None or not self.runs:
            return v
        k = np.uint64(e)
        for keys, vals, _ in reversed(self.runs):
            i = int(keys.searchsorted(k))
            if i < len(keys) and keys[i] == k:
                r = int(vals[i])
                return r if r else None
        return None

    def __setitem__(self, e: int, v: int | tuple[int, ...]) -> None:
        rec = self.recent
        rec[e] = v
        if len(rec) >= self.run_size:
            self._spill()

    def __delitem__(self, e: int) -> None:
        self.recent.pop(e, None)
        if not self.runs:
            return
        k = np.uint64(e)
        for n, (keys, vals, dead) in enumerate(self.runs):
            i = int(keys.searchsorted(k))
            if i < len(keys) and keys[i] == k and vals[i]:
                vals[i] = 0
                dead[0] += 1
                if dead[0] * 2 > len(keys):
                    live = vals != 0
                    self.runs[n] = (keys[live], vals[live], [0])
        self.runs = [r for r in self.runs if len(r[0])]

    def _spill(self) -> None:
        ints = [(e, v) for e, v in self.recent.items() if not isinstance(v, tuple)]
        if len(ints) * 2 < self.run_size:  # mostly tuples: let the dict grow instead of spilling tiny runs
            self.run_size *= 2
            return
        keys = (
            np.fromiter(self.recent.keys(), np.uint64, len(self.recent))
            if len(ints) == len(self.recent)
            else (np.fromiter((e for e, _ in ints), np.uint64, len(ints)))
        )
        vals = np.fromiter((v for _, v in ints), np.uint64, len(ints))
        order = np.argsort(keys)
        self.runs.append((keys[order], vals[order], [0]))
        if len(ints) == len(self.recent):
            self.recent = {}
        else:
            self.recent = {e: v for e, v in self.recent.items() if isinstance(v, tuple)}

    def __len__(self) -> int:
        return len(self.recent) + sum(len(k) - d[0] for k, _, d in self.runs)


class _Pod:
    __slots__ = ("e2r", "mask", "name", "refs", "shift")

    def __init__(self, name: str, slot: int, run_size: int | None) -> None:
        self.name = name
        self.shift = slot * NT
        self.mask = ((1 << NT) - 1) << self.shift
        # engine key -> request key (1:1 and many:1) or a tuple of request keys (1:many)
        self.e2r: dict[int, int | tuple[int, ...]] | EngineMap = EngineMap(run_size) if run_size else {}
        # (request key << 2 | tier) -> store count, only for blocks stored more than once
        self.refs: dict[int, int] = {}


def _pm(v: int | tuple[int, ...]) -> tuple[int, ...]:
    return v if isinstance(v, tuple) else (v,)


class MemoryIndex:
    """In-process index (see the module docstring)."""

    _INTERN_MAX = 1 << 16
    _SWEEP_CHUNK = 512

    def __init__(
        self,
        tier_weights: Mapping[str, float] | None = None,
        max_keys: int | None = None,
        max_pods_per_key: int | None = None,
        engine_run_size: int | None = None,
    ) -> None:
        w = dict(DEFAULT_TIER_WEIGHTS)
        self.engine_run_size = engine_run_size
        for k, v in (tier_weights or {}).items():
            w[TIER_NAMES[tier_index(k)] if k.lower() not in TIER_NAMES else k.lower()] = float(v)
        self.tier_weights = w
        self._w = tuple(w[n] for n in TIER_NAMES)
        self.max_keys = max_keys
        self.max_pods_per_key = max_pods_per_key
        self._data: dict[int, int] = OrderedDict() if max_keys else {}
        self._intern: dict[int, int] = {}
        self._pods: dict[str, _Pod] = {}
        self._by_slot: dict[int, _Pod] = {}
        self._free: list[int] = []
        self._next_slot = 0
        self._live = 0  # union of live pods' slot masks
        self._retired = 0  # slot bits of cleared pods not yet swept from values
        self._retired_slots: list[int] = []
        self._sweep_keys: list[int] | None = None
        self._sweep_pos = 0
        # request key -> {pod slot: expiry (monotonic)}
        self._spec: dict[int, dict[int, float]] = {}
        self._spec_expiry: list[tuple[float, int, Sequence[int]]] = []
        self.lru_evictions = 0
        self._bases: dict[int, int] = {}
        # When set, every entry change is recorded as ("+"|"-", request key, pod, tier) or ("clear", 0, pod, 0)
        # so a remote mirror (RedisIndex) can replay it.
        self.journal: list[tuple[str, int, str, int]] | None = None

    # ---------------------------------------------------------------- pods
    def _pod(self, name: str) -> _Pod:
        p = self._pods.get(name)
        if p is None:
            slot = self._free.pop() if self._free else self._alloc_slot()
            p = _Pod(name, slot, self.engine_run_size)
            self._pods[name] = p
            self._by_slot[slot] = p
            self._live |= p.mask
        return p

    def _alloc_slot(self) -> int:
        s = self._next_slot
        self._next_slot += 1
        return s

    def pods(self) -> list[str]:
        return list(self._pods)

    def clear_pod(self, pod: str) -> None:
        """Forget everything about `pod` at once (AllBlocksCleared, publisher restart, pod deleted)."""
        p = self._pods.pop(pod, None)
        if self.journal is not None:
            self.journal.append(("clear", 0, pod, 0))
        if p is None:
            return
        slot = p.shift // NT
        del self._by_slot[slot]
        self._live &= ~p.mask
        self._retired |= p.mask
        self._retired_slots.append(slot)
        self._sweep_keys = None  # restart the sweep so it covers this pod too
        for k in [k for k, d in self._spec.items() if slot in d]:
            d = self._spec[k]
            del d[slot]
            if not d:
                del self._spec[k]
        self._sweep(self._SWEEP_CHUNK)

    def _sweep(self, budget: int) -> None:
        """Drop retired slot bits from up to `budget` values; free the slots when a full pass is done."""
        if not self._retired:
            return
        if self._sweep_keys is None:
            self._sweep_keys = list(self._data)
            self._sweep_pos = 0
        keys, i, data, ret = self._sweep_keys, self._sweep_pos, self._data, self._retired
        end = min(len(keys), i + budget)
        while i < end:
            k = keys[i]
            v = data.get(k)
            if v is not None and v & ret:
                nv = v & ~ret
                if nv:
                    data[k] = self._interned(nv)
                else:
                    del data[k]
            i += 1
        self._sweep_pos = i
        if i >= len(keys):
            self._free.extend(self._retired_slots)
            self._retired_slots = []
            self._retired = 0
            self._sweep_keys = None

    def maintain(self, budget: int = 1 << 20) -> None:
        """Finish pending sweeps and expire speculative entries (tests and idle periods)."""
        while self._retired and budget > 0:
            self._sweep(min(budget, 65536))
            budget -= 65536
        self._expire_spec(time.monotonic())

    def _interned(self, v: int) -> int:
        it = self._intern
        got = it.get(v)
        if got is not None:
            return got
        if len(it) < self._INTERN_MAX:
            it[v] = v
        return v

    # ---------------------------------------------------------------- writes
    def add(self, engine_keys: Sequence[int] | None, request_keys: Sequence[int], pod: str, tier: int) -> None:
        """Record that `pod` holds `request_keys` in `tier`; map `engine_keys` onto them (the i*len/n rule)."""
        if not request_keys:
            return
        p = self._pod(pod)
        if engine_keys:
            e2r = p.e2r
            ne, nr = len(engine_keys), len(request_keys)
            if ne == nr:
                for e, r in zip(engine_keys, request_keys, strict=True):
                    e2r[e] = r
            else:
                n = max(ne, nr)
                acc: dict[int, list[int]] = {}
                for i in range(n):
                    lst = acc.setdefault(engine_keys[i * ne // n], [])
                    r = request_keys[i * nr // n]
                    if not lst or lst[-1] != r:
                        lst.append(r)
                for e, rs in acc.items():
                    e2r[e] = rs[0] if len(rs) == 1 else tuple(rs)
        bit = 1 << (p.shift + tier)
        data = self._data
        get = data.get
        intern = self._intern
        bounded = self.max_keys is not None
        maxp = self.max_pods_per_key
        journal = self.journal
        for r in request_keys:
            cur = get(r, 0)
            if cur & bit:
                k = r << 2 | tier
                p.refs[k] = p.refs.get(k, 1) + 1
                continue
            nv = cur | bit
            if maxp is not None and cur and (cur & self._live).bit_count() >= maxp:
                nv = self._drop_one(cur, bit) | bit
            if journal is not None:
                journal.append(("+", r, pod, tier))
            got = intern.get(nv)
            if got is None:
                if len(intern) < self._INTERN_MAX:
                    intern[nv] = nv
                got = nv
            data[r] = got
            if bounded:
                data.move_to_end(r)  # type: ignore[attr-defined]
        if bounded and len(data) > self.max_keys:  # type: ignore[operator]
            over = len(data) - self.max_keys  # type: ignore[operator]
            for _ in range(over):
                data.popitem(last=False)  # type: ignore[call-arg]
            self.lru_evictions += over
        if self._retired:
            self._sweep(64)

    def _drop_one(self, cur: int, keep: int) -> int:
        """Over `max_pods_per_key`: drop the entry in the highest slot other than the one being added."""
        live = cur & self._live & ~keep
        if not live:
            return cur
        return cur & ~(1 << (live.bit_length() - 1))

    def evict(self, engine_keys: Iterable[int], pod: str, tier: int) -> int:
        """A BlockRemoved: returns how many engine keys were unknown (nothing to evict)."""
        p = self._pods.get(pod)
        if p is None:
            return sum(1 for _ in engine_keys)
        unknown = 0
        bit = 1 << (p.shift + tier)
        data = self._data
        e2r = p.e2r
        refs = p.refs
        pmask = p.mask
        for e in engine_keys:
            v = e2r.get(e)
            if v is None:
                unknown += 1
                continue
            still_held = False
            for r in _pm(v):
                if refs:
                    k = r << 2 | tier
                    c = refs.get(k)
                    if c is not None:
                        if c > 2:
                            refs[k] = c - 1
                        else:
                            del refs[k]
                        still_held = True
                        continue
                cur = data.get(r)
                if cur is None:
                    continue
                if cur & bit:
                    cur &= ~bit
                    if cur:
                        data[r] = self._interned(cur)
                    else:
                        del data[r]
                    if self.journal is not None:
                        self.journal.append(("-", r, pod, tier))
                if cur & pmask:
                    still_held = True
            if not still_held:
                del e2r[e]
        return unknown

    def request_key(self, pod: str, engine_key: int) -> int | None:
        p = self._pods.get(pod)
        if p is None:
            return None
        v = p.e2r.get(engine_key)
        if v is None:
            return None
        return v[-1] if isinstance(v, tuple) else v

    def engine_request_keys(self, pod: str, engine_key: int) -> tuple[int, ...]:
        p = self._pods.get(pod)
        v = p.e2r.get(engine_key) if p is not None else None
        return () if v is None else _pm(v)

    def add_speculative(self, request_keys: Sequence[int], pod: str, ttl: float) -> None:
        """Pretend `pod` holds these blocks (gpu weight) for `ttl` seconds: the pick we just made."""
        if not request_keys or ttl <= 0:
            return
        now = time.monotonic()
        self._expire_spec(now)
        slot = self._pod(pod).shift // NT
        exp = now + ttl
        spec = self._spec
        for r in request_keys:
            d = spec.get(r)
            if d is None:
                spec[r] = {slot: exp}
            else:
                d[slot] = exp
        self._spec_expiry.append((exp, slot, request_keys))

    def _expire_spec(self, now: float) -> None:
        q = self._spec_expiry
        n = 0
        while n < len(q) and q[n][0] <= now:
            _, slot, keys = q[n]
            for r in keys:
                d = self._spec.get(r)
                if d is not None and d.get(slot, now + 1) <= now:
                    del d[slot]
                    if not d:
                        del self._spec[r]
            n += 1
        if n:
            del q[:n]

    async def flush(self) -> None:
        return None

    # ---------------------------------------------------------------- reads
    def lookup_now(self, request_keys: Sequence[int], pods: Iterable[str] | None = None) -> dict[str, PrefixMatch]:
        """Each pod's consecutive prefix from block 0 (only pods with at least one block are returned)."""
        if pods is None:
            allowed = self._live
        else:
            allowed = 0
            for name in pods:
                p = self._pods.get(name)
                if p is not None:
                    allowed |= p.mask
        if not allowed or not request_keys:
            return {}
        spec = self._spec
        now = time.monotonic() if spec else 0.0
        get = self._data.get
        runs: list[tuple[int, int]] = []
        prev = -1
        cnt = 0
        for r in request_keys:
            m = get(r, 0) & allowed
            if spec:
                d = spec.get(r)
                if d:
                    for slot, exp in d.items():
                        if exp > now:
                            m |= (1 << (slot * NT + TIER_GPU)) & allowed
            if m == prev:
                cnt += 1
                continue
            if cnt:
                runs.append((prev, cnt))
            if not m:
                cnt = 0
                break
            # pods present in this block: fold each pod's NT tier bits onto its first bit, then re-expand
            f = (m | m >> 1 | m >> 2 | m >> 3) & self._base_mask(allowed)
            allowed &= f * ((1 << NT) - 1)
            m &= allowed
            prev, cnt = m, 1
        if cnt:
            runs.append((prev, cnt))
        out: dict[str, PrefixMatch] = {}
        w = self._w
        by_slot = self._by_slot
        for m, c in runs:
            best: dict[int, float] = {}
            while m:
                low = m & -m
                i = low.bit_length() - 1
                m ^= low
                s, t = divmod(i, NT)
                wt = w[t]
                if wt > best.get(s, -1.0):
                    best[s] = wt
            for s, wt in best.items():
                p = by_slot.get(s)
                if p is None:
                    continue
                pm = out.get(p.name)
                if pm is None:
                    out[p.name] = PrefixMatch(c, wt * c)
                else:
                    pm.blocks += c
                    pm.weighted += wt * c
        return out

    def _base_mask(self, allowed: int) -> int:
        """Bits at every slot's first position, up to the highest allowed slot."""
        n = (allowed.bit_length() + NT - 1) // NT
        b = self._bases.get(n)
        if b is None:
            b = sum(1 << (i * NT) for i in range(n))
            self._bases[n] = b
        return b

    async def lookup(self, request_keys: Sequence[int], pods: Iterable[str] | None = None) -> dict[str, PrefixMatch]:
        return self.lookup_now(request_keys, pods)

    # ---------------------------------------------------------------- introspection
    def __len__(self) -> int:
        return len(self._data)

    def entries(self) -> set[tuple[int, str, int]]:
        """Every live (request key, pod, tier) entry; for tests and debugging (O(keys))."""
        out: set[tuple[int, str, int]] = set()
        for r, v in self._data.items():
            m = v & self._live
            while m:
                low = m & -m
                i = low.bit_length() - 1
                m ^= low
                p = self._by_slot.get(i // NT)
                if p is not None:
                    out.add((r, p.name, i % NT))
        return out

    def engine_map_size(self) -> int:
        return sum(len(p.e2r) for p in self._pods.values())
