"""``SharedLoader``: a DataLoader-shaped consumer of a shared producer.

Epochs are per consumer and sample-granular. A consumer's epoch starts at the first sample it is
given and ends just before the *same position one producer epoch later*: producer epoch e+1,
offset p if it started at (e, p). So it contains exactly one producer epoch's worth of samples
whatever its batch size and whenever it joined; if the producer's loader yields the same order
every epoch (no shuffle, or a seeded sampler), that is every sample exactly once. With a
reshuffling loader a late joiner's epoch straddles two permutations; ``join="epoch"`` waits for
the next producer epoch instead, which gives exact coverage with any sampler.

Batches are read-only views into the ring when a consumer batch lies inside one slot; batches
that span slots, the last batch of each epoch, and all batches with ``copy=True`` are private
copies. A batch that spans slots is copied slot by slot as it is read, and each slot is released
before the next one is awaited, so a batch may be larger than the whole ring. A slot is released
only when every view into it is gone (tracked with storage weak references), so keeping a batch
longer than a step never lets the producer overwrite it; it just holds the ring, and eventually
gets this consumer detached with an error saying so.

Between epochs the loader pauses (releases everything), so evaluation or checkpointing never
stalls the other consumers; the next ``iter()`` re-attaches at the producer's current position.

Releases are batched: finished slots collect in ``_pending`` and go out as one RELEASE once
``slots // 4`` have collected, every ``TICK_S`` (housekeeping), before ATTACH/PAUSE, and before
the loader blocks for a batch whenever the producer might be waiting for one of them. So a fast
consumer sends one datagram per few batches and the producer is never kept waiting on a release
that sits in a list.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, Self

from collocate.common.errors import InputError
from collocate.share import naming
from collocate.share.connection import Connection
from collocate.share.errors import RingCorruptionError, ShareError
from collocate.share.layout import Layout
from collocate.share.protocol import MAX_RELEASE, Batch, Msg, encode, encode_release
from collocate.share.ring import RingReader

ENV_SHARE_DIR = "COLLOCATE_SHARE_DIR"  # set by the collocate daemon for --dataset jobs


class _Hold:
    """A delivered batch this consumer still owns (a plain slotted class: one per batch)."""

    __slots__ = ("batch", "consumed", "refs")

    def __init__(self, batch: Batch, consumed: bool = False, refs: list[Any] | None = None) -> None:
        self.batch, self.consumed = batch, consumed
        self.refs: list[Any] = [] if refs is None else refs  # fences that must expire first


class SharedLoader:
    """Iterate batches served by ``share.serve(loader, name=name)``; usable like a DataLoader.

    batch_size: samples per batch (default: the producer's); any size, coverage stays exact.
    drop_last: drop each epoch's last incomplete batch, as DataLoader does.
    copy: hand out private, writable tensors instead of read-only views.
    timeout: seconds of silence after which the producer counts as dead (raises ProducerLostError).
    connect_timeout: how long to wait for the producer to appear.
    batch_timeout: longest wait for one batch while the producer is alive (None: no limit).
    join: "now" (start at the producer's position) or "epoch" (start at its next epoch).
    state_dir: scopes the name; default $COLLOCATE_SHARE_DIR (what the daemon gives jobs
        submitted with --dataset), else the per-user default.
    """

    def __init__(self, name: str, batch_size: int | None = None, *, drop_last: bool = False, copy: bool = False,
                 timeout: float = 5.0, connect_timeout: float = 30.0, batch_timeout: float | None = None,
                 join: str = "now", state_dir: str | os.PathLike[str] | None = None, label: str = "") -> None:
        naming.check_platform()
        if batch_size is not None and batch_size < 1:
            raise InputError(f"batch_size={batch_size} must be at least 1", hint="pass a positive batch size")
        if join not in ("now", "epoch"):
            raise InputError(f"join={join!r} is not valid", hint="valid choices: 'now', 'epoch'")
        if timeout <= 0:
            raise InputError("timeout must be positive", hint="default is 5 seconds")
        self.name, self.drop_last, self.copy, self.join = name, drop_last, copy, join
        self.batch_timeout = batch_timeout
        if state_dir is None:  # a job launched by the daemon with --dataset: its share dir
            state_dir = os.environ.get(ENV_SHARE_DIR) or None
        self._conn = Connection(naming.socket_address(name, state_dir), name, timeout=timeout,
                                connect_timeout=connect_timeout, label=label)
        welcome = self._conn.welcome
        self.layout = Layout.from_json(welcome["layout"])
        if welcome.get("backend", "cpu") == "cpu":
            assert self._conn.ring_fd is not None, "Connection refuses a cpu WELCOME without its ring"
            self._ring: Any = RingReader(self._conn.ring_fd, self.layout, int(welcome["slots"]),
                                         int(welcome["segment_bytes"]))
        else:
            from collocate.share.cuda_ipc import CudaRingReader

            self._ring = CudaRingReader(welcome["handles"], self.layout, int(welcome["slots"]))
        self.batch_size = batch_size or self.layout.capacity
        self._samples_per_epoch: int | None = welcome.get("samples_per_epoch")
        self._slots = int(welcome["slots"])
        self._release_every = max(1, self._slots // 4)
        self._lock = threading.RLock()
        self._holds: dict[int, _Hold] = {}
        self._pending: list[int] = []  # released here, not yet told to the producer
        self._newest = -1  # highest sequence number delivered
        self._attached = self._attaching = self._iterating = False
        self._resume_hint = -1
        self._cur: Batch | None = None
        self._pos = 0
        self.epoch = 0
        self._conn.tick = self._tick
        self._conn.on_wait = self._before_wait

    # ------------------------------------------------------------------ DataLoader surface
    def __len__(self) -> int:
        n = self._samples_per_epoch
        if n is None:
            raise TypeError(f"the length of shared dataset {self.name!r} is not known yet: the producer has not "
                            "finished an epoch; pass samples_per_epoch= to serve() to know it up front")
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch number (DataLoader/DistributedSampler compatibility; the producer owns order)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        if self._iterating:
            raise ShareError("this SharedLoader is already being iterated",
                             hint="finish or break out of the current epoch first; create another loader for a second stream")
        return self._epoch_iter()

    def attach(self) -> None:
        """Join the producer's stream now (``iter()`` does this when needed)."""
        with self._lock:
            if self._attached:
                return
            self._drain_paused()
            self._release_expired(flush=True)  # sent before ATTACH: the producer sees them first
            self._attaching = True
            self._conn.send(encode(Msg.ATTACH, self._resume_hint))
        stale: list[int] = []  # batches sent before our PAUSE reached the producer
        try:
            deadline = time.monotonic() + max(30.0, self._conn.timeout)
            while True:
                kind, body = self._get(deadline)
                if kind is Msg.START:
                    start = int(body[0])
                    break
                if kind is Msg.BATCH:
                    stale.append(body.seq)
            with self._lock:
                self._pending += [seq for seq in stale if seq < start]  # not in the backlog re-sent after START
                for seq, hold in self._holds.items():
                    if seq >= start:  # re-sent after START: ours again until read again, even if its views died
                        hold.consumed = False
                self._flush()
        finally:
            with self._lock:
                self._attaching = False
                self._attached = True

    def detach(self) -> None:
        """Stop receiving batches and release every slot not still referenced by a live batch tensor."""
        with self._lock:
            if not self._attached:
                return
            self._attached = False
            self._conn.send(encode(Msg.PAUSE))
            self._cur = None
            for hold in self._holds.values():
                hold.consumed = True
            self._drain_paused()
            self._release_expired(flush=True)

    def close(self) -> None:
        """Detach and disconnect; batches already handed out stay readable."""
        if getattr(self, "_conn", None) is None:
            return
        try:
            if self._conn.error is None:
                self.detach()
        finally:
            self._conn.close()
            self._ring.close()
            self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a finaliser must never raise
            self.close()

    # ------------------------------------------------------------------ one epoch
    def _epoch_iter(self) -> Iterator[Any]:
        self._iterating = True
        try:
            if self._conn.error is not None:
                raise self._conn.error
            self.attach()
            self._cur, self._pos = None, 0
            end: tuple[int, int] | None = None
            over = False
            while not over:
                pieces: list[tuple[Batch, int, int]] = []  # read, not yet copied
                used: list[Batch] = []  # fully read; released only after views are registered
                out: list[Any] | None = None  # a batch that spans slots, copied as it is read
                filled, need = 0, self.batch_size
                while need and not over:
                    if self._cur is None:
                        if used:  # copy and free what is read before waiting: the batch may outsize the ring
                            out = out or self.layout.empty(self.batch_size, self._ring.device)
                            filled = self._copy(pieces, out, filled)
                            for done in used:
                                self._finish(done)
                            pieces, used = [], []
                        kind, body = self._get(self._deadline())
                        if kind is Msg.EPOCH_END:
                            self._samples_per_epoch = self._samples_per_epoch or int(body[1])
                            over = end is not None and end == (int(body[0]) + 1, 0)
                            continue
                        if kind is not Msg.BATCH:
                            continue
                        self._hold(body)
                        if end is None and self.join == "epoch" and body.offset != 0:
                            self._finish(body)
                            continue
                        self._cur, self._pos = body, 0
                    cur = self._cur
                    if end is None:
                        end = (cur.epoch + 1, cur.offset + self._pos)
                    limit = _limit(cur, end)
                    take = min(need, limit - self._pos)
                    if take > 0:
                        pieces.append((cur, self._pos, self._pos + take))
                        self._pos += take
                        need -= take
                    if self._pos >= cur.size:
                        used.append(cur)
                        self._resume_hint = cur.seq + 1
                        self._cur = None
                        over = cur.epoch == end[0] and cur.offset + cur.size >= end[1]
                    elif self._pos >= limit:
                        over = True
                if (pieces or filled) and (not self.drop_last or need == 0):
                    batch = self._assemble(pieces, out, filled, final=over)
                    for done in used:
                        self._finish(done)
                    yield batch
                    del batch
                else:
                    for done in used:
                        self._finish(done)
                self._release_expired()
            self.epoch += 1
        finally:
            self._iterating = False
            if self._conn is not None and self._conn.error is None:
                if self._cur is not None:  # resume where this epoch stopped, not earlier
                    self._resume_hint = self._cur.seq
                self.detach()

    def _assemble(self, pieces: list[tuple[Batch, int, int]], out: list[Any] | None, filled: int,
                  final: bool) -> Any:
        """The batch: a view of one slot, or ``out`` (rows ``filled``... still to copy) completed."""
        ring = self._ring
        if out is None and len(pieces) == 1 and not self.copy and not final:
            batch, lo, hi = pieces[0]
            self._check(pieces)
            tensors = ring.views(batch.slot, lo, hi)
            with self._lock:
                refs = self._holds[batch.seq].refs
                refs += [f for f in ring.fences(batch.slot, tensors) if f not in refs]
            return self.layout.unflatten(tensors)
        if out is None:
            out = self.layout.empty(sum(hi - lo for _, lo, hi in pieces), ring.device)
        n = self._copy(pieces, out, filled)
        return self.layout.unflatten([t[:n] for t in out] if n < len(out[0]) else out)

    def _copy(self, pieces: list[tuple[Batch, int, int]], out: list[Any], at: int) -> int:
        """Copy ``pieces`` into rows ``at``... of ``out``; return the next free row."""
        self._check(pieces)
        self._ring.copy([(b.slot, lo, hi) for b, lo, hi in pieces], out, at)
        self._check(pieces)  # a copy must not straddle a rewrite either
        return at + sum(hi - lo for _, lo, hi in pieces)

    def _check(self, pieces: list[tuple[Batch, int, int]]) -> None:
        try:
            for batch, _, _ in pieces:
                self._ring.check(batch.slot, batch.seq)
        except RingCorruptionError as exc:  # after a detach the reason is the better error
            raise (self._conn.wait_error(1.0) or exc) from None

    # ------------------------------------------------------------------ slot bookkeeping
    def _deadline(self) -> float | None:
        return None if self.batch_timeout is None else time.monotonic() + self.batch_timeout

    def _get(self, deadline: float | None) -> tuple[Msg, Any]:
        try:
            return self._conn.get(deadline)
        except TimeoutError:
            raise ShareError(f"no batch from producer {self.name!r} within batch_timeout={self.batch_timeout:g} s",
                             hint="the producer is alive but its loader is stuck or other consumers hold the ring; "
                             "check `collocate share status`-style stats or raise batch_timeout") from None

    def _finish(self, batch: Batch) -> None:
        with self._lock:
            hold = self._holds.get(batch.seq)
            if hold is not None:
                hold.consumed = True

    def _release_expired(self, flush: bool = False) -> None:
        """Collect finished slots and tell the producer once enough have collected (or ``flush``).
        Sent under the lock, so no RELEASE can overtake a later ATTACH or PAUSE."""
        with self._lock:
            if self._attaching:  # until START says what the producer re-sends, release nothing
                return
            holds, done = self._holds, []
            for seq, hold in holds.items():
                if hold.consumed:
                    for ref in hold.refs:
                        if not ref.expired():
                            break
                    else:
                        done.append(seq)
            for seq in done:
                del holds[seq]
            self._pending += done
            if flush or len(self._pending) >= self._release_every:
                self._flush()

    def _flush(self) -> None:
        pending = self._pending
        for i in range(0, len(pending), MAX_RELEASE):
            self._conn.send(encode_release(pending[i:i + MAX_RELEASE]))
        pending.clear()

    def _before_wait(self) -> None:
        """About to block for a message: flush if the producer may be waiting for a pending slot.
        Its next batch, ``_newest + 1``, needs batch ``_newest + 1 - slots`` released; one of slack."""
        with self._lock:
            self._release_expired()
            if self._pending and min(self._pending) + self._slots <= self._newest + 2:
                self._flush()

    def _hold(self, batch: Batch) -> None:
        """Track a delivered batch; a slot still pinned by old views keeps those views' refs."""
        with self._lock:
            old = self._holds.get(batch.seq)
            self._holds[batch.seq] = _Hold(batch, refs=old.refs if old else [])
            self._newest = max(self._newest, batch.seq)

    def _drain_paused(self) -> None:
        """While paused, batches still in flight are released at once (never read)."""
        for kind, body in self._conn.drain():
            if kind is Msg.BATCH:
                old = self._holds.get(body.seq)
                self._holds[body.seq] = _Hold(body, consumed=True, refs=old.refs if old else [])

    def _tick(self) -> None:
        """Housekeeping (every TICK_S): free slots whose views died, refuse batches while paused."""
        with self._lock:
            if not self._attached and not self._attaching:
                self._drain_paused()
            self._release_expired(flush=True)


def _limit(batch: Batch, end: tuple[int, int]) -> int:
    """How many leading samples of ``batch`` lie before the consumer's epoch end ``end``."""
    if batch.epoch < end[0]:
        return batch.size
    if batch.epoch == end[0]:
        return max(0, min(batch.size, end[1] - batch.offset))
    return 0
