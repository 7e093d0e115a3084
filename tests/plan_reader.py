#!/usr/bin/env python3
"""A training-style reader that follows an epoch plan, as docs/prefetch.md's PyTorch snippet does.

It lists the dataset like torchvision's ImageFolder (sorted classes, sorted files), orders the
indices like torch's DistributedSampler (a seeded shuffle per epoch, then every world-th index
from rank), writes that order as the epoch plan with `riffle plan`, and reads every file of
its share in that order. Prints one JSON line: files, bytes, seconds.
Usage: plan_reader.py RIFFLE MOUNT SEED EPOCH RANK WORLD [STARTUP_MS STEP_MS]

STARTUP_MS and STEP_MS (default 0) pace it like a trainer rather than a copy loop: the time
between `set_epoch` and the first batch (DataLoader workers starting) and the compute spent on
each sample. Without them it reads as fast as it can.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import time


def image_folder(root):
    samples = []
    for cls in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, cls))):
            for name in sorted(files):
                samples.append(os.path.relpath(os.path.join(dirpath, name), root))
    return samples


def sampler_order(n, seed, epoch, rank, world):
    indices = list(range(n))
    random.Random(seed + epoch).shuffle(indices)
    return indices[rank::world]


def main():
    riffle, mount, seed, epoch, rank, world = sys.argv[1:7]
    seed, epoch, rank, world = int(seed), int(epoch), int(rank), int(world)
    startup_s, step_s = (int(v) / 1000 for v in (sys.argv[7:9] + ["0", "0"])[:2])
    samples = image_folder(mount)
    order = [samples[i] for i in sampler_order(len(samples), seed, epoch, rank, world)]
    with tempfile.NamedTemporaryFile("w", suffix=".plan", delete=False) as plan:
        plan.write("\n".join(order) + "\n")
    subprocess.run([riffle, "plan", mount, plan.name], check=True, stdout=subprocess.DEVNULL)
    os.unlink(plan.name)
    time.sleep(startup_s)
    start = time.monotonic()
    total = 0
    for path in order:
        with open(os.path.join(mount, path), "rb") as f:
            total += len(f.read())
        time.sleep(step_s)
    print(json.dumps({"files": len(order), "bytes": total, "seconds": time.monotonic() - start}))


if __name__ == "__main__":
    main()
