#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A PyTorch training loop on Fashion-MNIST, fed by a stoker pipeline or by
torch.utils.data.DataLoader doing the same crops.

    PYTHONPATH=build/python python3 examples/python/fashion_train.py --loader stoker
    PYTHONPATH=build/python python3 examples/python/fashion_train.py --loader dataloader --workers 2

Both loaders make the reference job's crops (docs/benchmarks.md): 5 random 24x24 crops of
each 28x28 image per epoch, each mirrored left-right with probability 0.5, normalized as
(x/255 - 0.2860)/0.3530, in batches of 255. stoker cuts them in C++ on its own threads and
hands each batch over through DLPack without a copy; the DataLoader's worker processes cut
one crop per __getitem__ and collate them into a new tensor. The model, the optimizer and
the loop are the same (those of apps/stoker-torch-example). docs/python.md shows the figures.

samples_per_s counts the training crops from just before the loader is made (stoker's
pipeline and the DataLoader's workers both start working as they are made) to the last step;
starvation_pct is the share of that time the loop spent waiting for its next batch.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import stoker

CROP, CROPS_PER_IMAGE, MIRROR_P = 24, 5, 0.5
MEAN, STD = 0.2860, 0.3530
SHUFFLE_CAPACITY, MIN_AFTER_DEQUEUE = 10_000, 2_000


class Net(torch.nn.Module):
    """conv 1->16 3x3, relu, maxpool 2, conv 16->32 3x3, relu, maxpool 2, linear 512->10."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3)
        self.conv2 = torch.nn.Conv2d(16, 32, 3)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


# ---------------------------------------------------------------------------------------------
# The two loaders. Each is an iterable of (samples float32 [n, 1, 24, 24], labels int64 [n])
# per epoch; it starts working when made.


def stoker_loader(train, args):
    pipe = (stoker.PipelineBuilder().threads(args.workers).seed(args.seed).epochs(args.epochs)
            .source("read", stoker.IdxReader(train))
            .flat_map("crops", stoker.RandomCrops(size=(CROP, CROP), count=CROPS_PER_IMAGE,
                                                  mirror=stoker.MirrorOptions(p=MIRROR_P)),
                      threads=args.workers)
            .shuffle("shuffle", capacity=SHUFFLE_CAPACITY, min_after_dequeue=MIN_AFTER_DEQUEUE)
            .batch("batch", args.batch_size, queue=8)
            .map("collate", stoker.Collate(normalize=stoker.Normalizer(scale=255, mean=[MEAN], std=[STD])),
                 threads=args.workers, queue=16)
            .build(labels="int64"))

    def epoch():
        for batch in pipe.epoch():  # no copy: the tensors are the batch's own buffer
            yield torch.from_dlpack(batch.samples), torch.from_dlpack(batch.labels)

    return pipe, epoch


class FashionCrops(torch.utils.data.Dataset):
    """Every crop of the training set: index i is a crop of image i // 5, at a random window,
    mirrored with probability 0.5, normalized, drawn from the worker's torch generator (which the
    DataLoader seeds per worker and per epoch)."""

    def __init__(self, images, labels):
        self.images = torch.from_numpy(images.copy())  # uint8 [N, 28, 28], shared with the workers
        self.labels = torch.from_numpy(labels.astype("int64"))

    def __len__(self):
        return len(self.labels) * CROPS_PER_IMAGE

    def __getitem__(self, i):
        image = i // CROPS_PER_IMAGE
        h, w = self.images.shape[1:]
        y = int(torch.randint(h - CROP + 1, ()))
        x = int(torch.randint(w - CROP + 1, ()))
        crop = self.images[image, y:y + CROP, x:x + CROP]
        if float(torch.rand(())) < MIRROR_P:
            crop = crop.flip(1)
        return ((crop.float() / 255 - MEAN) / STD).unsqueeze(0), self.labels[image]


def dataloader_loader(train, args):
    loader = torch.utils.data.DataLoader(
        FashionCrops(train.images, train.labels), batch_size=args.batch_size, shuffle=True,
        num_workers=args.workers, persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed))
    first = iter(loader)  # the workers start now, as stoker's pipeline does when built

    def epoch():
        nonlocal first
        it, first = (first or iter(loader)), None
        yield from it

    return None, epoch


# ---------------------------------------------------------------------------------------------


def test_set():
    """The test images center-cropped to 24x24 and normalized, whichever loader trained."""
    test = stoker.fashion_mnist(split="t10k")
    off = (test.shape.height - CROP) // 2
    x = torch.from_numpy(test.images[:, off:off + CROP, off:off + CROP].copy()).unsqueeze(1)
    return (x.float() / 255 - MEAN) / STD, torch.from_numpy(test.labels.astype("int64"))


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loader", choices=["stoker", "dataloader"], default="stoker")
    p.add_argument("--workers", type=int, default=os.cpu_count(),
                   help="stoker: the pipeline's threads and its crop and collate stages' bodies; "
                        "DataLoader: its worker processes (default: one per core)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=255)
    p.add_argument("--images", type=int, default=0, help="only the first N training images (0: all 60,000)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", choices=["train", "none", "take"], default="train",
                   help="none: only make each batch's tensors and read their first element, to measure the "
                        "loader alone; take: (stoker) only take each batch, to measure the pipeline and the "
                        "binding without torch")
    p.add_argument("--intra-op-threads", type=int, default=0,
                   help="PyTorch's intra-op threads for the model (0: its own default)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line")
    args = p.parse_args()
    if args.workers < (1 if args.loader == "stoker" else 0):
        p.error("--workers must be at least 1 for stoker, 0 for the DataLoader")
    if args.steps == "take" and args.loader != "stoker":
        p.error("--steps take is for the stoker loader")
    if args.epochs < 1 or not 1 <= args.batch_size <= SHUFFLE_CAPACITY - MIN_AFTER_DEQUEUE:
        p.error("--epochs must be at least 1 and --batch-size in [1, 8000]")

    if args.intra_op_threads:
        torch.set_num_threads(args.intra_op_threads)
    torch.manual_seed(args.seed)
    train = stoker.fashion_mnist(split="train")
    if args.images:
        train = stoker.IdxDataset(train.images[:args.images], train.labels[:args.images])
    training = args.steps == "train"
    test_x, test_y = test_set() if training else (None, None)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    t_run, cpu_run = time.perf_counter(), time.process_time()
    make = stoker_loader if args.loader == "stoker" else dataloader_loader
    pipe, epoch = make(train, args)
    samples = batches = 0
    waited = checksum = 0.0
    for e in range(args.epochs):
        if args.steps == "take":
            for batch in pipe.epoch():
                samples += batch.count
                batches += 1
            continue
        batches_of_epoch = epoch()
        if not training:  # the loader alone, its batches touched and nothing timed
            for x, y in batches_of_epoch:
                checksum += float(x.view(-1)[0])
                samples += len(y)
                batches += 1
            continue
        model.train()
        while True:
            t0 = time.perf_counter()
            xy = next(batches_of_epoch, None)
            waited += time.perf_counter() - t0
            if xy is None:
                break
            x, y = xy
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            samples += len(y)
            batches += 1
    seconds, cpu_seconds = time.perf_counter() - t_run, time.process_time() - cpu_run

    result = {
        "loader": args.loader, "workers": args.workers, "epochs": args.epochs, "steps": args.steps,
        "samples": samples, "batches": batches, "seconds": seconds,
        "cpu_seconds": cpu_seconds,  # this process's threads (not the DataLoader's worker processes)
        "samples_per_s": samples / seconds,
        "torch_version": torch.__version__, "intra_op_threads": torch.get_num_threads(),
    }
    if training:
        result["starvation_pct"] = 100 * waited / seconds
        result["test_accuracy"] = accuracy(model, test_x, test_y)
    else:
        result["checksum"] = checksum
    if pipe is not None:
        summary = pipe.summary()
        result["pipeline_consumer_wait_s"] = summary["consumer_wait_s"]
        pipe.stop()
    print(f"{args.loader}: {samples} samples in {seconds:.2f} s, {result['samples_per_s']:,.0f} samples/s"
          + (f", waiting for input {result['starvation_pct']:.1f}% of the time, test accuracy "
             f"{result['test_accuracy']:.4f}" if training else ""), file=sys.stderr)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
