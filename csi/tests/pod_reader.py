"""A training pod's reads of a CSI volume, for csi/tests/rollout.rs.

Usage: pod_reader.py ROOT MANIFEST STOP_FILE PROGRESS_FILE RESULT_FILE

MANIFEST is JSON: [[relative path, size, sha256 hex], ...]. Opens the first
file once at start and keeps it open for the whole run (a handle opened
before any restart). Then, until STOP_FILE exists, passes over every file:
open, read whole, close, compare with its digest; and pread the held file
and compare. After each pass it writes the number of passes done to
PROGRESS_FILE (atomically). At the end it writes RESULT_FILE: reads, failed
reads, wrong reads, the longest read in milliseconds and the first errors.
Runs in its own mount namespace with private propagation (rollout.rs starts
it under `unshare --mount --propagation private`), as kubelet's default.
"""

import hashlib
import json
import os
import sys
import time


def main():
    root, manifest_path, stop_file, progress_file, result_file = sys.argv[1:6]
    with open(manifest_path) as f:
        manifest = json.load(f)
    held_path, held_size, held_digest = manifest[0]
    held = os.open(os.path.join(root, held_path), os.O_RDONLY)
    reads = failed = wrong = passes = 0
    longest = 0.0
    errors = []

    def check(name, read):
        nonlocal reads, failed, wrong, longest
        start = time.monotonic()
        try:
            data = read()
        except OSError as e:
            failed += 1
            if len(errors) < 10:
                errors.append(f"{name}: {e}")
            return
        finally:
            longest = max(longest, time.monotonic() - start)
            reads += 1
        if hashlib.sha256(data).hexdigest() != digests[name]:
            wrong += 1
            if len(errors) < 10:
                errors.append(f"{name}: wrong bytes ({len(data)} bytes)")

    digests = {path: digest for path, _size, digest in manifest}
    digests["(held) " + held_path] = held_digest

    def read_whole(path):
        with open(os.path.join(root, path), "rb") as f:
            return f.read()

    while not os.path.exists(stop_file):
        for path, _size, _digest in manifest:
            check(path, lambda: read_whole(path))
        check("(held) " + held_path, lambda: os.pread(held, held_size + 1, 0))
        passes += 1
        tmp = progress_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(passes))
        os.replace(tmp, progress_file)
    os.close(held)
    result = {
        "passes": passes,
        "reads": reads,
        "failed": failed,
        "wrong": wrong,
        "longest_ms": round(longest * 1000, 1),
        "errors": errors,
    }
    tmp = result_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_file)


if __name__ == "__main__":
    main()
