"""Reading a riffle mount from PyTorch: a plain Dataset and DataLoader, nothing rifflefs-specific.

    python3 pytorch_example.py /mnt/data/images/train              # shuffle=True, 8 workers
    python3 pytorch_example.py /mnt/data/images/train /mnt/data    # optional: a riffle plan per epoch

Without torch installed it does the same file walk and reads (8 threads, the same order).
"""
import os
import random
import subprocess
import sys
import tempfile
import time

try:
    from torch.utils.data import DataLoader, Dataset
except ImportError:  # no torch: the same walk and reads below, without the DataLoader
    DataLoader, Dataset = None, object


class ImageFiles(Dataset):
    """root/<class>/<file>, listed like torchvision's ImageFolder (sorted classes, sorted files)."""

    def __init__(self, root):
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [(os.path.join(root, c, f), label) for label, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            data = f.read()  # real images: decode here (PIL.Image.open, torchvision.io.decode_jpeg)
        return len(data), label


def set_plan(mount, paths):
    """Optional: tell riffle the epoch's order, so it fetches files before they are opened."""
    with tempfile.NamedTemporaryFile("w", suffix=".plan", delete=False) as f:
        f.write("\n".join(os.path.relpath(p, mount) for p in paths) + "\n")
    subprocess.run([os.environ.get("RIFFLE", "riffle"), "plan", mount, f.name], check=True)
    os.unlink(f.name)


def main(root, mount=None, epochs=2):
    dataset = ImageFiles(root)
    for epoch in range(epochs):
        start, order = time.monotonic(), list(range(len(dataset)))
        random.Random(epoch).shuffle(order)
        if mount:  # with a plan, the sampler must be the planned order
            set_plan(mount, [dataset.samples[i][0] for i in order])
        if DataLoader:
            shuffle = dict(sampler=order) if mount else dict(shuffle=True)
            loader = DataLoader(dataset, batch_size=32, num_workers=8, **shuffle)
            sizes = [int(s) for batch_sizes, _labels in loader for s in batch_sizes]
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(8) as pool:
                sizes = [size for size, _label in pool.map(dataset.__getitem__, order)]
        secs = time.monotonic() - start
        print(f"epoch {epoch}: {len(sizes)} samples, {sum(sizes)} bytes, {len(dataset.classes)} classes, "
              f"{secs:.2f} s, {len(sizes) / secs:.0f} samples/s ({'torch' if DataLoader else 'no torch'})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
