"""GPU time between named stages of a forward: CUDA events recorded on the engine's stream after each stage.

An engine given a `Timeline` calls `begin()` before its first kernel and `mark(stage)` after each stage's last one;
inside a captured CUDA graph the events are recorded as external events (`minfer_cli.measure.graph.record_event`), so
they become event-record nodes that every replay re-records. After the
stream is synchronised, `stage_times()` attributes each interval between consecutive events to the stage that
ended it. An event between two kernels keeps a programmatic dependent launch from starting early, so the stages'
sum is the step with that overlap removed: a breakdown, not the timed figure.
"""

from __future__ import annotations


class Timeline:
    """Events on ``stream`` (a numba stream) between the stages of one forward."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self._events: list[tuple[str, object]] = []

    def begin(self) -> None:
        """Start a forward: forget the previous one's events and record the start."""
        from numba import cuda

        start = cuda.event()
        self._record(start)
        self._events = [("", start)]

    def mark(self, stage: str) -> None:
        """Record the end of ``stage`` (the work enqueued since the previous mark or `begin`)."""
        from numba import cuda

        if not self._events:
            raise RuntimeError("Timeline.mark before begin")
        event = cuda.event()
        self._record(event)
        self._events.append((stage, event))

    def _record(self, event) -> None:
        from numba import config

        if config.ENABLE_CUDASIM:  # the simulator has no driver and no capture
            event.record(self.stream)
        else:
            from minfer_cli.measure.graph import record_event

            record_event(event, self.stream)

    def stage_times(self) -> list[tuple[str, float, int]]:
        """(stage, µs, intervals) per stage of the last recorded forward, in first-seen order; call after the
        stream is synchronised (the CUDA simulator's events give -1 ms an interval)."""
        totals: dict[str, list] = {}
        for (_, a), (stage, b) in zip(self._events, self._events[1:]):
            entry = totals.setdefault(stage, [0.0, 0])
            entry[0] += 1000.0 * a.elapsed_time(b)
            entry[1] += 1
        return [(stage, us, n) for stage, (us, n) in totals.items()]


def mean_stage_times(runs: list) -> list[tuple[str, float, float]]:
    """(stage, mean µs, mean intervals) over ``runs``, each one forward's `Timeline.stage_times`, in first-seen
    order."""
    totals: dict[str, list] = {}
    for run in runs:
        for stage, us, count in run:
            entry = totals.setdefault(stage, [0.0, 0])
            entry[0] += us
            entry[1] += count
    return [(stage, us / len(runs), count / len(runs)) for stage, (us, count) in totals.items()]
