#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Measures what the Python module costs, and stoker against torch.utils.data.DataLoader, in one
run, each measurement a fresh process, the contenders interleaved (so that a machine whose load
changes treats them alike), medians of --repeats.

    PYTHONPATH=build/python python3 examples/python/bench.py \\
        --cpp build/apps/stoker-torch-example/stoker-torch-example [--repeats 5] [--workers 2] [--json]

binding: the reference job (docs/benchmarks.md) through the same pipeline, its batches taken as
  torch tensors without training: from C++ (stoker-torch-example --steps none: to_dlpack and
  at::fromDLPack) and from Python (fashion_train.py --steps none: torch.from_dlpack). The
  figure is Python's crops/s over C++'s.
training: fashion_train.py training its CNN for one epoch, fed by stoker and by the DataLoader
  (worker processes, the same crops): samples/s and the share of the loop spent waiting for
  input (starvation), for each.

The load average before and after is reported with the figures: other work on the machine
slows every contender, and the ratios are what to read.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "fashion_train.py")


def run(command):
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpp", required=True, help="the stoker-torch-example program")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=5, help="runs of each input-only contender")
    p.add_argument("--train-repeats", type=int, default=3, help="runs of each training contender (0: none)")
    p.add_argument("--intra-op-threads", type=int, default=0, help="PyTorch's, for the training runs")
    p.add_argument("--train-images", type=int, default=0,
                   help="train on the first N images only (0: all 60,000), for a shorter run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    py = [sys.executable, TRAIN, "--json", "--workers", str(args.workers)]
    load_before = os.getloadavg()

    cpp, python, taken = [], [], []
    contenders = [(cpp, [args.cpp, "--loader", "stoker", "--steps", "none", "--workers", str(args.workers), "--json"]),
                  (python, py + ["--loader", "stoker", "--steps", "none"]),
                  (taken, py + ["--loader", "stoker", "--steps", "take"])]
    for r in range(args.repeats):
        # Each round starts with the next contender: none always runs right after another.
        for runs, command in contenders[r % 3:] + contenders[:r % 3]:
            runs.append(run(command))
        for x in (cpp[-1], python[-1], taken[-1]):
            x["samples_per_cpu_s"] = x["samples"] / x["cpu_seconds"]
        print(f"binding {r + 1}/{args.repeats}: C++ {cpp[-1]['samples_per_s']:,.0f}, "
              f"Python {python[-1]['samples_per_s']:,.0f}, taken only {taken[-1]['samples_per_s']:,.0f} crops/s; "
              f"per CPU second {cpp[-1]['samples_per_cpu_s']:,.0f}, {python[-1]['samples_per_cpu_s']:,.0f} and "
              f"{taken[-1]['samples_per_cpu_s']:,.0f}", file=sys.stderr)
    trained = {"stoker": [], "dataloader": []}
    for r in range(args.train_repeats):
        for loader in (["stoker", "dataloader"] if r % 2 == 0 else ["dataloader", "stoker"]):
            trained[loader].append(run(py + ["--loader", loader, "--steps", "train",
                                             "--intra-op-threads", str(args.intra_op_threads),
                                             "--images", str(args.train_images)]))
            t = trained[loader][-1]
            print(f"training {r + 1}/{args.train_repeats}, {loader}: {t['samples_per_s']:,.0f} samples/s, "
                  f"starved {t['starvation_pct']:.1f}%, test accuracy {t['test_accuracy']:.3f}", file=sys.stderr)

    def median(runs, field):
        return statistics.median(x[field] for x in runs)

    result = {
        "suite": "python", "workers": args.workers, "cpus": os.cpu_count(), "train_images": args.train_images,
        "load_before": load_before, "load_after": os.getloadavg(),
        "binding": {
            "cpp_crops_per_s": median(cpp, "samples_per_s"),
            "python_crops_per_s": median(python, "samples_per_s"),
            "python_over_cpp": median(python, "samples_per_s") / median(cpp, "samples_per_s"),
            # The work each takes, all threads' CPU time in the timed window: less disturbed by
            # other work on the machine than the wall time.
            "cpp_crops_per_cpu_s": median(cpp, "samples_per_cpu_s"),
            "python_crops_per_cpu_s": median(python, "samples_per_cpu_s"),
            "python_over_cpp_per_cpu_s": median(python, "samples_per_cpu_s") / median(cpp, "samples_per_cpu_s"),
            "runs_cpp": [x["samples_per_s"] for x in cpp], "runs_python": [x["samples_per_s"] for x in python],
            "runs_cpp_per_cpu_s": [x["samples_per_cpu_s"] for x in cpp],
            "runs_python_per_cpu_s": [x["samples_per_cpu_s"] for x in python],
            # The batches only taken from Python, no torch: the pipeline and the binding alone.
            "taken_crops_per_s": median(taken, "samples_per_s"),
            "taken_crops_per_cpu_s": median(taken, "samples_per_cpu_s"),
            "taken_over_cpp_per_cpu_s": median(taken, "samples_per_cpu_s") / median(cpp, "samples_per_cpu_s"),
            "runs_taken_per_cpu_s": [x["samples_per_cpu_s"] for x in taken],
        },
    }
    if args.train_repeats:
        result["training"] = {
            loader: {"samples_per_s": median(runs, "samples_per_s"),
                     "starvation_pct": median(runs, "starvation_pct"),
                     "test_accuracy": median(runs, "test_accuracy"),
                     "runs_samples_per_s": [x["samples_per_s"] for x in runs],
                     "runs_starvation_pct": [x["starvation_pct"] for x in runs]}
            for loader, runs in trained.items()}
        result["training"]["stoker_over_dataloader"] = (result["training"]["stoker"]["samples_per_s"]
                                                         / result["training"]["dataloader"]["samples_per_s"])
    b = result["binding"]
    print(f"binding: Python {b['python_crops_per_s']:,.0f} crops/s, C++ {b['cpp_crops_per_s']:,.0f}: "
          f"{b['python_over_cpp']:.3f}; per CPU second {b['python_over_cpp_per_cpu_s']:.3f}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
