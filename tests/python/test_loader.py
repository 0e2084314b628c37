# SPDX-License-Identifier: Apache-2.0
"""stoker.ImageLoader: the image job in one call, as a torchvision user writes it, with the
DataLoader's and StatefulDataLoader's conventions, and an exact resume at any world size."""

import collections

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import stoker

COUNT = 40
SIZE = 32


def picture(rng, height, width):
    """Smooth content with noise, as photographs have."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], axis=-1)
    return np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """COUNT JPEGs of 40 to 120 pixels a side in a folder per class (4 classes), and a list file
    whose label of each image is its own number: a batch's labels then say which images it holds."""
    root = tmp_path_factory.mktemp("loader")
    rng = np.random.default_rng(3)
    lines = []
    for i in range(COUNT):
        image = Image.fromarray(picture(rng, int(rng.integers(40, 120)), int(rng.integers(40, 120))))
        folder = root / "classes" / f"c{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"img{i:02d}.jpg", quality=90)
        lines.append(f"classes/c{i % 4}/img{i:02d}.jpg {i}")
    (root / "ids.txt").write_text("\n".join(lines) + "\n")
    return root


def loader(images, **options):
    options.setdefault("size", SIZE)
    options.setdefault("threads", 2)
    options.setdefault("batch_size", 8)
    options.setdefault("seed", 5)
    return stoker.ImageLoader(images / "ids.txt", **options)


def ids_and_images(batches):
    """{image id: its crop} from (images, labels) batches of the ids list."""
    out = {}
    for x, y in batches:
        for image, label in zip(x, y.tolist()):
            assert label not in out
            out[label] = image.clone()
    return out


def test_a_torchvision_user_s_loop_runs_unchanged(images):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * SIZE * SIZE, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train = stoker.ImageLoader(images / "classes", batch_size=8, size=SIZE, threads=2, drop_last=True)
    assert train.classes == ["c0", "c1", "c2", "c3"]
    assert len(train) == COUNT // 8
    steps = 0
    for epoch in range(2):
        train.set_epoch(epoch)
        for x, y in train:
            x, y = x.to("cpu", non_blocking=True), y.to("cpu", non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    assert steps == 2 * len(train)
    assert x.shape == (8, 3, SIZE, SIZE) and x.dtype == torch.float32 and y.dtype == torch.int64
    train.close()


def test_batches_are_normalized_as_torchvision_normalizes_them(images):
    """The evaluation path against torchvision's Resize + CenterCrop + ToTensor + Normalize of the
    same files: the same values but for the resize's rounding."""
    from torchvision import transforms
    tv = transforms.Compose([transforms.Resize(36), transforms.CenterCrop(SIZE), transforms.ToTensor(),
                             transforms.Normalize(stoker.IMAGENET_MEAN, stoker.IMAGENET_STD)])
    ours = loader(images, train=False, batch_size=COUNT, resize_size=36)
    x, y = next(iter(ours))
    assert y.tolist() == list(range(COUNT))  # evaluation: the list's order
    for i in (0, 7, 23):
        path = images / "classes" / f"c{i % 4}" / f"img{i:02d}.jpg"
        expected = tv(Image.open(path).convert("RGB"))
        assert (x[i] - expected).abs().mean() < 0.05
    # Natural-ish images come out centred and scaled: per-channel mean near 0, std near 1.
    train = torch.cat([x for x, _ in loader(images, batch_size=COUNT)])
    mean, std = train.mean(dim=(0, 2, 3)), train.std(dim=(0, 2, 3))
    assert mean.abs().max() < 0.7 and (std - 1).abs().max() < 0.6, (mean, std)
    ours.close()


def test_each_epoch_has_every_image_once_in_a_new_order_and_len_counts_its_batches(images):
    train = loader(images)
    assert len(train) == COUNT // 8
    first = [y.tolist() for _, y in train]
    second = [y.tolist() for _, y in train]
    for epoch in (first, second):
        assert sorted(sum(epoch, [])) == list(range(COUNT))
        assert len(epoch) == len(train)
    assert first != second
    assert train.epoch == 2
    train.set_epoch(0)  # epoch 0 again: the same batches
    assert [y.tolist() for _, y in train] == first
    odd = loader(images, batch_size=7)
    assert len(odd) == 6 and [len(y) for _, y in odd] == [7] * 5 + [5]
    assert len(loader(images, batch_size=7, drop_last=True)) == 5
    for t in (train, odd):
        t.close()


def test_the_same_seed_gives_the_same_batches_whatever_the_threads(images):
    a = [(x.clone(), y.clone()) for x, y in loader(images, threads=1)]
    b = [(x.clone(), y.clone()) for x, y in loader(images, threads=2)]
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    c = [y.tolist() for _, y in loader(images, seed=6)]
    assert c != [y.tolist() for _, y in a]


def test_loaders_that_share_a_budget_give_the_batches_they_give_alone(images):
    budget = stoker.ThreadBudget(1)
    assert budget.threads == 1 and repr(budget) == "ThreadBudget(threads=1)"
    assert stoker.ImageLoader(images / "ids.txt", budget=stoker.ThreadBudget(3)).threads == 3
    alone = [(x.clone(), y.clone()) for x, y in loader(images)]
    evaluation_alone = [y.clone() for _, y in loader(images, train=False)]
    train, evaluation = loader(images, budget=budget), loader(images, budget=budget, train=False)
    # One batch of the evaluation, then the whole training epoch while the evaluation waits
    # unconsumed (holding none of the one turn), then the rest of the evaluation.
    ev = iter(evaluation)
    evaluated = [next(ev)[1].clone()]
    shared = [(x.clone(), y.clone()) for x, y in train]
    evaluated += [y.clone() for _, y in ev]
    assert len(shared) == len(alone)
    for (xa, ya), (xs, ys) in zip(alone, shared):
        assert torch.equal(ya, ys) and torch.equal(xa, xs)
    assert [y.tolist() for y in evaluated] == [y.tolist() for y in evaluation_alone]
    train.close()
    evaluation.close()
    assert budget.running == 0 and budget.waiting == 0


def test_an_iteration_left_early_makes_the_next_one_the_next_epoch(images):
    train = loader(images)
    it = iter(train)
    next(it)
    del it
    assert sorted(sum((y.tolist() for _, y in train), [])) == list(range(COUNT))
    assert train.epoch == 2


def test_channels_last_is_torch_s_memory_format_with_the_same_values(images):
    planar = next(iter(loader(images, train=False)))[0]
    last = next(iter(loader(images, train=False, channels_last=True)))[0]
    assert last.shape == planar.shape
    assert last.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(last, planar)


def test_labels_int32_on_request_and_gray(images):
    x, y = next(iter(loader(images, labels=torch.int32, gray=True, mean=[0.45], std=[0.25])))
    assert y.dtype == torch.int32 and x.shape == (8, 1, SIZE, SIZE)


@pytest.mark.parametrize("world_before,world_after", [(1, 1), (2, 2), (2, 3), (3, 1)])
def test_a_resume_mid_epoch_goes_on_with_the_same_images_and_crops_at_any_world_size(
        images, world_before, world_after):
    """Ranks take batches in step; their states resume the epoch at another world size: the rest
    of the epoch is the images the uninterrupted run had still to give, each with the same crop."""
    whole = ids_and_images(loader(images, batch_size=4))  # world 1: every image, with its crop
    ranks = [loader(images, batch_size=2, rank=r, world_size=world_before, drop_last=True)
             for r in range(world_before)]
    iters = [iter(r) for r in ranks]
    taken = [next(it) for _ in range(2) for it in iters]  # two steps of every rank
    states = [r.state_dict() for r in ranks]
    assert all(s["taken"] == 2 * 2 * world_before for s in states)
    before = ids_and_images(taken)
    for r in ranks:
        r.close()

    resumed = [loader(images, batch_size=2, rank=r, world_size=world_after, drop_last=True)
               for r in range(world_after)]
    after = {}
    for r in resumed:
        r.load_state_dict(states[0])
        after.update(ids_and_images(r))
    assert not set(before) & set(after)
    left_out = COUNT - len(before) - len(after)
    assert 0 <= left_out < world_after * 2  # what does not divide into the ranks' steps
    for image_id, crop in {**before, **after}.items():
        assert torch.equal(crop, whole[image_id]), image_id
    assert all(r.epoch == 1 for r in resumed)  # the epoch after goes on as usual


def test_a_state_taken_at_an_epoch_s_end_resumes_at_the_next_epoch(images):
    train = loader(images)
    list(train)
    state = train.state_dict()
    assert state["epoch"] == 1 and state["taken"] == 0
    second = [y.tolist() for _, y in train]
    again = loader(images)
    again.load_state_dict(state)
    assert [y.tolist() for _, y in again] == second


def test_a_state_of_other_data_or_another_seed_is_refused_naming_what_differs(images):
    state = loader(images).state_dict()
    with pytest.raises(ValueError, match="seed"):
        loader(images, seed=9).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset"):
        stoker.ImageLoader(images / "classes", size=SIZE).load_state_dict(state)
    with pytest.raises(ValueError, match="not a state"):
        loader(images).load_state_dict({"epoch": 1})


def test_rank_and_world_come_from_torch_distributed_when_it_is_initialised(images, monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    train = loader(images, batch_size=2)
    assert (train.rank, train.world_size) == (1, 4)
    assert len(train) == COUNT // 4 // 2


def test_impossible_options_are_refused_naming_them(images, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        loader(images, batch_size=0)
    with pytest.raises(ValueError, match="rank 2 is not one of world_size 2"):
        loader(images, rank=2, world_size=2)
    with pytest.raises(ValueError, match="hflip"):
        loader(images, hflip=2)
    with pytest.raises(stoker.DataError, match="nothing"):
        stoker.ImageLoader(tmp_path / "nothing")
    if stoker.gpu.cuda_device_count() == 0:
        with pytest.raises(RuntimeError, match=r"device='cuda:0'|device='cuda'"):
            loader(images, device="cuda")
        with pytest.warns(UserWarning, match="pin_memory"):
            loader(images, pin_memory=True)


def test_a_damaged_file_is_an_error_naming_it_or_skipped_when_asked(images, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes((images / "classes" / "c0" / "img00.jpg").read_bytes()[:200])
    good = images / "classes" / "c1" / "img01.jpg"
    (tmp_path / "list.txt").write_text(f"{good} 0\n{bad} 1\n")
    with pytest.raises(stoker.StageError) as e:
        list(stoker.ImageLoader(tmp_path / "list.txt", size=SIZE, threads=1))
    assert isinstance(e.value.__cause__, stoker.DataError) and str(bad) in str(e.value.__cause__)
    kept = list(stoker.ImageLoader(tmp_path / "list.txt", size=SIZE, threads=1, on_error="skip"))
    assert [y.tolist() for _, y in kept] == [[0]]


@pytest.mark.skipif(stoker.gpu.cuda_device_count() == 0, reason="no CUDA device visible: the GPU half is skipped")
def test_on_cuda_batches_arrive_on_the_device_and_match_the_cpu_s(images):
    cpu = [(x, y) for x, y in loader(images, train=False)]
    gpu = [(x.cpu(), y.cpu()) for x, y in loader(images, train=False, device="cuda")]
    assert len(cpu) == len(gpu)
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert torch.equal(xc, xg) and torch.equal(yc, yg)
    x, y = next(iter(loader(images, device="cuda")))
    assert x.is_cuda and y.is_cuda and y.dtype == torch.int64


def test_the_docs_example_runs_as_written(images):
    import pathlib
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
    text = docs.read_text()
    marker = "<!-- tests/python/test_loader.py runs this example -->\n```python\n"
    code = text[text.index(marker) + len(marker):]
    code = code[:code.index("```")].replace('"train"', repr(str(images / "classes"))).replace("batch_size=64", "batch_size=8")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(4))
    scope = {"epochs": 2, "cuda": False, "device": "cpu", "model": model, "F": F}
    exec(compile(code, str(docs), "exec"), scope)
    assert scope["loader"].epoch == 2 and scope["x"].shape == (8, 3, 224, 224)
    assert scope["y"].dtype == torch.int64 and torch.isfinite(scope["loss"])


@pytest.mark.skipif(stoker.gpu.cuda_device_count() == 0, reason="no CUDA device visible: the GPU half is skipped")
def test_on_cuda_pinned_batches_copy_without_blocking_and_arrive_whole(images):
    cpu = [(x.clone(), y.clone()) for x, y in loader(images, train=False)]
    side = torch.cuda.Stream()
    copied = []
    with torch.cuda.stream(side):  # the loop's copies on a stream of its own
        for x, y in loader(images, train=False, pin_memory=True):
            assert x.is_pinned()
            torch.cuda._sleep(50_000_000)  # the copy queued behind other work
            copied.append((x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)))
    side.synchronize()
    for (xc, yc), (xg, yg) in zip(cpu, copied):
        assert torch.equal(xc, xg.cpu()) and torch.equal(yc, yg.cpu())


def test_set_epoch_after_an_iteration_left_early_gives_that_epoch_whole(images):
    train = loader(images)
    list(train)  # epoch 0
    it = iter(train)
    next(it)  # epoch 1, left after one batch
    del it
    train.set_epoch(1)
    again = [y.tolist() for _, y in train]
    assert len(again) == len(train) and sorted(sum(again, [])) == list(range(COUNT))


@pytest.fixture(scope="module")
def halves(images):
    """The ids list's images as two lists: ids 0-23 and 24-39 (labels are ids)."""
    lines = (images / "ids.txt").read_text().splitlines()
    (images / "first.txt").write_text("\n".join(lines[:24]) + "\n")
    (images / "second.txt").write_text("\n".join(lines[24:]) + "\n")
    return images / "first.txt", images / "second.txt"


def test_a_mixture_of_two_lists_gives_every_image_once_and_resumes_at_another_world_size(halves):
    first, second = halves
    mix = dict(size=SIZE, threads=2, seed=5, mix="all_exhausted")
    whole_loader = stoker.ImageLoader({first: 3, second: 1}, batch_size=4, **mix)
    assert len(whole_loader) == COUNT // 4
    assert "a mixture of 2 data sets of 24+16 images, all_exhausted" in repr(whole_loader)
    whole = ids_and_images(whole_loader)  # every image once, each with its crop
    assert sorted(whole) == list(range(COUNT))

    # One rank takes 3 steps of 2; two ranks go on from its state: the rest of the same draws.
    one = stoker.ImageLoader({first: 3, second: 1}, batch_size=2, drop_last=True, **mix)
    it = iter(one)
    before = ids_and_images([next(it) for _ in range(3)])
    state = one.state_dict()
    one.close()
    assert state["taken"] == 6
    after = {}
    for r in range(2):
        resumed = stoker.ImageLoader({first: 3, second: 1}, batch_size=2, drop_last=True, rank=r, world_size=2,
                                     **mix)
        resumed.load_state_dict(state)
        after.update(ids_and_images(resumed))
    assert not set(before) & set(after)
    assert len(before) + len(after) == COUNT - 2  # 34 draws left: 8 steps of 2 ranks x 2, 2 left out
    for image_id, crop in {**before, **after}.items():
        assert torch.equal(crop, whole[image_id]), image_id


def test_a_mixture_that_ends_at_the_first_exhausted_follows_its_weights_and_len_says_its_epoch(halves):
    first, second = halves
    loader = stoker.ImageLoader({first: 1, second: 1}, batch_size=1, size=SIZE, threads=2, seed=9)
    for epoch in range(2):
        n = len(loader)
        labels = [int(y) for _, y in loader]
        assert len(labels) == n
        assert len(set(labels)) == n  # no image twice
        small = sum(label >= 24 for label in labels)
        assert small == 16 or sum(label < 24 for label in labels) == 24  # one list used up: the end
        assert loader.epoch == epoch + 1
    with pytest.raises(ValueError, match="a mixture draws its images at random: it needs shuffle=True"):
        stoker.ImageLoader({first: 1, second: 1}, train=False)
    with pytest.raises(ValueError, match="stop"):
        stoker.ImageLoader({first: 1, second: 1}, mix="sometimes")
