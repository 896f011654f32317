"""The block index: request key → which (pod, tier) hold that block, plus each pod's engine-key map.

`MemoryIndex` is compact by construction: pods are interned as small slot numbers and each request key
maps to one int bitmask of (pod, tier) slots (`pod_slot * 4 + tier`), so a (block, pod) entry costs a
share of one dict slot and one int. Identical masks are interned. The engine-key → request-key map is
per pod, so clearing a pod is O(1): its slot bits are retired (lookups ignore them at once) and swept
from the values incrementally. Removals are reference counted per (pod, tier, block): a second store of
a block the slot already holds (another DP rank or KV-cache group) bumps a counter that a removal must
drain before the block leaves the index. `max_keys` bounds the index (LRU by key) and
`max_pods_per_key` bounds the entries per key. The engine-key maps are compact by default (`EngineMap`: a
dict of recent entries spilled every `engine_run_size` into sorted uint64 runs merged incrementally);
`engine_run_size=None` keeps plain dicts (see docs/benchmarks.md).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, filterfalse, repeat
from typing import Protocol

import numpy as np

from epp.framework.services import SpeculationHold
from epp.framework.types import PrefixMatch

# np.unique's first call loads its implementation (~8 ms): paid here, at import, not in the first BlockRemoved that
# reaches a spilled run on the event loop.
np.unique(np.zeros(2, np.uint64))

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
DEFAULT_ENGINE_RUN_SIZE = 4096  # engine-map entries per spilled run; None = plain dicts
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

    def add_speculative(
        self, request_keys: Sequence[int], pod: str, ttl: float, hold: SpeculationHold | None = None
    ) -> None: ...

    def speculative_only(self, pod: str, request_key: int) -> bool: ...

    async def flush(self) -> None: ...

    async def lookup(
        self, request_keys: Sequence[int], pods: Iterable[str] | None = None
    ) -> dict[str, PrefixMatch]: ...

    def pods(self) -> list[str]: ...


class _Run:
    """One immutable sorted run of an EngineMap: engine keys, request keys (0 = removed), a dead count."""

    __slots__ = ("dead", "keys", "level", "vals")

    def __init__(self, keys: np.ndarray, vals: np.ndarray, level: int) -> None:
        self.keys = keys
        self.vals = vals
        self.dead = 0
        self.level = level


class _Merge:
    """An incremental k-way merge of consecutive runs (oldest first) into one, a bounded slice per `step`.

    Each step emits every key up to a pivot from all sources, so the output stays sorted; among equal keys the
    newest source wins and removed entries (0) are dropped. The sources stay visible to lookups until the merge
    completes; a key removed meanwhile is tombstoned in the sources and, if already copied, in the output."""

    __slots__ = ("dead", "o", "out_k", "out_v", "pos", "sources")

    def __init__(self, sources: list[_Run]) -> None:
        self.sources = sources
        self.pos = [0] * len(sources)
        total = sum(len(r.keys) for r in sources)
        self.out_k = np.empty(total, np.uint64)
        self.out_v = np.empty(total, np.uint64)
        self.o = 0
        self.dead = 0  # output entries removed after they were copied

    def step(self, budget: int) -> bool:
        """Merge about `budget` input entries; True when every source is consumed."""
        src, pos = self.sources, self.pos
        while budget > 0:
            active = [i for i in range(len(src)) if pos[i] < len(src[i].keys)]
            if not active:
                return True
            chunk = max(1, budget // len(active))
            pivot = min(src[i].keys[min(pos[i] + chunk, len(src[i].keys)) - 1] for i in active)
            ks, vs = [], []
            for i in reversed(active):  # newest first: the stable sort keeps the newest of equal keys first
                keys = src[i].keys
                j = pos[i] + int(keys[pos[i] :].searchsorted(pivot, "right"))
                ks.append(keys[pos[i] : j])
                vs.append(src[i].vals[pos[i] : j])
                pos[i] = j
            k = np.concatenate(ks) if len(ks) > 1 else ks[0]
            v = np.concatenate(vs) if len(vs) > 1 else vs[0]
            budget -= len(k)
            if len(ks) > 1:
                order = np.argsort(k, kind="stable")
                k, v = k[order], v[order]
                keep = np.empty(len(k), bool)
                keep[0] = True
                np.not_equal(k[1:], k[:-1], out=keep[1:])
                keep &= v != 0
            else:
                keep = v != 0
            k, v = k[keep], v[keep]
            n = len(k)
            self.out_k[self.o : self.o + n] = k
            self.out_v[self.o : self.o + n] = v
            self.o += n
        return all(pos[i] >= len(src[i].keys) for i in range(len(src)))

    def remove_copied(self, keys: np.ndarray) -> None:
        """Keys removed from a source after this merge copied them: tombstone them in the output."""
        out_k = self.out_k[: self.o]
        idx = out_k.searchsorted(keys)
        ok = idx < len(out_k)
        idx, keys = idx[ok], keys[ok]
        hit = np.unique(idx[(out_k[idx] == keys) & (self.out_v[idx] != 0)])
        self.out_v[hit] = 0
        self.dead += len(hit)

    def result(self, level: int) -> _Run:
        run = _Run(self.out_k[: self.o], self.out_v[: self.o], level)
        run.dead = self.dead
        return run


class EngineMap:
    """One pod's engine key → request key(s) map, compact: new entries go to a dict; every `run_size` of them
    are spilled into an immutable sorted pair of uint64 arrays (16 B per entry instead of ~70 B for a dict slot
    plus the engine-key int). Runs are merged size-tiered (`fanout` runs of one size become one run of the next)
    and a run more than half removed is compacted, both incrementally: at most `step` entries per slice, one
    slice every `step_every` writes, so no single call does more than a few thousand entries of numpy work (a
    spill in one shot would pause the loop). Lookups check the dict, then the runs newest first;
    `get_many`/`delete_many` do a batch with one vectorized search per run. Tuples (1:many block sizes) stay
    in the dict."""

    __slots__ = ("_merge", "_since", "fanout", "merges", "recent", "run_size", "runs", "step", "step_every")

    def __init__(self, run_size: int = 4096, fanout: int = 4, step: int = 2048, step_every: int = 128) -> None:
        self.recent: dict[int, int | tuple[int, ...]] = {}
        self.run_size = run_size
        self.fanout = fanout
        self.step = step
        self.runs: list[_Run] = []  # oldest first
        self.step_every = step_every
        self.merges = 0  # completed merges and compactions
        self._merge: _Merge | None = None
        self._since = 0

    def get(self, e: int) -> int | tuple[int, ...] | None:
        v = self.recent.get(e)
        if v is not None or not self.runs:
            return v
        k = np.uint64(e)
        for run in reversed(self.runs):
            keys = run.keys
            i = int(keys.searchsorted(k))
            if i < len(keys) and keys[i] == k:
                r = int(run.vals[i])
                return r if r else None
        return None

    def get_many(self, es: Sequence[int]) -> list[int | tuple[int, ...] | None]:
        rec = self.recent
        out = [rec.get(e) for e in es]
        if not self.runs:
            return out
        miss = [i for i, v in enumerate(out) if v is None]
        if not miss:
            return out
        want = np.fromiter((es[i] for i in miss), np.uint64, len(miss))
        res = np.zeros(len(miss), np.uint64)
        todo = np.arange(len(miss))
        for run in reversed(self.runs):
            keys = run.keys
            if not len(keys):
                continue
            sub = want[todo]
            idx = keys.searchsorted(sub)
            np.minimum(idx, len(keys) - 1, out=idx)
            hit = keys[idx] == sub
            res[todo[hit]] = run.vals[idx[hit]]
            todo = todo[~hit]
            if not len(todo):
                break
        for j, i in enumerate(miss):
            r = int(res[j])
            if r:
                out[i] = r
        return out

    def __setitem__(self, e: int, v: int | tuple[int, ...]) -> None:
        rec = self.recent
        rec[e] = v
        if len(rec) >= self.run_size:
            self._spill()
            self._since += 1  # the spill was this call's work: the merge slice waits for the next write
            return
        self._tick(1)

    def update(self, pairs: Iterable[tuple[int, int | tuple[int, ...]]], n: int) -> None:
        """`n` writes at once (one BlockStored event): one dict update, one spill check, one merge tick."""
        rec = self.recent
        rec.update(pairs)
        if len(rec) >= self.run_size:
            self._spill()
            self._since += n
            return
        self._tick(n)

    def __delitem__(self, e: int) -> None:
        self.delete_many((e,))

    def delete_many(self, es: Sequence[int]) -> None:
        if not es:
            return
        rec = self.recent
        for e in es:
            rec.pop(e, None)
        if not self.runs:
            return
        want = np.fromiter(es, np.uint64, len(es))
        m = self._merge
        merging = m.sources if m is not None else ()
        for run in self.runs:
            keys = run.keys
            if not len(keys):
                continue
            idx = keys.searchsorted(want)
            np.minimum(idx, len(keys) - 1, out=idx)
            idx = idx[(keys[idx] == want) & (run.vals[idx] != 0)]
            if len(idx):
                idx = np.unique(idx)
                run.vals[idx] = 0
                run.dead += len(idx)
                if m is not None and run in merging:  # already copied to the merge's output: tombstone it there
                    done = idx[idx < m.pos[merging.index(run)]]
                    if len(done):
                        m.remove_copied(keys[done])
        if any(r.dead >= len(r.keys) and r not in merging for r in self.runs):
            self.runs = [r for r in self.runs if r.dead < len(r.keys) or r in merging]
        self._tick(len(es))

    def _tick(self, n: int) -> None:
        self._since += n
        # Writes outrunning the merges (runs piling up) get slices more often, never bigger ones: a slice's size
        # is the pause a write can see.
        if self._since * max(1, len(self.runs) // (2 * self.fanout)) < self.step_every:
            return
        self._since = 0
        if self._merge is None:
            self._schedule()
        m = self._merge
        if m is not None and m.step(self.step):
            self._finish(m)

    def _level(self, n: int) -> int:
        level, size = 0, self.run_size * self.fanout
        while n >= size:
            level += 1
            size *= self.fanout
        return level

    def _schedule(self) -> None:
        runs = self.runs
        for r in runs:  # a run mostly removed: compact it alone
            if r.dead * 2 > len(r.keys) >= self.run_size:
                self._merge = _Merge([r])
                return
        f = self.fanout
        for i in range(len(runs) - f, -1, -1):  # newest group of `fanout` consecutive runs of one level
            group = runs[i : i + f]
            if all(r.level == group[0].level for r in group):
                self._merge = _Merge(group)
                return

    def _finish(self, m: _Merge) -> None:
        self._merge = None
        self.merges += 1
        first = self.runs.index(m.sources[0])
        new = m.result(self._level(m.o))
        self.runs[first : first + len(m.sources)] = [new] if len(new.keys) else []

    def _spill(self) -> None:
        rec = self.recent
        try:  # the common case, no tuples: straight from the dict's views, no temporary Python objects
            vals = np.fromiter(rec.values(), np.uint64, len(rec))
        except TypeError:
            pass
        else:
            keys = np.fromiter(rec.keys(), np.uint64, len(rec))
            order = np.argsort(keys)
            self.runs.append(_Run(keys[order], vals[order], 0))
            self.recent = {}
            return
        ints = [(e, v) for e, v in self.recent.items() if not isinstance(v, tuple)]
        if len(ints) * 2 < self.run_size:  # mostly tuples: let the dict grow instead of spilling tiny runs
            self.run_size *= 2
            return
        keys = np.fromiter((e for e, _ in ints), np.uint64, len(ints))
        vals = np.fromiter((v for _, v in ints), np.uint64, len(ints))
        order = np.argsort(keys)
        self.runs.append(_Run(keys[order], vals[order], 0))
        if len(ints) == len(self.recent):
            self.recent = {}
        else:
            self.recent = {e: v for e, v in self.recent.items() if isinstance(v, tuple)}

    def __len__(self) -> int:
        return len(self.recent) + sum(len(r.keys) - r.dead for r in self.runs)


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
        engine_run_size: int | None = DEFAULT_ENGINE_RUN_SIZE,
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
        # pod slot -> {request key: expiry (monotonic)}, and per request key a mask of its pods' GPU-tier bits for
        # lookups, kept exact by expiring in deadline order (a heap: entries shared by other replicas carry their own
        # TTL; a held entry carries its hold and pod, and is pushed again while the hold lasts). One flat map per pod
        # rather than a map per key: no small dict per speculated block, and a pick renewing its keys is one update.
        self._spec: dict[int, dict[int, float]] = {}
        self._spec_bits: dict[int, int] = {}
        self._spec_expiry: list[tuple[float, int, int, Sequence[int], tuple[SpeculationHold, _Pod] | None]] = []
        self._spec_seq = itertools.count()
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
        sbit = 1 << (slot * NT + TIER_GPU)
        bits = self._spec_bits
        for k in self._spec.pop(slot, ()):
            b = bits.get(k, 0) & ~sbit
            if b:
                bits[k] = b
            else:
                bits.pop(k, None)
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
        self.expire_speculative(time.monotonic())

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
                pairs: Iterable[tuple[int, int | tuple[int, ...]]] = zip(engine_keys, request_keys, strict=True)
            else:
                n = max(ne, nr)
                acc: dict[int, list[int]] = {}
                for i in range(n):
                    lst = acc.setdefault(engine_keys[i * ne // n], [])
                    r = request_keys[i * nr // n]
                    if not lst or lst[-1] != r:
                        lst.append(r)
                pairs = [(e, rs[0] if len(rs) == 1 else tuple(rs)) for e, rs in acc.items()]
            if isinstance(e2r, EngineMap):
                e2r.update(pairs, max(ne, nr))
            else:
                e2r.update(pairs)
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
        keys = engine_keys if isinstance(engine_keys, Sequence) else list(engine_keys)
        vals = e2r.get_many(keys) if isinstance(e2r, EngineMap) else [e2r.get(e) for e in keys]
        drop: list[int] = []
        for e, v in zip(keys, vals, strict=True):
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
                drop.append(e)
        if isinstance(e2r, EngineMap):
            e2r.delete_many(drop)
        else:
            for e in drop:
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

    def add_speculative(
        self, request_keys: Sequence[int], pod: str, ttl: float, hold: SpeculationHold | None = None
    ) -> None:
        """Pretend `pod` holds these blocks (gpu weight) for `ttl` seconds: the pick we just made (with `hold`, for
        as long as it lasts while the pod's events do not hold the last of them). Blocks its own events already put
        on its GPU are skipped: a warm request (most of them) then writes nothing here and leaves nothing to expire,
        where it wrote and later expired an entry per block."""
        if not request_keys or ttl <= 0:
            return
        now = time.monotonic()
        self.expire_speculative(now)
        p = self._pod(pod)
        slot = p.shift // NT
        sbit = 1 << (slot * NT + TIER_GPU)
        held = self._data.get
        request_keys = [r for r in request_keys if not held(r, 0) & sbit]
        if not request_keys:
            return
        exp = now + ttl
        m = self._spec.get(slot)
        if m is None:
            m = self._spec[slot] = {}
        bits = self._spec_bits
        bget = bits.get
        for r in filterfalse(m.__contains__, request_keys):  # keys already in m have the bit set
            bits[r] = bget(r, 0) | sbit
        m.update(zip(request_keys, repeat(exp)))
        heapq.heappush(
            self._spec_expiry, (exp, next(self._spec_seq), slot, request_keys, None if hold is None else (hold, p))
        )

    def speculative_only(self, pod: str, request_key: int) -> bool:
        """Whether `pod` holds `request_key` only through a live speculative entry, as of the last lookup's expiry
        (no event of its put the block on any of its tiers)."""
        p = self._pods.get(pod)
        if p is None or not self._spec_bits.get(request_key, 0) & (1 << (p.shift + TIER_GPU)):
            return False
        return not self._data.get(request_key, 0) & p.mask

    def expire_speculative(self, now: float) -> None:
        """Drop the speculative entries whose time is up (an entry written again since keeps its later expiry); a
        held one whose pod's events do not hold its last block yet lives on while its hold does."""
        q = self._spec_expiry
        spec, bits = self._spec, self._spec_bits
        while q and q[0][0] <= now:
            _, _, slot, keys, held = heapq.heappop(q)
            m = spec.get(slot)
            if m is None:  # its pod was cleared, and its entries with it
                continue
            sbit = 1 << (slot * NT + TIER_GPU)
            if held is not None and self._by_slot.get(slot) is held[1] and not self._data.get(keys[-1], 0) & sbit:
                until = held[0].until(now)
                if until > now:
                    for r in keys:
                        e = m.get(r)
                        if e is not None and e < until:
                            m[r] = until
                    heapq.heappush(q, (until, next(self._spec_seq), slot, keys, held))
                    continue
            # the keys whose entry is due (one renewed since keeps its later expiry), found at C speed: a pick that
            # renewed them all leaves nothing to do here
            for r in compress(keys, map(now.__ge__, map(m.get, keys, repeat(math.inf)))):
                del m[r]
                b = bits[r] & ~sbit
                if b:
                    bits[r] = b
                else:
                    del bits[r]
            if not m:  # a burst's map would otherwise keep its table
                del spec[slot]

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
        if self._spec_expiry:
            self.expire_speculative(time.monotonic())  # what is left in _spec_bits is live
        sget = self._spec_bits.get if self._spec_bits else None
        get = self._data.get
        runs: list[tuple[int, int]] = []
        prev = -1
        cnt = 0
        for r in request_keys:
            m = (get(r, 0) | sget(r, 0)) & allowed if sget is not None else get(r, 0) & allowed
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
