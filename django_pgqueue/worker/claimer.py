"""The claimer: takes as many due rows as there are free slots, in one statement.

One claim covers all the worker's queues, by priority across them, and walks only the
(queue, task, version) routes the worker can run (see the ``claim`` statement).

It loops while claims come back full; otherwise it parks until a wake-up (a
notification on its own connection, see listener.py), the next due time of a scheduled
task, or the jittered poll interval, whichever is first. Polling is the correctness
floor; wake-ups and next-due only make it fast.

It is also its queues' stager: scheduled rows are not claimable until ``stage`` makes
them pending. The claimer stages right before claiming when a scheduled task of its
queues is due (it parks until the next one, so a scheduled task starts at its run_at),
and at most every ``STAGE_INTERVAL`` while it is too busy to park.

A claim is not idempotent, so it is never replayed blindly after a connection error:
each claim carries a lease token of the worker's making, and a claim whose reply was
lost is looked up by that token (``find_claimed``) until it is found or its lease would
have lapsed. Rows it took are run, not orphaned until the sweep burns their attempt.

The claimer also bounds what this process holds: it stops claiming while the claims in
flight (running, or run and waiting to be settled) reach ``max_held``, so a settlement
that cannot proceed never lets claimed-but-unrecorded work pile up.

Limits (docs/limits.md): a lane whose routes include a limited queue (QUEUE_LIMITS) or
a task with a per-key limit claims in a transaction: ``lock_limited_queues``, then the
claim. The locks are waited for at most LOCK_WAIT_MS: past it (the holder is likely
frozen inside its claim), the lane claims its other queues, and for LOCK_HELD_FOR only
tries the locks, leaving out a queue whose lock is held. A queue at its concurrency limit
wakes the claimer again through the notification its settlements send; a queue out of
rate budget, when its next start is due: after a short claim of a rate-limited lane,
``limit_state`` says when.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from django_pgqueue.core.fairness import fair_weights
from django_pgqueue.core.limits import QueueLimit, Rate
from django_pgqueue.db import sql
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.worker.claimed import ClaimedTask, claimed_rows
from django_pgqueue.worker.connection import CONNECTION_ERRORS, Backoff, Session
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.listener import Listener
from django_pgqueue.worker.slots import SlotPool
from django_pgqueue.worker.stats import WorkerStats

if TYPE_CHECKING:
    from django_pgqueue.worker.async_slots import AsyncSlots

logger = logging.getLogger("django_pgqueue.worker")

# While busy, due scheduled rows are staged at least this often (seconds).
STAGE_INTERVAL = 0.25
# Rows staged per statement.
STAGE_BATCH = 1000
# A claimer whose claims come back full for this long drops its parked mark (seconds):
# enqueues then stop notifying it (see listener.py).
UNPARK_AFTER = 0.05
# While an enqueue that may have missed the parked mark is in flight, the claimer parks
# at most this long before it checks again (seconds, doubling from the first).
PARK_RETRY_FIRST = 0.001
PARK_RETRY_CAP = 0.05
# With two lanes (thread and async slots), a lane whose claim came back short is not
# claimed into again for this long while the claimer does not park (seconds); a parked
# claimer that wakes up asks both.
LANE_RECHECK = 0.05
# How long the claimer waits for a slot to take the first task of a short claim
# (_hand_over): a slot takes it within microseconds; the bound is for a pool that
# cannot (its slots were all taken meanwhile).
PICKUP_WAIT = 0.002
# How long a limited claim waits for its queues' lock (ms), which another claim holds
# for about a millisecond; past it, the holder is taken for frozen inside its claim,
# and for LOCK_HELD_FOR seconds the lane's claims only try the lock, leaving out the
# queues whose lock is held (and claiming its other queues).
LOCK_WAIT_MS = "200"
LOCK_HELD_FOR = 2.0
# Rows at the head of each route with a per-key rate that a short claim looks at for
# keys out of budget, to set them aside until their key's next start (snooze_throttled).
SNOOZE_BATCH = 100


class Claimer:
    name = "claimer"

    def __init__(
        self,
        alias: str,
        worker_id: str,
        queues: list[str],
        routes: list[tuple[str, int]],
        slots: SlotPool,
        inflight: InFlight,
        stats: WorkerStats,
        *,
        lease_seconds: float,
        poll_interval: float,
        starvation_timeout: float,
        durable: bool = True,
        max_held: int | None = None,
        async_lane: tuple[AsyncSlots, list[tuple[str, int]]] | None = None,
        limits: dict[str, QueueLimit] | None = None,
        key_limits: dict[tuple[str, int], int] | None = None,
        key_rates: dict[tuple[str, int], Rate] | None = None,
        listen_alias: str | None = "",
        claim_batch_bytes: int | None = None,
        fair_routes: set[tuple[str, int]] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.queues = queues
        self.routes = routes
        limits = {q: limit for q, limit in (limits or {}).items() if q in queues}
        key_limits = key_limits or {}

        def params(
            lane_routes: list[tuple[str, int]], only: list[str] | None = None
        ) -> dict[str, object]:
            return route_params(
                queues if only is None else only, lane_routes, starvation_timeout, limits,
                key_limits, claim_batch_bytes=claim_batch_bytes, key_rates=key_rates,
                fair_routes=fair_routes,
            )  # fmt: skip

        self._route_params = params(routes)
        # What to claim into: the thread slots (routes: the sync tasks, or all of them),
        # and the async slots for the async tasks when the worker has both kinds.
        self._lanes = [_Lane(slots, routes, self._route_params, limits=limits)]
        if async_lane is not None:
            pool, async_routes = async_lane
            lane = _Lane(pool, async_routes, params(async_routes), limits=limits)
            self._lanes = [lane for lane in [*self._lanes, lane] if lane.routes]
        # Both lanes at once, for the claims of an idle worker (see _claim_round).
        self._both = (
            _Lane(slots, [r for lane in self._lanes for r in lane.routes],
                  params([r for lane in self._lanes for r in lane.routes]), limits=limits)
            if len(self._lanes) > 1
            else None
        )  # fmt: skip
        for lane in self._all_lanes:
            # The lane's claim without the queues whose lock another claim holds.
            lane.narrowed = functools.partial(params, lane.routes)
        self._idle_rounds = False  # the last round claimed nothing in any lane
        self._lane_of = {route: lane for lane in self._lanes for route in lane.routes}
        self._stage_at = 0.0  # monotonic: stage before the next claim once past it
        # The last next-due lookup found no scheduled task of our queues, and the claimer
        # has been parked since: a claim after a wake-up need not stage first (a task
        # scheduled since then is found by the next lookup, before the claimer parks).
        self._nothing_scheduled = False
        self._next_starvation_check = 0.0  # monotonic
        self.slots = slots
        self.inflight = inflight
        self.stats = stats
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.starvation_timeout = starvation_timeout
        self._stop = threading.Event()
        self.max_held = max_held or sum(lane.max_held for lane in self._lanes)
        self.listener = Listener(queues)
        # Where the claimer LISTENs and holds its parked marks (session locks): on its
        # own claim connection (listen_alias "" or the claim's alias), on a connection
        # of its own to listen_alias (behind a transaction pooler: a direct address),
        # or nowhere (None: behind a pooler without one, it polls).
        own = listen_alias in ("", alias)
        # Claims commit durably unless ASYNC_CLAIMS is set: see connection.connect().
        self.session = Session(
            alias,
            self.name,
            self._stop,
            durable=durable,
            on_connect=self.listener.attach if own else None,
        )
        self.listen_session: Session | None = (
            self.session
            if own
            else None
            if listen_alias is None
            else Session(listen_alias, "listener", self._stop, on_connect=self.listener.attach)
        )
        # Tokens of claims whose reply was lost: token -> give up looking at (monotonic).
        self._unconfirmed: dict[str, float] = {}
        self._backoff = Backoff()
        self._busy_since: float | None = None  # monotonic: claims full since then
        self._park_retry = PARK_RETRY_FIRST
        self._thread = threading.Thread(target=self._run, name="pgqueue-claimer", daemon=True)
        # Set while parked with nothing claimable (burst mode exits on it).
        self.idle = threading.Event()
        # Called when a notification (or a poll) ends a park: the batcher claims then.
        self.on_wake: Callable[[], None] | None = None

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self.listener.wake()

    def stop(self) -> None:
        """Stop claiming and close the connections; once (a recycling worker stops its
        claimer before its shutdown does)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.listener.wake()
        self._thread.join(10)
        self.session.close()
        if self.listen_session is not None:
            self.listen_session.close()
        self.listener.close()

    def _run(self) -> None:
        linger_for = max(1, sum(lane.pool.capacity for lane in self._lanes) // 2)
        while not self._stop.is_set():
            self._wait_for_free(linger_for, 0.001)
            if self._stop.is_set():
                break
            if len(self.inflight) >= self.max_held:
                # Settlement is behind (the database is slow, or rows are locked):
                # claim nothing more until it catches up.
                self.inflight.wait_below(self.max_held, 0.5)
                continue
            # Clear before claiming: a wake-up that arrives during the claim is kept.
            self.listener.clear()
            settled_before = not self.inflight
            try:
                claimed, saturated = self._claim_round()
                self._backoff.reset()
            except CONNECTION_ERRORS:
                # Logged by the session; never replayed blindly (see the module doc).
                self.session.close()
                if self._stop.is_set():
                    break
                self._stop.wait(self._backoff.next_delay())
                continue
            except Exception:
                if self._stop.is_set():
                    break
                logger.exception("claimer: claim failed")
                self._stop.wait(1.0)
                continue
            if saturated:
                self.idle.clear()
                self._busy()
                continue
            if claimed:
                self.idle.clear()
            self._busy_since = None
            try:
                retry_in = self._prepare_park()
                if retry_in == 0:
                    # Claim once more, in every lane: it sees every enqueue that did
                    # not notify.
                    self._ask_every_lane()
                    continue
                timeout = self._park_timeout()
            except CONNECTION_ERRORS:
                self.session.close()
                if self.listen_session is not None:
                    self.listen_session.close()
                self._ask_every_lane()
                continue
            except Exception:
                if self._stop.is_set():
                    break
                logger.exception("claimer: next-due lookup failed")
                timeout = self.poll_interval
                retry_in = None
            if retry_in is not None:
                timeout = min(timeout, retry_in)
            if timeout <= 0:  # a scheduled task is due: stage it and claim again
                self.idle.clear()
                self._ask_every_lane()
                continue
            # Idle means: a claim that started after every outcome was written (so it
            # saw every task those outcomes made due again) found nothing.
            throttled = any(lane.throttled_until > time.monotonic() for lane in self._all_lanes)
            if not claimed and settled_before and not self.inflight and not throttled:
                self.idle.set()
            else:
                self.idle.clear()
            listening = self.listen_session
            try:
                self.listener.wait(listening._conn if listening else None, timeout)
            except psycopg.Error:
                listening.close()  # reconnected (and LISTENing again) before parking
            if self.on_wake is not None:
                self.on_wake()
            self._ask_every_lane()  # after a wake-up or a poll

    def _prepare_park(self) -> float | None:
        """Before parking: None if the parked mark is in place (park at will); 0 if it
        was just put in place (claim once more first); else how long to park at most
        before checking again, while an enqueue that did not notify may be in flight."""
        if self.listener.park_ready or self.listen_session is None:
            return None  # marked already, or polling (no LISTEN: enqueues never notify)
        if self.listen_session.call(self.listener.prepare_park, retry=False):
            self._park_retry = PARK_RETRY_FIRST
            return 0.0
        retry_in = self._park_retry
        self._park_retry = min(PARK_RETRY_CAP, self._park_retry * 2)
        return retry_in

    def _busy(self) -> None:
        """Claims come back full: drop the parked mark once that has lasted a while."""
        now = time.monotonic()
        self._nothing_scheduled = False  # busy: stage every STAGE_INTERVAL again
        if self._busy_since is None:
            self._busy_since = now
        elif self.listener.parked_mark and now - self._busy_since >= UNPARK_AFTER:
            try:
                self.listen_session.call(self.listener.release_park, retry=False)
            except CONNECTION_ERRORS:
                self.listen_session.close()  # the locks went with the session

    def _wait_for_free(self, minimum: int, linger: float) -> int:
        """Block until a slot is free to claim into; then linger up to ``linger`` s for
        ``minimum`` free, so that a saturated worker claims in batches instead of one
        row per freed slot (an idle worker never lingers: its slots are all free).
        Returns the free slots in all.

        A lane whose last claim came back short is claimed into again only after a
        wake-up, or LANE_RECHECK after that claim: until then its free slots do not end
        the wait (with two lanes, the other lane's may)."""
        changed = self.slots._free_changed  # shared by the lanes' pools
        with changed:
            while not self._stop.is_set():
                now = time.monotonic()
                waits = [
                    lane.recheck_in(now) for lane in self._lanes if lane.pool._available() > 0
                ]
                if waits and min(waits) <= 0:
                    break
                changed.wait(min([*waits, 0.1]))

            def available() -> int:
                return sum(max(0, lane.pool._available()) for lane in self._lanes)

            if available() < minimum and linger > 0:
                changed.wait_for(lambda: available() >= minimum, linger)
            return available()

    @property
    def _all_lanes(self) -> list[_Lane]:
        return [*self._lanes, *([self._both] if self._both is not None else [])]

    def _ask_every_lane(self) -> None:
        for lane in self._lanes:
            lane.short_at = None

    def _claim_round(self) -> tuple[int, bool]:
        """Stage what is due (when it is time), then one claim across all queues per
        lane. True when the claimer should claim again rather than park: a claim came
        back full, or a lane's slots are all busy (with two lanes, the claimer then
        waits for them, see _wait_for_free, and asks the other lane, whose last claim
        came back short, again every LANE_RECHECK: at most that late for its work)."""
        claimed = self._adopt_unconfirmed() if self._unconfirmed else 0
        if time.monotonic() >= self._stage_at and not self._nothing_scheduled:
            self._stage()
        # Looking for a starving task costs two index probes per route: once per
        # escape window is enough, since only one escape per window is taken anyway.
        now = time.monotonic()
        look = now >= self._next_starvation_check
        if look:
            self._next_starvation_check = now + self._route_params["escape_window_seconds"]
        # Each lane bounds what it holds unsettled, as max_held does for the process
        # (_run checks that first: with one lane, the two bounds are the same).
        held = self._held_by_lane() if len(self._lanes) > 1 else None
        # An idle worker with two lanes (thread and async slots) asks for both in one
        # claim: its polls cost one statement, not one per lane. Each lane gets at most
        # its free slots; once anything is found, it claims per lane again.
        want = min(lane.pool.free() for lane in self._lanes)
        if (
            self._both is not None
            and self._idle_rounds
            and not held
            and want > 0
            and all(lane.recheck_in(now) <= 0 for lane in self._lanes)
        ):
            got = self._claim(self._both, want, look)
            self._idle_rounds = got == 0
            for lane in self._lanes:
                lane.short_at = None if got == want else now
            return claimed + got, got == want
        busy = False
        for lane in self._lanes:
            want = lane.pool.free()
            if want <= 0:
                busy = True
                continue
            if lane.recheck_in(now) > 0:
                continue
            if held is not None:
                want = min(want, lane.max_held - held[lane])
                if want <= 0:
                    busy, lane.short_at = True, now  # settlement is behind: look again soon
                    continue
            got = self._claim(lane, want, look)
            claimed += got
            if got == want:
                busy = True
                lane.short_at = None
            else:
                lane.short_at = now
        self._idle_rounds = claimed == 0 and not busy
        return claimed, busy

    def _held_by_lane(self) -> Counter:
        return Counter(self._lane_of.get(task.route) for task in self.inflight.snapshot())

    def _claim(self, lane: _Lane, want: int, look_for_starving: bool) -> int:
        token = str(uuid.uuid4())
        params = {
            **lane.params,
            "look_for_starving": look_for_starving,
            "limit": want,
            "token": token,
            "lease_seconds": self.lease_seconds,
            "worker_id": self.worker_id,
        }
        self.stats.incr("claim_statements")
        try:
            if lane.lock_queues:
                tasks = self.session.call(
                    lambda conn: self._claim_limited(conn, lane, params, want), retry=False
                )
            else:
                statement = claim_statement(params)
                tasks = self.session.call(
                    lambda conn: _fetch(conn, statement, params), retry=False
                )
        except CONNECTION_ERRORS:
            # The server may have committed the claim before the connection broke.
            self._unconfirmed[token] = time.monotonic() + self.lease_seconds
            raise
        taken = len(tasks)
        # A batch cut to CLAIM_BATCH_BYTES left due rows pending: it counts as full, so
        # the claimer claims again at once instead of parking.
        cut = bool(tasks) and tasks[0].left_out > 0
        if any(task.expired for task in tasks):
            tasks = self._drop_expired(tasks)
        # A short claim: the worker has idle slots and these tasks start at once.
        self._hand_over(tasks, lane, first_starts=taken < want)
        if lane.snoozed:
            # Rows of keys out of budget were set aside: what is behind them is
            # claimable now, and they are due at their key's next start (staged then).
            self.stats.incr("key_rate_snoozed", lane.snoozed)
            self._nothing_scheduled = False
            return want
        if cut:
            self.stats.incr("claims_cut")
            return want
        return taken  # expired rows count: a batch full of them is claimed again at once

    def _drop_expired(self, tasks: list[ClaimedTask]) -> list[ClaimedTask]:
        """The rows the claim ended cancelled because they had expired: counted and
        logged, never run."""
        expired = [task.id for task in tasks if task.expired]
        self.stats.incr("expired", len(expired))
        logger.info(
            "claimer: %d task(s) expired before they started and were cancelled: %s",
            len(expired),
            ", ".join(map(str, expired)),
        )
        return [task for task in tasks if not task.expired]

    def _claim_limited(
        self, conn: psycopg.Connection, lane: _Lane, params: dict, want: int
    ) -> list[ClaimedTask]:
        """The claim of a lane with limited queues: lock them and claim, in one
        transaction; if the claim came back short, ask why. (Plain BEGIN and COMMIT:
        psycopg's transaction and pipeline objects cost more client CPU per claim than
        the two round trips they save on a local network.)"""
        lane.throttled_until = 0.0
        lane.snoozed = 0
        conn.execute("BEGIN")
        try:
            left_out: list[str] = []
            queues = {"queues": lane.lock_queues}
            if time.monotonic() < lane.lock_held_until:
                (locked,) = conn.execute(
                    QUERIES["try_lock_limited_queues"], queues
                ).fetchone()
                left_out = [q for q in lane.lock_queues if q not in locked]
            else:
                try:
                    conn.execute(
                        QUERIES["lock_limited_queues"], {**queues, "lock_timeout": LOCK_WAIT_MS}
                    )
                except psycopg.errors.LockNotAvailable:
                    # Held past LOCK_WAIT_MS: its holder is likely frozen in its claim.
                    conn.execute("ROLLBACK")
                    conn.execute("BEGIN")
                    lane.lock_held_until = time.monotonic() + LOCK_HELD_FOR
                    left_out = list(lane.lock_queues)
            if left_out:
                # Claim the rest now, and those again LANE_RECHECK later.
                self.stats.incr("claim_lock_busy")
                params = {**params, **lane.narrowed_to(left_out)}
            tasks = _fetch(conn, "claim", params)
            if lane.key_rated and (
                (len(tasks) < want and not (tasks and tasks[0].left_out))
                or (tasks and tasks[0].key_held)
            ):
                # Keys held rows back from a claim of routes with per-key rates: set aside
                # the head rows of keys out of budget (every walk would meet them again).
                snooze = {**params, "limit": SNOOZE_BATCH}
                (lane.snoozed,) = conn.execute(
                    QUERIES["snooze_throttled_keys"], snooze
                ).fetchone()
            conn.execute("COMMIT")
        except BaseException:
            if not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise
        cut = bool(tasks) and tasks[0].left_out > 0
        if len(tasks) < want and not cut and any(limit.rate for limit in lane.limits.values()):
            rows = conn.execute(QUERIES["limit_state"], lane.state_params).fetchall()
            lane.throttled_until = self._throttle_until(lane, rows)
        if left_out:
            soon = time.monotonic() + LANE_RECHECK
            lane.throttled_until = min(lane.throttled_until or soon, soon)
        return tasks

    def _throttle_until(self, lane: _Lane, rows: list[tuple]) -> float:
        """When a lane whose claim came back short should claim again (monotonic; 0:
        as usual): at the next start a rate budget allows, for a queue with backlog
        held back by its rate limit. A queue held back by its concurrency limit or a
        busy key is woken by the notification of the settlement that frees room."""
        now = time.monotonic()
        soonest = None
        for queue, backlog, running, rate_tat_in in rows:
            limit = lane.limits.get(queue)
            if not backlog or limit is None or limit.rate is None or rate_tat_in is None:
                continue
            if limit.concurrency is not None and running >= limit.concurrency:
                continue
            # The next start is allowed once rate_tat - burst tolerance has passed.
            next_in = rate_tat_in - (limit.rate.burst - 1) * limit.rate.interval
            if next_in > 0:
                soonest = next_in if soonest is None else min(soonest, next_in)
        if soonest is None:
            return 0.0
        self.stats.incr("rate_throttled")
        return now + soonest

    def _stage(self) -> None:
        """Make the due scheduled rows of this worker's queues pending."""
        self._stage_at = time.monotonic() + STAGE_INTERVAL
        while True:
            self.stats.incr("stage_statements")
            rows = self.session.call(
                lambda conn: conn.execute(
                    QUERIES["stage"], stage_params(self.queues, STAGE_BATCH)
                ).fetchall(),
                retry=False,
            )
            staged = sum(row[1] for row in rows)
            expired = sum(row[3] for row in rows)
            self.stats.incr("staged", staged)
            if expired:
                self.stats.incr("expired", expired)
                logger.info(
                    "stager: %d task(s) expired before they started and were cancelled",
                    expired,
                )
            if staged + expired < STAGE_BATCH:
                return

    def _adopt_unconfirmed(self) -> int:
        """Run the rows of claims whose reply was lost, if the server committed them."""
        now = time.monotonic()
        self._unconfirmed = {t: until for t, until in self._unconfirmed.items() if until > now}
        if not self._unconfirmed:
            return 0
        params = {"tokens": list(self._unconfirmed)}
        tasks = self.session.call(lambda conn: _fetch(conn, "find_claimed", params), retry=False)
        for task in tasks:
            self._unconfirmed.pop(task.lease_token, None)
        if tasks:
            logger.warning(
                "claimer: recovered %d task(s) from a claim whose reply was lost: %s",
                len(tasks),
                ", ".join(str(t.id) for t in tasks),
            )
            for lane in self._lanes:
                mine = [t for t in tasks if self._lane_of.get(t.route) is lane]
                self._hand_over(mine, lane, adopted=True)
        return len(tasks)

    def _hand_over(
        self,
        tasks: list[ClaimedTask],
        lane: _Lane,
        adopted: bool = False,
        first_starts: bool = False,
    ) -> None:
        """Give claimed tasks to their lane's slots. ``first_starts``: the claim came back
        short, so the worker has room; if a slot's thread is idle, the claimer waits (at
        most PICKUP_WAIT) until a slot has taken the first task, before its own work
        after a claim: the slot's thread then runs at once instead of waiting for the
        interpreter until the claimer's next statement (some 0.3 ms of an idle worker's
        wake-up)."""
        if not tasks:
            return
        if lane is self._both:  # a claim for both lanes: each task to its own
            for own in self._lanes:
                mine = [t for t in tasks if self._lane_of.get(t.route) is own]
                self._hand_over(mine, own, first_starts=first_starts)
            return
        tasks.sort(key=lambda t: (-t.priority, t.run_at, t.id))
        self.inflight.add(tasks)
        # Only while a slot's thread is idle: a task queued behind busy slots waits anyway.
        idle = first_starts and len(lane.pool.busy()) < lane.pool.size
        picked_up = tasks[0].picked_up = threading.Event() if idle else None
        lane.pool.submit(tasks, overflow=adopted)
        self.stats.incr("claimed", len(tasks))
        if picked_up is not None:
            picked_up.wait(PICKUP_WAIT)

    def _park_timeout(self) -> float:
        """Seconds to park: until the next scheduled task of our queues, the next start
        a rate limit allows, or a poll."""
        timeout = self.poll_interval * random.uniform(0.9, 1.1)
        now = time.monotonic()
        for lane in self._all_lanes:
            if lane.throttled_until > now:
                timeout = min(timeout, lane.throttled_until - now)
        self.stats.incr("next_due_statements")
        (seconds,) = self.session.call(
            lambda conn: conn.execute(QUERIES["next_due"], {"queues": self.queues}).fetchone(),
            retry=False,
        )
        self._nothing_scheduled = seconds is None
        if seconds is not None:
            seconds = max(0.0, seconds)
            self._stage_at = min(self._stage_at, time.monotonic() + seconds)
            timeout = min(timeout, seconds)
        return timeout


@dataclass(eq=False)
class _Lane:
    """Slots of one kind and the routes whose tasks run in them."""

    pool: SlotPool | AsyncSlots
    routes: list[tuple[str, int]]
    params: dict[str, object]
    # The limits of this lane's queues (QUEUE_LIMITS).
    limits: dict[str, QueueLimit] = field(default_factory=dict)
    short_at: float | None = None  # monotonic: its last claim came back short
    # monotonic: a rate limit allows this lane's next start then (0: not throttled)
    throttled_until: float = 0.0
    # Rows of keys out of their rate's budget set aside by this lane's last claim.
    snoozed: int = 0
    # monotonic: until then, claims only try the queues' lock (LOCK_HELD_FOR)
    lock_held_until: float = 0.0
    # route_params for some of the worker's queues, with this lane's routes (Claimer).
    narrowed: Callable[[list[str]], dict[str, object]] | None = None
    _narrowed: dict[frozenset[str], dict[str, object]] = field(default_factory=dict)

    def narrowed_to(self, left_out: list[str]) -> dict[str, object]:
        """The claim's parameters without the queues ``left_out`` (cached)."""
        key = frozenset(left_out)
        if key not in self._narrowed:
            assert self.narrowed is not None
            queues = [q for q in self.params["queues"] if q not in key]
            self._narrowed[key] = self.narrowed(queues)
        return self._narrowed[key]

    @property
    def key_rated(self) -> bool:
        """Some of this lane's routes have a per-key rate."""
        return any(r is not None for r in self.params["route_key_rate_intervals"])

    @property
    def lock_queues(self) -> list[str]:
        """The queues a claim of this lane locks first: limited, or with keyed routes."""
        return sorted({*self.params["limit_queues"], *self.params["keyed_queues"]})

    @property
    def state_params(self) -> dict[str, object]:
        """limit_state's parameters: this lane's limited queues and routes."""
        return {
            "queues": self.lock_queues,
            "route_queues": self.params["route_queues"],
            "route_names": self.params["route_names"],
            "route_versions": self.params["route_versions"],
        }

    @property
    def max_held(self) -> int:
        """Claims of this lane in flight (running, waiting for a slot, or waiting to be
        settled) past which it claims no more: see Claimer.max_held."""
        return self.pool.capacity + max(self.pool.size, 100)

    def recheck_in(self, now: float) -> float:
        """Seconds until this lane may be claimed into again (<= 0: now)."""
        if self.short_at is None:
            return 0.0
        return self.short_at + LANE_RECHECK - now


def route_params(
    queues: list[str],
    routes: list[tuple[str, int]],
    starvation_timeout: float,
    limits: dict[str, QueueLimit] | None = None,
    key_limits: dict[tuple[str, int], int] | None = None,
    *,
    claim_batch_bytes: int | None = None,
    key_rates: dict[tuple[str, int], Rate] | None = None,
    fair_routes: set[tuple[str, int]] | None = None,
) -> dict[str, object]:
    """The claim's parameters that name what a worker can take: every (queue, task
    name, version) it can run, with its per-key limit, and whether it is a fair task's
    (``fair_routes``: docs/tenants.md); its starvation escape (one
    starving task per queue may jump the priority order per tenth of the starvation
    timeout); the limits of its queues (``limits``: QUEUE_LIMITS); the rate of each
    keyed route's keys (``key_rates``: the task's own, else its queue's ``key_rate``);
    and the bytes one claim may load (CLAIM_BATCH_BYTES; None: no bound)."""
    limits = {q: limit for q, limit in (limits or {}).items() if q in queues}
    key_limits = key_limits or {}
    key_rates = key_rates or {}
    triples = [(queue, name, version) for queue in queues for name, version in routes]

    def key_rate(queue: str, name: str, version: int) -> Rate | None:
        if (name, version) in key_rates:
            return key_rates[(name, version)]
        limit = limits.get(queue)
        return limit.key_rate if limit and (name, version) in key_limits else None

    route_rates = [key_rate(*t) for t in triples]
    limited = sorted(q for q, limit in limits.items() if limit.concurrency or limit.rate)
    keyed = sorted({t[0] for t, rate in zip(triples, route_rates, strict=True)
                    if (t[1], t[2]) in key_limits or rate is not None})  # fmt: skip
    rates = [limits[q].rate for q in limited]
    return {
        "queues": list(queues),
        "route_queues": [t[0] for t in triples],
        "route_names": [t[1] for t in triples],
        "route_versions": [t[2] for t in triples],
        "route_key_limits": [key_limits.get((t[1], t[2])) for t in triples],
        "route_key_rate_intervals": [r.interval if r else None for r in route_rates],
        "route_key_rate_bursts": [r.burst if r else None for r in route_rates],
        "route_fair": [(t[1], t[2]) in (fair_routes or ()) for t in triples],
        "starvation_seconds": starvation_timeout,
        "escape_window_seconds": starvation_timeout / 10,
        "look_for_starving": True,
        "limit_queues": limited,
        "limit_concurrency": [limits[q].concurrency for q in limited],
        "limit_rate_intervals": [r.interval if r else None for r in rates],
        "limit_rate_bursts": [r.burst if r else None for r in rates],
        "keyed_queues": keyed,
        "claim_batch_bytes": claim_batch_bytes,
    }


def claim_statement(params: Mapping[str, Any]) -> str:
    """The claim statement for these parameters: when they name no limited queue, no
    route with a per-key concurrency or rate, and no starvation escape to look for
    (for those, claim reduces to it: claim.sql), ``claim_plain``, or ``claim_fair``
    if a route is a fair task's; else ``claim``."""
    plain = (
        not params["look_for_starving"]
        and not params["limit_queues"]
        and not params["keyed_queues"]
        and all(limit is None for limit in params["route_key_limits"])
        and all(rate is None for rate in params["route_key_rate_intervals"])
    )
    if not plain:
        return "claim"
    return "claim_fair" if any(params["route_fair"]) else "claim_plain"


def stage_params(queues: list[str], limit: int) -> dict[str, object]:
    """The stager's parameters: its queues, its batch, and FAIR_WEIGHTS (the places
    it gives fair tasks as they become due are spaced by their weights)."""
    weights = fair_weights()
    return {
        "queues": queues,
        "limit": limit,
        "fair_weight_keys": weights.patterns,
        "fair_weight_values": weights.values,
    }


def _fetch(conn: psycopg.Connection, query: str, params: dict) -> list[ClaimedTask]:
    with sql.execute(conn, query, params, row_factory=claimed_rows) as cursor:
        return cursor.fetchall()
