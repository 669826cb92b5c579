"""Run an ``rpr-mt`` command while printing, every few seconds on stderr, the process's resident memory and glibc's
heap (mallinfo2: the heap's size, the part of it in use, the part free but kept): it tells a growing working set
from a fragmented heap. Linux with glibc >= 2.33 only.

    python3 benchmarks/probe_heap.py -- train --config configs/multi30k_en_de_lit.yaml --set train.precision=bf16 \\
        --set train.max_steps=300 --set train.run_dir=/tmp/probe --overwrite --no-progress
    python3 benchmarks/probe_heap.py --default-malloc -- train ...   # without rpr_mt.host.keep_freed_memory
    python3 benchmarks/probe_heap.py --trim -- train ...             # malloc_trim(0) before each sample

Used for docs/benchmarks.md, "bf16 on a CPU with bfloat16 instructions" (Memory).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_float  # noqa: E402

MIB = 2**20


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def sample_forever(libc: ctypes.CDLL, trim: bool, every: float) -> None:
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


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=positive_float, default=20.0, help="seconds between samples (default 20)")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before each sample")
    parser.add_argument("--default-malloc", action="store_true",
                        help="glibc's default allocator: skip rpr_mt.host.keep_freed_memory")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the rpr-mt command and its arguments, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the rpr-mt command to run after --, e.g. -- train --config configs/demo.yaml")
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        parser.error("needs glibc >= 2.33 (libc.so.6 with mallinfo2)")
    if args.default_malloc:
        import rpr_mt.host  # the trainer and translate import it by name when they are first imported, below

        rpr_mt.host.keep_freed_memory = lambda: False
    threading.Thread(target=sample_forever, args=(libc, args.trim, args.every), daemon=True).start()
    from rpr_mt.cli import main as rpr_mt_main

    sys.argv = ["rpr-mt", *command]
    try:
        rpr_mt_main()
    except SystemExit as done:  # typer's exit code, returned as every benchmark's main returns its own
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
