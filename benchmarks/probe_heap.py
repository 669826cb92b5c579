"""Run an ``rpr-mt`` command while printing, every 20 s on stderr, the process's resident memory and glibc's heap
(mallinfo2: the heap's size, the part of it in use, the part free but kept): it tells a growing working set from a
fragmented heap. Linux with glibc >= 2.33 only.

    python3 benchmarks/probe_heap.py train --config configs/multi30k_en_de_lit.yaml --set train.precision=bf16 \
        --set train.max_steps=300 --set train.run_dir=/tmp/probe --overwrite --no-progress
    PROBE_DEFAULT_MALLOC=1 python3 benchmarks/probe_heap.py train ...   # without rpr_mt.host.keep_freed_memory
    PROBE_TRIM=1 python3 benchmarks/probe_heap.py train ...             # malloc_trim(0) before each sample

Used for docs/benchmarks.md, "bf16 on a CPU with bfloat16 instructions" (Memory).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

MIB = 2**20


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def sample_forever(libc: ctypes.CDLL, trim: bool, every: float = 20.0) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    while True:
        if trim:
            start = time.perf_counter()
            libc.malloc_trim(0)
            print(f"probe: malloc_trim took {time.perf_counter() - start:.3f} s", file=sys.stderr)
        info = libc.mallinfo2()
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * page
        print(f"probe: resident {resident / MIB:,.0f} MiB | heap {info.arena / MIB:,.0f} MiB, in use "
              f"{info.uordblks / MIB:,.0f}, free {info.fordblks / MIB:,.0f} | mmapped {info.hblkhd / MIB:,.0f} MiB "
              f"({info.hblks} blocks)", file=sys.stderr, flush=True)
        time.sleep(every)


def main() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    if os.environ.get("PROBE_DEFAULT_MALLOC"):
        import rpr_mt.host  # the trainer imports it by name when it is first imported, below

        rpr_mt.host.keep_freed_memory = lambda: False
    threading.Thread(target=sample_forever, args=(libc, bool(os.environ.get("PROBE_TRIM"))), daemon=True).start()
    from rpr_mt.cli import main as rpr_mt_main

    sys.argv = ["rpr-mt", *sys.argv[1:]]
    rpr_mt_main()


if __name__ == "__main__":
    main()
