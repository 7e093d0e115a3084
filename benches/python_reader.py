#!/usr/bin/env python3
"""The Python reader of the rifflefs benchmarks: what a PyTorch DataLoader
does per file, in plain Python (standard library only).

N worker processes (multiprocessing, fork by default as on Linux) split the
epoch's files as a DataLoader splits its samples among workers: worker i
takes items i, i+N, i+2N, ... of the epoch's order. Each item is opened,
read whole and closed with

    with open(path, "rb") as f:
        data = f.read()

which is what a Dataset's __getitem__ does and what makes Python's own
per-file system calls (fstat, the isatty ioctl of open(), lseek, the read
sized from fstat and the read that finds the end) reach the file system.
Every file's size and CRC-32 (zlib.crc32) are checked.

The order and the expected bytes come from `riffle-bench plan`, which prints
exactly the order `riffle-bench read-fs` opens the files in (both call the
harness's one order function):

    riffle-bench plan --manifest M --seed S --epoch E [--max-files N] --crc32 --out E.tsv
    python3 benches/python_reader.py --root MNT --plan E.tsv --seed S --epoch E

`--crc32` adds each file's size and CRC-32, regenerated from the dataset's
content function (the manifest's own checksum, XXH3, is not in Python's
standard library). A plain plan (paths only) can be checked against a
separate `--sums` file instead: any `plan --crc32` output covering the
epoch's files, e.g. `--order listing`, computed once for several epochs
(benches/run.sh does that).

Prints one JSON object in the shape of `riffle-bench read-fs --json-out`
(files, bytes, reads, elapsed_s, files_per_s, mb_per_s, reads_per_s,
first_256_s, errors, mismatches, problems, ...) and writes it to --json-out.
Exit status: 0 when every file read right, 1 on any wrong byte, 2 on I/O
errors only, 3 when it could not run.

The clock starts once every worker is up and waiting (as read-fs starts
after making its threads), and stops when the last worker has read its last
file. The parent samples the machine's CPU ticks (/proc/stat: user + nice +
system + irq + softirq of every CPU) when the clock starts and once every
worker has reported, and with --daemon-pid the daemon's (/proc/PID/stat
utime + stime, all its threads), and reports them as read-fs does ("cpu":
ticks_per_s, machine_ticks, daemon_ticks; the harness's src/cpu.rs). Bytes are not sent back to the parent (a DataLoader would send decoded
samples; that cost is the same whatever the file system).

With `--loader torch` (only if PyTorch is installed) the same dataset is read
through torch.utils.data.DataLoader(batch_size=None, num_workers=N), whose
workers take the indices round-robin, as the plain loader does; its clock
includes the workers' start, as a training loop's epoch does.
"""

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
import zlib

MAX_PROBLEMS = 20
FIRST_N = 256


def machine_ticks():
    """Busy ticks of the whole machine since boot, or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] == "cpu":
                    v = [int(x) for x in parts[1:8]]
                    return v[0] + v[1] + v[2] + v[5] + v[6]
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_ticks(pid):
    """utime + stime of process `pid` (all its threads), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, ValueError, IndexError):
        return None


class CpuClock:
    """The machine's (and a daemon's) CPU ticks between start() and stop()."""

    def __init__(self, daemon_pid):
        self.pid = daemon_pid
        self.start_ticks = (None, None)
        self.use = None

    def start(self):
        self.start_ticks = (machine_ticks(), process_ticks(self.pid))

    def stop(self):
        (m0, d0), m1, d1 = self.start_ticks, machine_ticks(), process_ticks(self.pid)
        if m0 is None or m1 is None:
            return
        self.use = {"ticks_per_s": os.sysconf("SC_CLK_TCK"), "machine_ticks": max(m1 - m0, 0)}
        if d0 is not None and d1 is not None:
            self.use["daemon_ticks"] = max(d1 - d0, 0)


class Usage(Exception):
    """The reader cannot run (bad arguments or inputs): exit 3."""


def tab_lines(path):
    """(line number, tab-separated fields) of each non-empty line of a file."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line:
                yield n, line.split("\t")


def size_and_crc(parts, where):
    """The (size, crc32) of a PATH<TAB>SIZE<TAB>CRC32 line's fields."""
    try:
        return int(parts[1]), int(parts[2], 16)
    except ValueError as e:
        raise Usage(f"{where}: {e}") from None


def parse_sums(path):
    """PATH<TAB>SIZE<TAB>CRC32 lines of a file into {path: (size, crc)}."""
    sums = {}
    for n, parts in tab_lines(path):
        if len(parts) != 3:
            raise Usage(f"{path}:{n}: expected PATH<TAB>SIZE<TAB>CRC32")
        sums[parts[0]] = size_and_crc(parts, f"{path}:{n}")
    return sums


def load_items(plan_path, sums_path=None):
    """The epoch's items, in order: (relative path, size, crc32)."""
    sums = parse_sums(sums_path) if sums_path else {}
    items = []
    for n, parts in tab_lines(plan_path):
        if len(parts) == 3:
            size, crc = size_and_crc(parts, f"{plan_path}:{n}")
        elif len(parts) == 1:
            if parts[0] not in sums:
                raise Usage(
                    f"{plan_path}:{n}: {parts[0]}: no size and CRC-32 (give a "
                    "`riffle-bench plan --crc32` plan, or --sums)"
                )
            size, crc = sums[parts[0]]
        else:
            raise Usage(f"{plan_path}:{n}: expected PATH or PATH<TAB>SIZE<TAB>CRC32")
        items.append((parts[0], size, crc))
    return items


class Tally:
    """One worker's counts, like riffle-bench's Tally."""

    def __init__(self):
        self.files = 0
        self.bytes = 0
        self.reads = 0
        self.errors = 0
        self.mismatches = 0
        self.problems = []
        self.done = []  # time.monotonic() as each verified file completes

    def note(self, line):
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(line)

    def as_dict(self):
        return dict(self.__dict__)


def read_one(root, item, tally):
    """Opens, reads whole, closes and verifies one file (the DataLoader's
    __getitem__ without the decoding)."""
    rel, size, crc = item
    path = os.path.join(root, rel)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        tally.errors += 1
        tally.note(f"error: read {path}: {e}")
        return
    tally.reads += 1
    tally.bytes += len(data)
    got = zlib.crc32(data)
    if len(data) != size or got != crc:
        tally.mismatches += 1
        tally.note(
            f"WRONG BYTES: {path}: {len(data)} bytes, crc32 {got:08x}; "
            f"expected {size} bytes, {crc:08x}"
        )
    else:
        tally.files += 1
        tally.done.append(time.monotonic())


def worker(index, workers, root, items, ready, go, conn):
    """Worker `index` of `workers`: items index, index + workers, ..."""
    tally = Tally()
    try:
        ready.wait()
        go.wait()
        for i in range(index, len(items), workers):
            read_one(root, items[i], tally)
        result = tally.as_dict()
        result["end"] = time.monotonic()
        conn.send(result)
    finally:
        conn.close()


def run_plain(root, items, workers, start_method, cpu):
    """Reads `items` with `workers` processes; returns (tallies, t0, end).
    `cpu` (a CpuClock) is started with the clock and stopped once every
    worker has reported."""
    ctx = multiprocessing.get_context(start_method)
    ready = ctx.Barrier(workers + 1)
    go = ctx.Event()
    procs = []
    for i in range(workers):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=worker,
            args=(i, workers, root, items, ready, go, send),
            name=f"python-reader-{i}",
            daemon=True,
        )
        p.start()
        send.close()  # the child holds the only write end: EOF if it dies
        procs.append((i, p, recv))
    try:
        ready.wait(timeout=120)
    except threading.BrokenBarrierError as e:
        for _, p, _ in procs:
            p.terminate()
        raise Usage(f"the worker processes did not start ({e!r})") from None
    cpu.start()
    t0 = time.monotonic()
    go.set()
    tallies = []
    for i, p, recv in procs:
        try:
            tallies.append(recv.recv())
        except EOFError:
            p.join()
            lost = len(range(i, len(items), workers))
            t = Tally()
            t.errors = lost
            t.note(f"error: worker {i} exited (code {p.exitcode}) before reporting its {lost} files")
            d = t.as_dict()
            d["end"] = time.monotonic()
            tallies.append(d)
        recv.close()
    cpu.stop()
    for _, p, _ in procs:
        p.join()
    return tallies, t0, max(t["end"] for t in tallies)


class TorchFiles:
    """A map-style dataset over the epoch's items (for --loader torch; the
    DataLoader needs only __len__ and __getitem__)."""

    def __init__(self, root, items):
        self.root = root
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        t = Tally()
        read_one(self.root, self.items[i], t)
        return t.as_dict()


def identity(x):
    return x


def run_torch(root, items, workers, start_method, cpu):
    try:
        import torch.utils.data as tud
    except ImportError:
        raise Usage("--loader torch: PyTorch is not installed") from None

    loader = tud.DataLoader(
        TorchFiles(root, items),
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        multiprocessing_context=start_method if workers > 0 else None,
        collate_fn=identity,
    )
    cpu.start()
    t0 = time.monotonic()
    tallies = list(loader)
    end = time.monotonic()
    cpu.stop()
    return tallies, t0, end


def outcome(tallies, t0, end, items, args, cpu=None):
    """The read-fs-shaped JSON result (`cpu`: a CpuClock's use, or None)."""
    elapsed = max(end - t0, 1e-9)
    total = {k: sum(t[k] for t in tallies) for k in ("files", "bytes", "reads", "errors", "mismatches")}
    problems = [p for t in tallies for p in t["problems"]][:MAX_PROBLEMS]
    done = sorted(x for t in tallies for x in t["done"])
    first_n = min(FIRST_N, len(items))
    first = done[first_n - 1] - t0 if first_n > 0 and len(done) >= first_n else None
    out = {
        "tool": "python-reader",
        "pattern": "w1",
        "source": args.root,
        "threads": args.workers,
        "epoch": args.epoch,
        "seed": args.seed,
        "files": total["files"],
        "bytes": total["bytes"],
        "reads": total["reads"],
        "elapsed_s": elapsed,
        "files_per_s": total["files"] / elapsed,
        "mb_per_s": total["bytes"] / 1e6 / elapsed,
        "reads_per_s": total["reads"] / elapsed,
    }
    if first is not None:
        out["first_256_s"] = max(first, 0.0)
    out.update(
        {
            "errors": total["errors"],
            "mismatches": total["mismatches"],
            "problems": problems,
            "loader": f"{args.loader} ({args.start_method}, {args.workers} worker processes), "
            f"Python {sys.version.split()[0]}",
        }
    )
    if cpu is not None:
        out["cpu"] = cpu
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="DataLoader-like multi-process reader of a riffle-bench epoch plan",
    )
    ap.add_argument("--root", required=True, help="directory holding the dataset (a mount or a local copy)")
    ap.add_argument(
        "--plan",
        required=True,
        help="the epoch's files in reading order: `riffle-bench plan --crc32` "
        "(PATH<TAB>SIZE<TAB>CRC32) or a plain plan with --sums",
    )
    ap.add_argument("--sums", help="PATH<TAB>SIZE<TAB>CRC32 lines for a plain plan's paths")
    ap.add_argument("--workers", type=int, default=8, help="worker processes [8, like read-fs's threads]")
    ap.add_argument("--seed", type=int, default=0, help="the plan's --seed (recorded in the result)")
    ap.add_argument("--epoch", type=int, default=1, help="the plan's --epoch (recorded in the result)")
    ap.add_argument(
        "--start-method",
        choices=["fork", "spawn", "forkserver"],
        default="fork",
        help="multiprocessing start method [fork, the DataLoader's default on Linux]",
    )
    ap.add_argument(
        "--loader",
        choices=["plain", "torch"],
        default="plain",
        help="plain multiprocessing, or torch.utils.data.DataLoader (needs PyTorch) [plain]",
    )
    ap.add_argument(
        "--daemon-pid",
        type=int,
        help="the file system's daemon: its CPU over the epoch is reported beside the machine's",
    )
    ap.add_argument("--json-out", help="also write the JSON result here")
    args = ap.parse_args(argv)
    try:
        if args.workers < 1:
            raise Usage("--workers must be at least 1")
        if not os.path.isdir(args.root):
            raise Usage(f"{args.root} is not a directory (is the file system mounted?)")
        try:
            items = load_items(args.plan, args.sums)
        except OSError as e:
            raise Usage(str(e)) from None
        run = run_torch if args.loader == "torch" else run_plain
        cpu = CpuClock(args.daemon_pid)
        tallies, t0, end = run(args.root, items, min(args.workers, max(len(items), 1)), args.start_method, cpu)
    except Usage as e:
        print(f"python_reader.py: error: {e}", file=sys.stderr)
        return 3
    result = outcome(tallies, t0, end, items, args, cpu.use)
    text = json.dumps(result, separators=(",", ":"))
    print(text)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    for p in result["problems"]:
        print(p, file=sys.stderr)
    if result["mismatches"] > 0:
        print(f"python_reader.py: {result['mismatches']} files returned WRONG BYTES", file=sys.stderr)
        return 1
    if result["errors"] > 0:
        print(f"python_reader.py: {result['errors']} I/O errors", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
