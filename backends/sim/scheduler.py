"""Continuous batching the way SGLang's scheduler does it, with simulated forward passes.

A waiting queue feeds a running batch. Each iteration runs one forward pass: a prefill batch
when a waiting request can be admitted (prefill takes priority, as in SGLang), otherwise one
decode step for the whole running batch. Admission follows SGLang's PrefillAdder: FCFS, the
cached prefix is reused, long prompts are chunked by ``chunked_prefill_size``, and a request is
admitted only if its uncached prompt plus a reservation for its output fits in free plus
evictable KV, after the running requests' own reservations. When it does not fit, it waits.
If decode runs out of KV anyway, requests are retracted to the head of the queue.

With the overlap scheduler (SGLang's default; ``--disable-overlap-schedule`` turns it off) the next batch is
formed when the one before it starts, before that one's results are processed (``event_loop_overlap``): a
request that arrives while a pass runs waits for the pass after next, and a prefix computed by a pass is not
matched by the batch formed during it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spillgate.backends.sim import timing
from spillgate.backends.sim.clock import VirtualClock
from spillgate.backends.sim.pass_counters import PassCounters
from spillgate.backends.sim.presets import Preset
from spillgate.backends.sim.radix_cache import RadixCache
from spillgate.backends.sim.request import SimRequest

if TYPE_CHECKING:
    from spillgate.backends.sim.kv_events import KvEventPublisher

CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
THROUGHPUT_WINDOW_S = 5.0


@dataclass(frozen=True)
class SchedulerLimits:
    """The server arguments that bound batching."""

    max_total_num_tokens: int
    page_size: int = 1
    chunked_prefill_size: int | None = 8192
    max_running_requests: int = 2048
    max_prefill_tokens: int = 16384
    overlap: bool = True
    """Form each batch while the previous one runs (SGLang's default)."""


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot for /metrics and /v1/loads, named as SGLang names the same figures."""

    num_running_reqs: int
    num_queue_reqs: int
    num_used_tokens: int
    kv_available_tokens: int
    kv_evictable_tokens: int
    token_usage: float
    cache_hit_rate: float
    gen_throughput: float
    decode_sum_seq_lens: int
    num_waiting_uncached_tokens: int
    num_retracted_reqs: int


@dataclass
class _PrefillItem:
    req: SimRequest
    extend: int  # tokens computed in this pass
    prefix: int  # tokens already in KV that the new ones attend to
    hit: int  # of those, tokens found in the prefix cache at admission


class Scheduler:
    """Owns the waiting queue, the running batch, the radix cache and the KV token pool."""

    def __init__(
        self,
        preset: Preset,
        limits: SchedulerLimits,
        clock: VirtualClock,
        kv_events: KvEventPublisher | None = None,
    ) -> None:
        self.preset = preset
        self.limits = limits
        self.clock = clock
        self.kv_events = kv_events
        """Told of every change to the cache; each pass's changes go out as one batch when the pass ends."""
        self.cache = RadixCache(page_size=limits.page_size, events=kv_events)
        self._waiting: deque[SimRequest] = deque()
        self._running: list[SimRequest] = []
        self._chunked: SimRequest | None = None
        self._prefilling: list[SimRequest] = []
        """Requests whose prefill pass runs now (overlap): they join the running batch when it ends."""
        self._aborts: set[SimRequest] = set()
        self._private = 0  # KV tokens held by requests outside the tree
        self._now = 0.0  # simulated time at the end of the last forward pass
        self._new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._last_hit_rate = 0.0
        self._decode_log: deque[tuple[float, int]] = deque()
        self._num_retracted = 0
        self.passes = PassCounters()
        """Where simulated time went (``/sim/passes``); written here only."""

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling loop on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # requests ----------------------------------------------------------------------------------

    def now(self) -> float:
        """The current simulated time (never behind the last forward pass)."""
        return max(self._now, self.clock.now())

    def submit(self, req: SimRequest) -> None:
        self.start()
        cached = self.cache.cached_len(req.fill_ids(req.fill_len)[:-1], req.namespace)
        queued = len(self._waiting) + (self._chunked is not None)
        self.passes.arrival(self.now(), len(self._running), queued, cached)
        self._waiting.append(req)
        self._idle.clear()
        self._wakeup.set()

    def abort(self, req: SimRequest) -> None:
        """Stop ``req`` and free its KV (at the next step boundary if it is in a forward pass)."""
        if req.finished:
            return
        if req in self._waiting:
            self._waiting.remove(req)
            self._finish_aborted(req)
            self._update_idle()
            return
        req.abort_requested = True
        self._aborts.add(req)
        self._wakeup.set()

    def abort_all(self) -> None:
        """Abort every queued and running request (server shutdown), so open streams can end."""
        for req in [*self._waiting, *self._running, *([self._chunked] if self._chunked else [])]:
            self.abort(req)

    async def flush_cache(self, timeout: float = 0.0) -> bool:
        """Empty the radix cache if no request is queued or running (within ``timeout`` wall seconds)."""
        if not self._idle.is_set() and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        if not self._idle.is_set():
            return False
        self.cache.reset()
        self._publish_kv_events()
        self._last_hit_rate = 0.0
        self._decode_log.clear()
        return True

    # accounting --------------------------------------------------------------------------------

    def available_tokens(self) -> int:
        return self.limits.max_total_num_tokens - self.cache.total_size - self._private

    def stats(self) -> SchedulerStats:
        available = self.available_tokens()
        evictable = self.cache.evictable_size
        used = self.limits.max_total_num_tokens - available - evictable
        uncached = sum(req.fill_len for req in self._waiting)
        if self._chunked is not None:
            uncached += self._chunked.fill_len - self._chunked.kv_len
        return SchedulerStats(
            num_running_reqs=len(self._running) + (self._chunked is not None),
            num_queue_reqs=len(self._waiting),
            num_used_tokens=used,
            kv_available_tokens=available,
            kv_evictable_tokens=evictable,
            token_usage=used / self.limits.max_total_num_tokens,
            cache_hit_rate=self._last_hit_rate,
            gen_throughput=self._gen_throughput(self.now()),
            decode_sum_seq_lens=sum(req.kv_len for req in self._running),
            num_waiting_uncached_tokens=uncached,
            num_retracted_reqs=self._num_retracted,
        )

    def _gen_throughput(self, now: float) -> float:
        while self._decode_log and self._decode_log[0][0] < now - THROUGHPUT_WINDOW_S:
            self._decode_log.popleft()
        return sum(tokens for _, tokens in self._decode_log) / THROUGHPUT_WINDOW_S

    def _allocate(self, num_tokens: int) -> bool:
        """Take ``num_tokens`` KV slots, evicting unlocked cache leaves if the pool is short."""
        shortfall = num_tokens - self.available_tokens()
        if shortfall > 0:
            self.cache.evict(shortfall)
        if self.available_tokens() < num_tokens:
            return False
        self._private += num_tokens
        return True

    def _reserved_tokens(self) -> float:
        """KV the running requests may still need, discounted by SGLang's new-token ratio."""
        reserved = 0.0
        for req in (*self._running, *self._prefilling):
            remaining = min(max(req.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
            reserved += remaining * self._new_token_ratio
        if self._chunked is not None:
            req = self._chunked
            reserved += req.fill_len - req.kv_len + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        return reserved

    # the loop ----------------------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._waiting or self._running or self._chunked is not None)

    def _update_idle(self) -> None:
        if self._has_work():
            self._idle.clear()
        else:
            self._idle.set()

    async def _loop(self) -> None:
        planned: list[_PrefillItem] | None = None
        """The batch formed while the last pass ran (overlap): prefill items, or [] for a decode pass."""
        while True:
            self._reap_aborts()
            self._update_idle()
            if planned is None:
                if not self._has_work():
                    self._publish_kv_events()
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    self._now = max(self._now, self.clock.now())
                    continue
                planned = self._schedule_prefill()
                if not planned and not self._running:
                    # Nothing can run until a request arrives or is aborted.
                    planned = None
                    self._publish_kv_events()  # what making room evicted
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
            batch, planned = planned, None
            if batch:
                planned = await self._run_prefill(batch)
            elif self._running:
                planned = await self._run_decode()
            # What the pass stored (and what making room for it evicted), before its tokens reach any client.
            self._publish_kv_events()

    def _publish_kv_events(self) -> None:
        if self.kv_events is not None:
            self.kv_events.flush()

    def _plan_ahead(self, joins_running: bool) -> list[_PrefillItem] | None:
        """With the overlap scheduler, the next batch, formed now as the pass that starts now is launched."""
        if not self.limits.overlap:
            return None
        items = self._schedule_prefill()
        if items or self._running or joins_running:
            return items
        return None

    def _reap_aborts(self) -> None:
        if not self._aborts:
            return
        for req in self._aborts:
            if req is self._chunked:
                self._chunked = None
            elif req in self._running:
                self._running.remove(req)
            elif req in self._waiting:  # retracted after the abort was asked for
                self._waiting.remove(req)
            self._release(req)
            self._finish_aborted(req)
        self._aborts.clear()

    # prefill -----------------------------------------------------------------------------------

    def _schedule_prefill(self) -> list[_PrefillItem]:
        if not self._waiting and self._chunked is None:
            return []
        limits = self.limits
        items: list[_PrefillItem] = []
        rem_chunk = limits.chunked_prefill_size if limits.chunked_prefill_size else None
        rem_input = limits.max_prefill_tokens
        reserved = self._reserved_tokens()

        if self._chunked is not None:
            req = self._chunked
            remaining = req.fill_len - req.kv_len
            extend = remaining if rem_chunk is None else min(remaining, rem_chunk)
            if not self._allocate(extend):
                return items
            items.append(_PrefillItem(req, extend, prefix=req.kv_len, hit=0))
            req.kv_len += extend
            reserved -= extend
            if extend < remaining:
                return items
            self._chunked = None
            rem_input -= extend
            if rem_chunk is not None:
                rem_chunk -= extend

        while self._waiting:
            if len(self._running) + len(self._prefilling) + len(items) >= limits.max_running_requests:
                break
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                break
            req = self._waiting[0]
            fill = req.fill_ids(req.fill_len)
            match = self.cache.match_prefix(fill[:-1], req.namespace)
            self.cache.lock(match.node)
            extend = len(fill) - match.length
            max_new = min(max(req.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
            # Clamped to the pool, so a request that fits an empty pool is never stuck.
            need = min(extend + max_new + limits.page_size, limits.max_total_num_tokens)
            chunk = extend
            if rem_chunk is not None and extend > rem_chunk:
                chunk = rem_chunk - rem_chunk % limits.page_size
            fits = need <= self.available_tokens() + self.cache.evictable_size - reserved
            if not fits or chunk <= 0 or not self._allocate(chunk):
                self.cache.unlock(match.node)
                break
            self._waiting.popleft()
            first_admission = req.admitted_at is None
            if first_admission:
                req.admitted_at = self.now()
                req.cached_tokens = match.length
                self.passes.admitted(match.length)
            req.node, req.tree_len, req.kv_len = match.node, match.length, match.length + chunk
            items.append(_PrefillItem(req, chunk, prefix=match.length, hit=match.length if first_admission else 0))
            reserved += need - chunk
            rem_input -= chunk
            if chunk < extend:
                self._chunked = req
                break
            if rem_chunk is not None:
                rem_chunk -= chunk
        return items

    async def _run_prefill(self, items: list[_PrefillItem]) -> list[_PrefillItem] | None:
        start = max([self._now] + [item.req.arrival for item in items])
        duration = timing.prefill_seconds(self.preset, ((item.extend, item.prefix) for item in items))
        await self.clock.sleep_until(start)
        self.passes.late(start - self._now, len(self._running))
        self.passes.prefill(start, duration, sum(item.extend for item in items), len(items), len(self._running))
        self._now = start + duration
        self._prefilling = [item.req for item in items if item.prefix + item.extend >= item.req.fill_len]
        planned = self._plan_ahead(joins_running=True)
        await self.clock.sleep_until(self._now)
        self._prefilling = []

        hit = sum(item.hit for item in items)
        computed = sum(item.extend for item in items)
        self._last_hit_rate = hit / (hit + computed) if hit + computed else 0.0
        for item in items:
            req = item.req
            if req.abort_requested:
                continue  # reaped at the top of the loop
            computed = item.prefix + item.extend  # not req.kv_len: its next chunk may be planned already
            self._insert_into_cache(req, computed)
            if computed < req.fill_len:
                continue  # a chunk of a longer prompt
            self._emit_token(req)
            if req.finished:
                self._finish(req)
            else:
                self._running.append(req)
        return planned

    # decode ------------------------------------------------------------------------------------

    async def _run_decode(self) -> list[_PrefillItem] | None:
        while not self._allocate(len(self._running)):
            if not self._retract_one():
                # Cannot happen while max_new_tokens is clamped to the pool; end it rather than stall.
                req = self._running.pop()
                req.finish_reason = {"type": "length", "length": len(req.output_ids)}
                req.finished_at = self._now
                self._finish(req)
                req.notify()
                return None
        for req in self._running:
            req.kv_len += 1
        batch = self._running
        context = sum(req.kv_len for req in batch)
        duration = timing.decode_seconds(self.preset, len(batch), context)
        self.passes.decode(self._now, duration, len(batch), context)
        self._now += duration
        planned = self._plan_ahead(joins_running=False)
        await self.clock.sleep_until(self._now)

        self._decode_log.append((self._now, len(batch)))
        self._new_token_ratio = max(self._new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        still_running = []
        for req in batch:
            if not req.abort_requested:  # aborted ones are reaped at the top of the loop
                self._emit_token(req)
                if req.finished:
                    self._finish(req)
                    continue
            still_running.append(req)
        self._running = still_running
        return planned

    def _retract_one(self) -> bool:
        """Free KV for decode: requeue a half-done chunked prefill, else the running request with
        the least output (longest prompt on ties). False if only one running request is left."""
        if self._chunked is not None:
            victim, self._chunked = self._chunked, None
        elif len(self._running) > 1:
            victim = min(self._running, key=lambda r: (len(r.output_ids), -len(r.input_ids)))
            self._running.remove(victim)
        else:
            return False
        self._release(victim)
        victim.num_retractions += 1
        self._num_retracted += 1
        self._waiting.appendleft(victim)
        self._new_token_ratio = 1.0
        return True

    # token and KV bookkeeping --------------------------------------------------------------------

    def _emit_token(self, req: SimRequest) -> None:
        req.output_ids.append(req.tokens.next_id())
        if req.first_token_at is None:
            req.first_token_at = self._now
        req.last_token_at = self._now
        if req.tokens.matched_stop is not None:
            req.finish_reason = {"type": "stop", "matched": req.tokens.matched_stop}
            req.finished_at = self._now
        elif len(req.output_ids) >= req.plan.length:
            req.finish_reason = req.plan.finish_reason()
            req.finished_at = self._now
        req.notify()

    def _insert_into_cache(self, req: SimRequest, upto: int) -> None:
        """SGLang's cache_(un)finished_req: move the request's computed tokens into the tree."""
        _, node = self.cache.insert(req.fill_ids(upto), req.namespace)
        aligned = upto - upto % self.limits.page_size
        self._private -= aligned - req.tree_len
        self.cache.lock(node)
        if req.node is not None:
            self.cache.unlock(req.node)
        req.node, req.tree_len = node, aligned

    def _finish(self, req: SimRequest) -> None:
        # The last token never gets KV (it is not fed back), so prompt + output[:-1] is cached.
        req.kv_len = req.fill_len - 1
        self._insert_into_cache(req, req.kv_len)
        self._release(req)

    def _release(self, req: SimRequest) -> None:
        self._private -= req.kv_len - req.tree_len
        if req.node is not None:
            self.cache.unlock(req.node)
        req.node, req.tree_len, req.kv_len = None, 0, 0

    def _finish_aborted(self, req: SimRequest) -> None:
        req.finish_reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        req.finished_at = self.now()
        req.notify()
