#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A PyTorch training loop on a folder of images (a folder per class), fed by stoker's
ImageLoader or by torchvision's ImageFolder and DataLoader with the same transforms.

    stoker-make-data imagenet /tmp/inet --images 2000 --classes 10
    PYTHONPATH=build/python python3 examples/python/train_images.py /tmp/inet/train --loader stoker
    PYTHONPATH=build/python python3 examples/python/train_images.py /tmp/inet/train --loader torchvision

Both loaders do torchvision's standard training transforms (RandomResizedCrop(size), a flip with
p 0.5, ToTensor, Normalize with ImageNet's mean and std) on batches of --batch-size, shuffled,
with --workers threads (stoker) or worker processes (DataLoader, pin_memory when there is a GPU);
evaluation is Resize + CenterCrop on a held-out tenth of the images. The model is a small CNN
(--model cnn, for a machine of few cores) or torchvision's ResNet-18 (--model resnet18).

It prints images/s over the training epochs (from just before the loader is made to the last
step), the share of that time the loop waited for its next batch (starvation_pct), and the
held-out accuracy; --json puts them in one JSON object on the last line.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import stoker


class SmallCNN(torch.nn.Module):
    """Four conv-BN-ReLU blocks with pooling, global average pooling, a linear classifier."""

    def __init__(self, classes):
        super().__init__()
        layers, channels = [], 3
        for width in (16, 32, 64, 128):
            layers += [torch.nn.Conv2d(channels, width, 3, padding=1, bias=False), torch.nn.BatchNorm2d(width),
                       torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2)]
            channels = width
        self.features = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


def split(folder, held_out):
    """Image ids for training and evaluation: every `held_out`-th image of the folder is held out."""
    data = stoker.ImageDataset.from_folder(folder)
    ids = list(range(len(data)))
    test = ids[::held_out]
    train = [i for i in ids if i % held_out]
    return data, train, test


def stoker_loaders(data, train_ids, test_ids, args, device):
    common = dict(batch_size=args.batch_size, size=args.size, threads=args.workers, seed=args.seed, device=device)
    train = stoker.ImageLoader(data.subset(train_ids), train=True, drop_last=True, **common)
    test = stoker.ImageLoader(data.subset(test_ids), train=False, **common)
    return train, test


def torchvision_loaders(data, train_ids, test_ids, args, device):
    from torchvision import datasets, transforms
    normalize = transforms.Normalize(stoker.IMAGENET_MEAN, stoker.IMAGENET_STD)
    train_tf = transforms.Compose([transforms.RandomResizedCrop(args.size), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), normalize])
    test_tf = transforms.Compose([transforms.Resize(round(args.size * 256 / 224)), transforms.CenterCrop(args.size),
                                  transforms.ToTensor(), normalize])
    folder = args.folder
    train_set = torch.utils.data.Subset(datasets.ImageFolder(folder, train_tf), train_ids)
    test_set = torch.utils.data.Subset(datasets.ImageFolder(folder, test_tf), test_ids)
    pin = device.type == "cuda"
    common = dict(batch_size=args.batch_size, num_workers=args.workers, pin_memory=pin,
                  persistent_workers=args.workers > 0)
    train = torch.utils.data.DataLoader(train_set, shuffle=True, drop_last=True,
                                        generator=torch.Generator().manual_seed(args.seed), **common)
    test = torch.utils.data.DataLoader(test_set, shuffle=False, **common)
    return train, test


def accuracy(model, loader, device):
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return right / max(total, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a folder with a subfolder of images per class (torchvision's ImageFolder layout)")
    p.add_argument("--loader", choices=["stoker", "torchvision"], default="stoker")
    p.add_argument("--model", choices=["cnn", "resnet18"], default="cnn")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="stoker: the loader's threads; torchvision: the DataLoader's worker processes "
                        "(default: one per core)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=64, help="RandomResizedCrop's size (224 for ImageNet's)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--held-out", type=int, default=10, help="every N-th image is held out for evaluation")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--intra-op-threads", type=int, default=0, help="PyTorch's threads for the model (0: its default)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line")
    args = p.parse_args()
    if args.workers < (1 if args.loader == "stoker" else 0) or args.epochs < 1 or args.batch_size < 1:
        p.error("--workers must be at least 1 (stoker) or 0 (torchvision), --epochs and --batch-size at least 1")
    if args.intra_op_threads:
        torch.set_num_threads(args.intra_op_threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    try:
        data, train_ids, test_ids = split(args.folder, args.held_out)
    except stoker.DataError as e:
        sys.exit(f"train_images.py: {e}")
    classes = len(data.classes)
    model = (SmallCNN(classes) if args.model == "cnn" else __import__("torchvision").models.resnet18(num_classes=classes))
    model = model.to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    t_run, cpu_run = time.perf_counter(), time.process_time()
    make = stoker_loaders if args.loader == "stoker" else torchvision_loaders
    train, test = make(data, train_ids, test_ids, args, device)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, epochs=args.epochs, steps_per_epoch=len(train))
    images = steps = 0
    waited = 0.0
    for epoch in range(args.epochs):
        if hasattr(train, "set_epoch"):
            train.set_epoch(epoch)
        model.train()
        batches = iter(train)
        while True:
            t0 = time.perf_counter()
            xy = next(batches, None)
            waited += time.perf_counter() - t0
            if xy is None:
                break
            x, y = xy
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            images += len(y)
            steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - t_run, time.process_time() - cpu_run
    result = {
        "loader": args.loader, "model": args.model, "device": str(device), "workers": args.workers,
        "epochs": args.epochs, "batch_size": args.batch_size, "size": args.size, "classes": classes,
        "train_images": len(train_ids), "test_images": len(test_ids), "steps": steps,
        "images_per_s": images / seconds, "starvation_pct": 100 * waited / seconds,
        "seconds": seconds, "cpu_seconds": cpu_seconds,
        "test_accuracy": accuracy(model, test, device),
    }
    print(f"{args.loader}: {result['images_per_s']:.0f} images/s, the loop waited {result['starvation_pct']:.1f}% "
          f"of {seconds:.1f} s, held-out accuracy {result['test_accuracy']:.3f} ({classes} classes)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
