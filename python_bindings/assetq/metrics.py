"""The metrics hook of the scheduler and worker loops: pass ``metrics=`` to
:func:`assetq.run_scheduler` and :func:`assetq.run_worker`.

:class:`Metrics` is the interface: one method per thing that happens, each doing nothing.
Subclass it and override what you export (a Prometheus counter, a StatsD timer, a log line).
The loops call it from their own threads, the worker from each of its slots at once, so a
method must be thread-safe and quick; an exception it raises ends the loop and propagates,
like one raised by ``on_run``. Durations are seconds, measured with ``time.monotonic``.
"""

from __future__ import annotations

from typing import Literal

from .api import Claim, Run

#: How an idle wait of a loop ended: ``woken`` by a notification (PostgreSQL), or ``polled``
#: (the poll interval, or the worker's idle backoff, ran out).
WaitOutcome = Literal["woken", "polled"]

#: How a worker's attempt ended: ``success``, ``failed`` (the handler or its completion
#: raised; recorded), or ``lost`` (the completion was refused, or could not be recorded).
AttemptOutcome = Literal["success", "failed", "lost"]


class Metrics:
    """Callbacks of :func:`assetq.run_scheduler` and :func:`assetq.run_worker`; every one
    does nothing until overridden."""

    # -- scheduler ---------------------------------------------------------------------

    def scheduler_pass(self, seconds: float, runs: int, events: int) -> None:
        """A pass committed: it took ``seconds`` (its own retries of transient errors
        included), created ``runs`` runs that consumed ``events`` events."""

    def scheduler_pass_failed(self, seconds: float, code: str | None) -> None:
        """A pass failed after its own retries (``code``: the database's or assetq's error
        code, when there is one); the loop retries it after a backoff."""

    def run_created(self, run: Run, latency: float | None) -> None:
        """A pass created ``run``, after its commit: a scheduler's, or a worker's own pass
        (``claim_runs(schedule=True)``) for a run that claim took, told after its attempt
        (a run a worker's pass made while its claim took an older one is not told).
        ``latency``: the run's ``created_at`` minus the timestamp of the oldest event it
        consumed, in seconds: how long the oldest event waited for a run (both clocks are
        the database's; None when the events could not be read). Reading them is one query
        per run, on a connection of its own after the pass, made only when ``metrics`` is
        given."""

    def scheduler_wait(self, outcome: WaitOutcome) -> None:
        """An idle scheduler's wait ended (it passes again next)."""

    # -- worker ------------------------------------------------------------------------

    def worker_claim(self, seconds: float, claimed: int) -> None:
        """A slot asked for a run and got ``claimed`` (0 or 1) in ``seconds``."""

    def worker_claim_failed(self, seconds: float, code: str | None) -> None:
        """A claim failed with a database error; the slot retries it after a backoff."""

    def worker_completed(
        self, claim: Claim, outcome: AttemptOutcome, run: Run | None, seconds: float
    ) -> None:
        """An attempt ended, ``seconds`` after it was claimed, handler and completion
        included. ``run`` is the run as recorded (None when ``lost``): a ``failed`` attempt
        with attempts left leaves it ``queued`` (a retry, see :meth:`worker_retry`)."""

    def worker_retry(self, claim: Claim, run: Run) -> None:
        """A failed attempt was recorded and the run will be tried again (attempts left):
        called after :meth:`worker_completed`."""

    def worker_wait(self, outcome: WaitOutcome) -> None:
        """An idle slot's wait ended (it asks for a run again next)."""
