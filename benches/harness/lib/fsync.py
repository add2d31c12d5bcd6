#!/usr/bin/env python3
"""The fsync time of a filesystem: median and p99 of small synced writes.

A durable commit waits for one such write, so the latency aims of the gateway bench add
this figure, measured on the ledger's own filesystem in the same run.

    fsync.py DIR [COUNT]   -> prints `fsync_p50_ms=… fsync_p99_ms=…`
"""
import os
import statistics
import sys
import tempfile
import time


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: fsync.py DIR [COUNT]")
    directory, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 500
    block = os.urandom(4096)
    fd, path = tempfile.mkstemp(dir=directory, prefix="fsync-probe.")
    try:
        times = []
        for i in range(count):
            # Overwrite in place, as a WAL append of one page would, then wait for it.
            os.pwrite(fd, block, (i % 64) * 4096)
            t = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"fsync_p50_ms={statistics.median(times):.3f} fsync_p99_ms={p99:.3f}")


if __name__ == "__main__":
    main()
