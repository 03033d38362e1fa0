"""Streaming host -> device upload: bounded chunks through two pinned staging buffers.

`Staging(rt, slot_bytes)` owns two page-locked host buffers and two device buffers of
`slot_bytes` each, one stream and one event per slot. `put(src, dst)` copies a chunk (host bytes,
e.g. a slice of the model's memory map, at most slot_bytes) into the next pinned slot, once that
slot's previous copy has left it (its event), and queues an async copy to `dst` (a device address)
or to the slot's device buffer (dst None: the caller then queues kernels that read it, on
`stream`, before the slot comes round again). While the GPU copies and dequantizes chunk i, the
host reads chunk i+1 from the map: host memory stays at 2 x slot_bytes whatever the file size.
A large chunk is read out of the map by READERS threads (its page faults in parallel).
`chunks(raw)` cuts a tensor's rows into slot-sized chunks for the paths' uploads
(minfer.cuda.paths: each path's `upload`); `split_rows` is the pure chunk splitter. The only module of the upload that touches pycuda.
"""

from __future__ import annotations

import numpy as np

from minfer.errors import GPUError

DEFAULT_CHUNK = 64 << 20  # bytes per chunk (the backend's chunk= for another; tests use tiny ones)
READERS = 4  # threads that read one chunk out of the map (page faults in parallel)


def split_rows(rows: int, row_bytes: int, chunk: int, multiple: int = 8) -> list[tuple[int, int]]:
    """[(first row, rows)] covering `rows` rows of `row_bytes` each in chunks of at most `chunk`
    bytes, each a whole number of `multiple` rows (but the last, the ragged rest); a chunk
    smaller than `multiple` rows still takes `multiple` (rows_per_chunk)."""
    per = rows_per_chunk(row_bytes, chunk, multiple)
    return [(r, min(per, rows - r)) for r in range(0, rows, per)]


def rows_per_chunk(row_bytes: int, chunk: int, multiple: int = 8) -> int:
    return max(multiple, int(chunk) // int(row_bytes) // multiple * multiple)


class Staging:
    """Two pinned host slots + two device slots of slot_bytes, one stream (module docstring)."""

    def __init__(self, rt, slot_bytes: int):
        drv = rt.drv
        self.rt, self.slot_bytes = rt, int(max(slot_bytes, 1))
        self.dev = [rt.alloc(self.slot_bytes, "weight upload staging") for _ in range(2)]
        try:
            self.host = [drv.pagelocked_empty((self.slot_bytes,), np.uint8) for _ in range(2)]
        except drv.Error as e:
            raise GPUError(
                f"pinned host staging of 2 x {self.slot_bytes >> 20} MiB failed ({e}): "
                "out of pinnable host memory"
            ) from None
        self.stream = drv.Stream()
        self.left = [drv.Event() for _ in range(2)]  # slot i's host bytes have been copied
        self.used = [False, False]
        self.i = 0
        self.nbytes = 0  # bytes put so far
        self.progress = None  # called with the bytes of each chunk chunks() hands out
        self.scratch: dict = {}  # device scratch the weight uploads reuse (paths' upload)
        self.channels = None  # weight -> kept input channels (blk-split's upload reads them;
        #                      GemmChoice.channels, set by the engine's load)
        self.pool = None
        if self.slot_bytes >= READERS << 20:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(READERS, thread_name_prefix="minfer-upload")

    def _read(self, host: np.ndarray, src: np.ndarray) -> None:
        """host[:] = src (the map's pages read in): split over the reader threads when large
        (numpy's copy releases the GIL; the page faults of a map run in parallel)."""
        n = host.size
        if self.pool is None or n < READERS << 20:
            np.copyto(host, src)
            return
        step = -(-n // READERS)
        list(
            self.pool.map(
                lambda o: np.copyto(host[o : o + step], src[o : o + step]), range(0, n, step)
            )
        )

    def put(self, src: np.ndarray, dst: int | None = None) -> int:
        """Queue src (host bytes, at most slot_bytes) -> dst (device address; None: the slot's
        device buffer). Returns the device address the chunk lands at."""
        drv = self.rt.drv
        n = int(src.nbytes)
        if n > self.slot_bytes:
            raise GPUError(f"upload chunk of {n} B over the {self.slot_bytes} B staging slot")
        s = self.i
        self.i ^= 1
        if self.used[s]:
            self.left[s].synchronize()  # the copy queued from this slot two chunks ago
        host = self.host[s][:n]
        self._read(host, src.reshape(-1).view(np.uint8))  # the host's read of the memory map
        to = int(self.dev[s]) if dst is None else int(dst)
        try:
            drv.memcpy_htod_async(to, host, self.stream)
            self.left[s].record(self.stream)
        except drv.Error as e:
            raise GPUError(f"weight upload copy of {n} B failed: {e}") from None
        self.used[s] = True
        self.nbytes += n
        return to

    def chunks(self, raw: np.ndarray):
        """(first row, rows, host bytes) of raw [N, row bytes] in chunks of whole rows that fit
        a slot (split_rows), the progress callback told of each."""
        for r0, n in split_rows(raw.shape[0], raw.shape[1], self.slot_bytes):
            yield r0, n, raw[r0 : r0 + n]
            if self.progress is not None:
                self.progress(n * raw.shape[1])

    def close(self) -> None:
        """Wait for everything queued, free the device slots and the uploads' scratch (the
        pinned ones go with self)."""
        if self.pool is not None:
            self.pool.shutdown()
        try:
            self.stream.synchronize()
        except self.rt.drv.Error as e:
            raise GPUError(f"GPU error during the weight upload: {e}") from None
        for d in self.dev:
            d.free()
        self.dev = []
        for a in self.scratch.values():
            a.gpudata.free()
        self.scratch = {}
