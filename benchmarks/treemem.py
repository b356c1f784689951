"""Wall time and peak memory of a command's whole process tree (Linux), without psutil.

`measure(argv)` starts the command (no shell), and while it runs samples every 50 ms the resident
set size of every process descending from it (/proc/PID/stat, ppid; /proc/PID/statm, resident
pages) and keeps the largest sum: the tree's peak, processes alive at the same time added up. It
also takes `resource.getrusage(RUSAGE_CHILDREN).ru_maxrss` (measured in a fresh helper process, so
it covers this command only): the largest single process's peak, exact but not summed. The peak
reported is the larger of the two.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Measured:
    wall: float  # seconds
    peak_mb: float  # max(sampled tree sum, largest single process), MB (1e6 bytes)
    returncode: int
    output: str


def _tree_rss(root: int) -> int:
    """Bytes resident in `root` and all its descendants, now."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parent[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/statm", encoding="ascii") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def _run_here(argv: list[str]) -> None:
    """In the helper process: run argv, sample its tree, print one JSON line (then its output)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _tree_rss(proc.pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, _ = proc.communicate(timeout=3600)
    done.set()
    thread.join(timeout=5)
    wall = time.perf_counter() - start
    single = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"wall": wall, "peak": max(peak[0], single), "returncode": proc.returncode}))
    sys.stdout.write(out.decode("utf-8", errors="replace"))


def measure(argv: list[str]) -> Measured:
    """Run argv in a fresh helper process (so RUSAGE_CHILDREN is this command's alone) and measure it."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.treemem", *argv], capture_output=True, timeout=3600,
                          check=False)
    text = proc.stdout.decode("utf-8", errors="replace")
    first, _, rest = text.partition("\n")
    data = json.loads(first)
    return Measured(float(data["wall"]), data["peak"] / 1e6, int(data["returncode"]), rest)


if __name__ == "__main__":
    _run_here(sys.argv[1:])
