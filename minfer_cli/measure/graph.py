"""CUDA graphs through the driver API (`cuda.bindings`): the one place minfer captures, replays and frees them.

Used by the timer (`minfer_cli.measure.timing.ArmTimer`: batches of launches between two events) and by the
engines (`minfer_cli.engine.forward.PrefillEngine` with PGRAPH=1, `minfer_cli.engine.decode.DecodeEngine` with
GRAPHS=1). numba-cuda has no graph API; its streams and events expose their handles, which the driver calls take.
Not available in the CUDA simulator.
"""

from __future__ import annotations

from typing import Callable


def driver():
    """The `cuda.bindings.driver` module."""
    from cuda.bindings import driver as drv

    return drv


def cuda_check(result, what: str):
    """A `cuda.bindings` call's return value ``(CUresult, *values)`` without its code: None, the one value or the
    tuple of values. Raises RuntimeError naming ``what`` on a code other than CUDA_SUCCESS."""
    err = result[0]
    if err != driver().CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def record_event(event, stream) -> None:
    """Record ``event`` (a numba event) on ``stream`` (a numba stream). Inside a stream capture it is recorded as an
    external event (CU_EVENT_RECORD_EXTERNAL): an event-record node that every replay records, so the host can time
    between two such nodes (a plain record inside a capture only orders work within the graph and is never
    recorded, leaving the event unusable for `elapsed_time`). Outside a capture (where the driver refuses that flag)
    a plain record."""
    drv = driver()
    handle, hstream = drv.CUevent(int(event.handle)), drv.CUstream(int(stream.handle))
    status = cuda_check(drv.cuStreamIsCapturing(hstream), "cuStreamIsCapturing")
    if status == drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        cuda_check(drv.cuEventRecordWithFlags(handle, hstream, drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL),
                   "cuEventRecordWithFlags")
    else:
        cuda_check(drv.cuEventRecord(handle, hstream), "cuEventRecord")


class StreamGraph:
    """The work ``enqueue()`` puts on ``stream`` (a numba stream), captured once (thread-local capture mode, numba's
    deferred frees held back so none runs inside the capture) and instantiated; `launch` replays it on a stream,
    `close` frees it. Everything the work reads and writes must stay allocated while the graph lives. Raises
    RuntimeError when capture or instantiation fails (the stream is left out of capture mode)."""

    def __init__(self, stream, enqueue: Callable[[], None]):
        from numba import cuda

        drv = driver()
        handle = drv.CUstream(int(stream.handle))
        with cuda.defer_cleanup():
            cuda_check(drv.cuStreamBeginCapture(handle, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                       "cuStreamBeginCapture")
            try:
                enqueue()
            finally:
                graph = cuda_check(drv.cuStreamEndCapture(handle), "cuStreamEndCapture")
        try:
            self._exec = cuda_check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except RuntimeError:
            drv.cuGraphDestroy(graph)
            raise
        self.graph, self.stream = graph, stream

    def nodes(self) -> int:
        """Kernel, memcpy, memset and event nodes in the graph."""
        return int(cuda_check(driver().cuGraphGetNodes(self.graph, 0), "cuGraphGetNodes")[1])

    def launch(self, stream=None, times: int = 1) -> None:
        """Enqueue ``times`` replays on ``stream`` (default: the capture stream). No sync."""
        drv = driver()
        handle = drv.CUstream(int((stream or self.stream).handle))
        for _ in range(times):
            cuda_check(drv.cuGraphLaunch(self._exec, handle), "cuGraphLaunch")

    def close(self) -> None:
        """Free the graph (idempotent)."""
        if self._exec is not None:
            drv = driver()
            drv.cuGraphExecDestroy(self._exec)
            drv.cuGraphDestroy(self.graph)
            self._exec = self.graph = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
