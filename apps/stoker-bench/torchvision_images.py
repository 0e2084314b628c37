#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The image job the way a PyTorch user writes it, for stoker-bench images to compare against.

--loader torchvision (the default): an ImageFolder-style data set on a list file of `path label`
lines (or torchvision's ImageFolder on a class folder), images opened with PIL and converted to RGB
as torchvision's default loader does, RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
Normalize(ImageNet's mean and std), and a DataLoader(batch_size=256, shuffle=True, num_workers=N,
persistent_workers=True, pin_memory as asked).

--loader stoker: the same job in one call, stoker.ImageLoader(data, batch_size, threads=N,
pin_memory as asked), which gives the same (images, labels) torch tensors; needs the stoker module
on the path (PYTHONPATH=build/python, or installed).

Each epoch is timed from asking the loader for its first batch to receiving its last, after an
untimed warm-up epoch; the figure is images per second.

    /usr/bin/python3 torchvision_images.py --data data/inet/train.txt --workers 2 --epochs 5 --json

Needs Debian's python3-torch and python3-torchvision (run it with /usr/bin/python3).
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a list file of `path label` lines, or a class folder")
    p.add_argument("--workers", type=int, default=1, help="DataLoader's num_workers (at least 1)")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs; the figure is their median")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed epochs first (the process's first epoch pays for lazy imports and first touches)")
    p.add_argument("--images", type=int, default=0, help="use the first N images (0: all)")
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's size")
    p.add_argument("--batch", type=int, default=256, help="batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loader", choices=["torchvision", "stoker"], default="torchvision")
    p.add_argument("--pin-memory", action="store_true", help="pin_memory=True (it does nothing without a GPU)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line")
    args = p.parse_args()
    if args.workers < 1 or args.epochs < 1 or args.images < 0 or args.size < 1 or args.batch < 1 or args.warmup < 0:
        p.error("--workers, --epochs, --size and --batch must be at least 1, --images and --warmup at least 0")
    return args


def main():
    args = parse_args()
    try:
        import PIL
        import torch
        import torchvision
        from PIL import Image
        from torch.utils.data import DataLoader, Dataset
        from torchvision import transforms
    except ImportError as e:
        sys.exit(f"torchvision_images.py: {e}: install python3-torch and python3-torchvision, run /usr/bin/python3")

    def pil_loader(path):  # torchvision.datasets.folder.pil_loader
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")

    class ImageList(Dataset):
        """ImageFolder's behaviour on a list file: paths relative to the list's folder."""

        def __init__(self, list_path, transform):
            root = os.path.dirname(os.path.abspath(list_path))
            self.samples = []
            with open(list_path) as f:
                for number, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    path, _, label = line.rpartition(" ")
                    if not path or not label.isdigit():
                        sys.exit(f"torchvision_images.py: {list_path}: line {number}: expected '<path> <label>'")
                    self.samples.append((os.path.join(root, path), int(label)))
            self.transform = transform

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, label = self.samples[i]
            return self.transform(pil_loader(path)), label

    transform = transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    if args.loader == "stoker":
        try:
            import stoker
        except ImportError as e:
            sys.exit(f"torchvision_images.py: {e}: put stoker on the path (PYTHONPATH=build/python)")
        data = stoker.ImageDataset.open(args.data)
        if args.images:
            data = data.subset(list(range(min(args.images, len(data)))))
        loader = stoker.ImageLoader(data, batch_size=args.batch, size=args.size, threads=args.workers,
                                    seed=args.seed, pin_memory=args.pin_memory)
        name = "stoker_python_loader"
        pipeline = ("stoker.ImageLoader(data, batch_size=%d, size=%d, threads=%d, pin_memory=%s)"
                    % (args.batch, args.size, args.workers, args.pin_memory))
        versions = {"torch": torch.__version__, "stoker": stoker.__version__}
    else:
        if os.path.isdir(args.data):
            data = torchvision.datasets.ImageFolder(args.data, transform=transform)
        else:
            data = ImageList(args.data, transform)
        if args.images:
            data = torch.utils.data.Subset(data, range(min(args.images, len(data))))
        torch.manual_seed(args.seed)
        loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                            persistent_workers=True, pin_memory=args.pin_memory)
        name = "torchvision_dataloader"
        pipeline = ("PIL open + convert('RGB'), RandomResizedCrop(%d), RandomHorizontalFlip(), ToTensor(), "
                    "Normalize(ImageNet), DataLoader(batch_size=%d, shuffle=True, num_workers=%d, "
                    "persistent_workers=True, pin_memory=%s)" % (args.size, args.batch, args.workers, args.pin_memory))
        versions = {"torch": torch.__version__, "torchvision": torchvision.__version__, "pil": PIL.__version__}

    rates = []
    for epoch in range(-args.warmup, args.epochs):
        images = 0
        touched = 0.0
        t0 = time.perf_counter()
        for batch, labels in loader:
            assert batch.dtype == torch.float32 and batch.shape[1:] == (3, args.size, args.size)
            images += labels.shape[0]
            touched += float(batch[0, 0, 0, 0])
        seconds = time.perf_counter() - t0
        if images != len(data):
            sys.exit(f"torchvision_images.py: an epoch delivered {images} images of {len(data)}")
        what = f"warm-up epoch {epoch + args.warmup + 1}/{args.warmup}" if epoch < 0 else f"epoch {epoch + 1}/{args.epochs}"
        print(f"{what}: {images} images in {seconds:.2f} s, {images / seconds:.1f} images/s", file=sys.stderr)
        if epoch >= 0:
            rates.append(images / seconds)

    result = {
        "name": name,
        "workers": args.workers,
        "images": len(data),
        "images_per_s_median": statistics.median(rates),
        "images_per_s_min": min(rates),
        "images_per_s_max": max(rates),
        "samples": rates,
        "versions": versions,
        "pipeline": pipeline,
    }
    print(f"median {result['images_per_s_median']:.1f} images/s with {args.workers} workers")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
