# SPDX-License-Identifier: Apache-2.0
"""Remote tar shards from Python: stoker.RemoteOptions, its cache, and ImageLoader over a URL.

The server is a small one of this file's own (range requests, on 127.0.0.1): nginx, s3rver and
the fault proxy are tests/remote/serve.py's, for the C++ tests (ctest test_remote)."""
import http.server
import tarfile
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

COUNT = 12


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two tar shards of COUNT / 2 JPEGs each, with .cls labels id % 3."""
    root = tmp_path_factory.mktemp("www")
    rng = np.random.default_rng(3)
    for s in range(2):
        with tarfile.open(root / f"shard-{s}.tar", "w") as tar:
            for i in range(s * COUNT // 2, (s + 1) * COUNT // 2):
                jpg, cls = root / f"k{i:02d}.jpg", root / f"k{i:02d}.cls"
                Image.fromarray(rng.integers(0, 255, (40 + i, 50, 3), dtype=np.uint8)).save(jpg, quality=90)
                cls.write_text(str(i % 3))
                tar.add(jpg, arcname=jpg.name)
                tar.add(cls, arcname=cls.name)
    return root


@pytest.fixture(scope="module")
def server(shards):
    """http://127.0.0.1:PORT serving the shards' folder: HEAD, GET, and GET of one byte range."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.answer(head=True)

        def do_GET(self):
            self.answer(head=False)

        def answer(self, head):
            path = shards / self.path.lstrip("/")
            if not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            status, body, first, last = 200, data, 0, len(data) - 1
            if "Range" in self.headers:  # bytes=FIRST-LAST, as stoker asks
                first, last = (int(n) for n in self.headers["Range"].removeprefix("bytes=").split("-"))
                last = min(last, len(data) - 1)
                status, body = 206, data[first:last + 1]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            if status == 206:
                self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            self.end_headers()
            if not head:
                self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join()


def test_remote_options_spell_seconds_and_a_cache_and_refuse_half_a_cache(tmp_path):
    o = stoker.RemoteOptions(timeout=5, retries=2, cache_dir=tmp_path, cache_bytes=1 << 20)
    assert (o.timeout, o.retries, o.backoff, o.cache_dir, o.cache_bytes) == (5.0, 2, 0.1, tmp_path, 1 << 20)
    assert repr(o).startswith("stoker.RemoteOptions(timeout=5.0, retries=2, backoff=0.1, max_backoff=10.0")
    assert stoker.RemoteOptions().cache_dir is None and stoker.RemoteOptions().prefetch == 2
    assert stoker.RemoteOptions(max_bytes_in_flight=1 << 20).max_bytes_in_flight == 1 << 20
    with pytest.raises(ValueError, match="cache_dir and cache_bytes go together"):
        stoker.RemoteOptions(cache_dir=tmp_path)
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        stoker.RemoteOptions(timeout=-1)


def test_an_image_loader_over_a_url_through_a_cache_gives_the_local_batches_and_reads_epoch_2_from_disk(
        shards, server, tmp_path):
    remote = stoker.RemoteOptions(timeout=10, cache_dir=tmp_path / "cache", cache_bytes=1 << 30)
    common = dict(batch_size=4, size=32, seed=5, threads=2)
    local = stoker.ImageLoader([shards / "shard-0.tar", shards / "shard-1.tar"], **common)
    net = stoker.ImageLoader(server + "/shard-{0..1}.tar", remote=remote, **common)
    assert len(net) == len(local) == COUNT // 4
    # The shards have no index: each was fetched whole to be listed (a HEAD, the index's 404, the
    # fetch). No read after that is a request.
    assert net.dataset.remote_counts()["cache_fetches"] == 2
    assert net.dataset.remote_counts()["requests"] == 2 * 3
    for epoch in range(2):
        pairs = list(zip(local, net, strict=True))
        assert len(pairs) == COUNT // 4
        for (x, y), (u, v) in pairs:
            assert torch.equal(x, u) and torch.equal(y, v)
        counts = net.dataset.remote_counts()
        assert counts["requests"] == 2 * 3 and counts["cache_fetches"] == 2
        assert counts["cache_hits"] >= (epoch + 1) * COUNT  # and the next epoch's reads begun, maybe
    local.close()
    net.close()
    assert sorted(p.name.split("-", 1)[1] for p in (tmp_path / "cache").glob("*.tar")) == ["shard-0.tar",
                                                                                         "shard-1.tar"]


def test_a_shard_the_server_does_not_have_is_a_data_error_naming_its_url(server):
    url = server + "/shard-7.tar"
    with pytest.raises(stoker.DataError, match=f"{url}: the server answered HTTP 404"):
        stoker.ImageDataset.open(url, stoker.RemoteOptions(retries=0))
