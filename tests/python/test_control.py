# SPDX-License-Identifier: Apache-2.0
"""Errors as Python exceptions, stop(), with blocks, Ctrl-C, resume and the summary."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import numpy as np
import pytest
import torch

import stoker

FASHION = stoker.Normalizer(scale=255, mean=[0.286], std=[0.353])


def test_a_missing_file_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(stoker.DataError) as e:
        stoker.fashion_mnist(tmp_path)
    assert str(tmp_path) in e.value.file
    assert str(e.value).startswith(e.value.file + ": ")
    assert isinstance(e.value, RuntimeError)


def test_bad_data_in_a_stage_is_a_stage_error_naming_the_stage_caused_by_a_data_error(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 4), np.uint8))
    (tmp_path / "b.npy").write_bytes(b"\x93NUMPY not really")
    pipe = stoker.PipelineBuilder().epochs(1).source("read", stoker.NpyReader.from_directory(tmp_path)).build()
    with pytest.raises(stoker.StageError) as e:
        list(pipe)
    assert e.value.stage == "read"
    assert "stage 'read' failed" in str(e.value)
    assert isinstance(e.value.__cause__, stoker.DataError)
    assert e.value.__cause__.file.endswith("b.npy")
    assert pipe.finished


def test_an_exception_in_a_python_stage_is_the_cause_of_the_stage_error(small):
    def check(batch):
        if len(batch) != 1000:
            raise ValueError(f"a short batch of {len(batch)}")
        return batch

    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.IdxReader(small))
            .batch("batch", 300)
            .map("check", check)
            .build())
    with pytest.raises(stoker.StageError) as e:
        next(iter(pipe))
    assert e.value.stage == "check"
    assert "ValueError: a short batch of 300" in str(e.value)
    cause = e.value.__cause__
    assert type(cause) is ValueError and str(cause) == "a short batch of 300"
    frames = traceback.extract_tb(cause.__traceback__)
    assert frames and frames[-1].name == "check"  # the traceback goes through the stage function


def test_on_error_skip_drops_the_item_and_counts_it(small):
    def odd_only(sample):
        if sample.id % 2 == 0:
            raise ValueError("even")
        return sample.id

    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.IdxReader(small))
            .map("odd", odd_only, on_error="skip")
            .build())
    assert sorted(pipe) == list(range(1, len(small), 2))
    odd = next(s for s in pipe.summary()["stages"] if s["name"] == "odd")
    assert odd["skipped"] == len(small) // 2


def endless(data):
    return (stoker.PipelineBuilder().threads(2)
            .source("read", stoker.IdxReader(data))
            .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=5), threads=2)
            .shuffle("shuffle", capacity=2000, min_after_dequeue=500)
            .batch("batch", 255)
            .map("collate", stoker.Collate(normalize=FASHION))
            .build())


def test_stop_ends_an_endless_run_and_next_then_gives_none(small):
    pipe = endless(small)
    assert pipe.next().count == 255
    started = time.monotonic()
    pipe.stop()
    assert time.monotonic() - started < 10
    assert pipe.finished
    assert pipe.next() is None
    pipe.stop()  # idempotent


def test_a_with_block_stops_the_pipeline_also_on_an_exception(small):
    with pytest.raises(KeyError):
        with endless(small) as pipe:
            for batch in pipe:
                raise KeyError("the training step failed")
    assert pipe.finished


def test_stop_waits_for_a_running_python_stage_which_may_take_the_gil(small):
    calls = []

    def slow(x):
        calls.append(x)
        time.sleep(0.01)
        return x

    with stoker.PipelineBuilder().threads(2).source("read", stoker.IdxReader(small)).map("slow", slow, threads=2) \
            .build() as pipe:
        assert pipe.next() is not None
    assert pipe.finished
    made = len(calls)
    time.sleep(0.2)
    assert len(calls) == made  # nothing runs after stop()


# A running pipeline whose Python stage holds the GIL while it runs and whose queues hold Python
# objects, then, by argv[1]: "drop" it (its bodies need the GIL to finish), or "exit" with it
# running (the interpreter must stop it while its stage can still take the GIL).
RUNNING = textwrap.dedent("""
    import sys, time
    import stoker

    def slow(sample):
        time.sleep(0.005)
        return sample.id

    pipe = (stoker.PipelineBuilder().threads(2)
            .source("read", stoker.SyntheticSource(count=10**6))
            .map("slow", slow, threads=2)
            .batch("batch", 10)
            .build())
    print(len(pipe.next()), flush=True)
    if sys.argv[1] == "drop":
        started = time.monotonic()
        del pipe
        print(f"dropped in {time.monotonic() - started:.3f} s", flush=True)
""")


@pytest.mark.parametrize("end", ["drop", "exit"])
def test_a_running_pipeline_with_a_python_stage_is_dropped_or_left_at_exit_cleanly(tmp_path, end):
    # In a process of its own: a deadlock there (one holding the GIL, which no timeout inside the
    # process can break) fails this test in bounded time.
    script = tmp_path / "running.py"
    script.write_text(RUNNING)
    done = subprocess.run([sys.executable, str(script), end], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "10"
    assert lines[1:] == ([] if end == "exit" else [lines[1]]) and all(x.startswith("dropped in ") for x in lines[1:])


def test_threads_that_share_a_pipeline_take_turns_and_get_every_item_once(small):
    pipe = stoker.PipelineBuilder().threads(2).epochs(1).source("read", stoker.IdxReader(small)).build()
    got = [[] for _ in range(4)]

    def consume(mine):
        for sample in pipe:
            mine.append(sample.id)

    threads = [threading.Thread(target=consume, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(sum(got, [])) == list(range(len(small)))


CTRL_C = textwrap.dedent("""
    import sys, time
    import stoker

    def slow(sample):  # one item per half second: the loop waits in next()
        time.sleep(0.5)
        return sample

    pipe = (stoker.PipelineBuilder().threads(2)
            .source("read", stoker.SyntheticSource(count=10**6))
            .map("slow", slow)
            .batch("batch", 1000)
            .build())
    try:
        with pipe:
            print("waiting", flush=True)
            for batch in pipe:
                print("got a batch", flush=True)
    except KeyboardInterrupt:
        print("interrupted; finished:", pipe.finished, flush=True)
        sys.exit(3)
""")


def test_ctrl_c_in_a_loop_that_waits_raises_keyboard_interrupt_and_stops_the_pipeline(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ))
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # well into next()'s wait
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 3, err
    assert "interrupted; finished: True" in out
    assert time.monotonic() - sent < 10  # a slice of 50 ms, and the stage's running call


def deterministic(data, state=None):
    b = (stoker.PipelineBuilder().threads(2).seed(3).epochs(2).deterministic()
         .source("read", stoker.IdxReader(data))
         .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=5, mirror=True), threads=2, fanout=5)
         .shuffle("shuffle", capacity=2000, min_after_dequeue=500)
         .batch("batch", 255)
         .map("collate", stoker.Collate(normalize=FASHION), threads=2))
    if state is not None:
        b.resume_from(state)
    return b.build()


def batches(pipe, n=None):
    out = []
    for epoch in pipe.epochs():
        for batch in epoch:
            out.append((torch.from_dlpack(batch.samples).clone(), torch.from_dlpack(batch.labels).clone()))
            if n is not None and len(out) == n:
                return out
    return out


def test_a_run_resumed_from_its_state_yields_what_the_whole_run_would(small):
    whole = batches(deterministic(small))
    first = deterministic(small)
    head = batches(first, n=50)  # into the second epoch
    state = first.state()
    assert json.loads(state)["epoch"] == 1
    first.stop()
    rest = batches(deterministic(small, state))
    assert len(head) + len(rest) == len(whole)
    for (x, y), (wx, wy) in zip(head + rest, whole):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_a_state_from_another_pipeline_is_refused(small):
    state = deterministic(small).state()
    with pytest.raises(stoker.StateError, match="seed"):
        (stoker.PipelineBuilder().seed(4).deterministic().resume_from(state)
         .source("read", stoker.IdxReader(small)).build())
    with pytest.raises(stoker.StateError):
        stoker.PipelineBuilder().resume_from("{not json")


def test_the_summary_is_a_dict_and_a_table(small):
    pipe = deterministic(small)
    n = sum(1 for _ in pipe.epoch())
    s = pipe.summary()
    assert s["consumed"] == n and s["threads"] == 2 and s["wall_s"] > 0
    assert 0 <= s["consumer_wait_s"] <= s["wall_s"]
    assert [st["name"] for st in s["stages"]] == ["read", "crops", "batch", "collate"]
    assert {q["name"] for q in s["queues"]} >= {"shuffle", "collate->consumer"}
    assert all(not st["python"] for st in s["stages"])
    assert "collate" in pipe.summary_table()
    pipe.stop()
