#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Runs a test program beside real servers on loopback, and stops them when it ends.

    serve.py [--max-seconds S] [--s3rver PATH] -- PROGRAM [ARG...]

Starts, in a temporary folder whose `root/` they serve:
  - nginx (Debian's nginx-light) over http and over https (a self-signed certificate for
    127.0.0.1, made with openssl), with range requests as nginx answers them;
  - a fault proxy of this script's own in front of nginx's http, which does to a request what the
    first part of its path says (below);
  - with --s3rver, s3rver (npm's s3rver, run with node) over http, with an empty bucket
    "stoker-test", access key id S3RVER, secret S3RVER;
and runs PROGRAM with these in its environment:
  STOKER_TEST_ROOT   the folder the servers serve (the program writes its files there)
  STOKER_TEST_HTTP   http://127.0.0.1:PORT     (nginx)
  STOKER_TEST_HTTPS  https://127.0.0.1:PORT    (nginx)
  STOKER_TEST_CA     the certificate's PEM file
  STOKER_TEST_PROXY  http://127.0.0.1:PORT     (the fault proxy)
  STOKER_TEST_S3     http://127.0.0.1:PORT     (s3rver; its endpoint, for AWS_ENDPOINT_URL)

The proxy's faults, by the first part of the path (the rest is the file's path in the root):
  /ok/...          passed on
  /503xN/...       the first N requests for each (path, range) are answered 503, later ones passed on
  /dropxN/...      the first N: the status, the headers and half the body, then the connection closed
  /stallxN/...     the first N: no answer for --stall seconds, then the connection closed
  /norange/...     the Range header dropped: the whole file, answered 200
  /always503/...   every request answered 503
  /short/...       every answer's body cut to half its Content-Length
  /rangestall/...  requests with a Range header: no answer for --stall seconds, then the
                   connection closed
  /rangeslow/...   requests with a Range header answered 0.5 s late (readers that overlap)
  /rangehalf/...   requests with a Range header answered with the first half of the range only,
                   Content-Length and Content-Range saying so (a well-formed answer, too short)

Every server listens on 127.0.0.1 only, and is stopped when PROGRAM ends, or after --max-seconds
(PROGRAM is then killed too). The exit status is PROGRAM's.
"""
import argparse
import http.client
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, process, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  sendfile on;
  default_type application/octet-stream;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  server {{ listen 127.0.0.1:{http}; root {root}; }}
  server {{
    listen 127.0.0.1:{https} ssl;
    ssl_certificate {tmp}/cert.pem;
    ssl_certificate_key {tmp}/key.pem;
    root {root};
  }}
}}
"""


def start_nginx(tmp, root):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/key.pem",
                    "-out", f"{tmp}/cert.pem", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    for _ in range(5):  # a port taken between free_port() and nginx's bind: try others
        ports = {"http": free_port(), "https": free_port()}
        with open(f"{tmp}/nginx.conf", "w") as f:
            f.write(NGINX_CONF.format(tmp=tmp, root=root, **ports))
        nginx = subprocess.Popen(["nginx", "-p", tmp, "-c", f"{tmp}/nginx.conf", "-e", f"{tmp}/error.log"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait_listening(ports["http"], nginx) and wait_listening(ports["https"], nginx):
            return nginx, ports
        nginx.kill()
        nginx.wait()
    with open(f"{tmp}/error.log") as f:
        sys.exit("serve.py: nginx did not start:\n" + f.read())


def start_s3rver(script, tmp):
    os.mkdir(f"{tmp}/s3")
    for _ in range(5):
        port = free_port()
        s3 = subprocess.Popen(["node", script, "-d", f"{tmp}/s3", "-a", "127.0.0.1", "-p", str(port), "-s",
                               "--configure-bucket", "stoker-test"],
                              stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/s3rver.log", "w"))
        if wait_listening(port, s3, seconds=30):
            return s3, port
        s3.kill()
        s3.wait()
    with open(f"{tmp}/s3rver.log") as f:
        sys.exit("serve.py: s3rver did not start:\n" + f.read())


class Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream_port, stall):
        self.upstream_port = upstream_port
        self.stall = stall
        self.counts = {}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), ProxyHandler)

    def first(self, key, n):
        """Whether this is one of the first n requests for key."""
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key] <= n


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # The headers and the body go out as two writes: without this, Nagle's algorithm holds the
        # second until the client's delayed ACK of the first, 40 ms later.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.handle_one(head=True)

    def do_GET(self):
        self.handle_one(head=False)

    def handle_one(self, head):
        _, fault, rest = self.path.split("/", 2) if self.path.count("/") >= 2 else ("", "", "")
        key = (self.command, fault, rest, self.headers.get("Range"))
        kind, _, n = fault.partition("x")
        first = n.isdigit() and self.server.first(key, int(n))
        if fault == "always503" or (kind == "503" and first):
            return self.answer(503, b"fault proxy: 503\n", head)
        if (kind == "stall" and first) or (fault == "rangestall" and "Range" in self.headers):
            time.sleep(self.server.stall)
            self.close_connection = True
            return
        if fault == "rangeslow" and "Range" in self.headers:
            time.sleep(0.5)
        headers = {} if fault == "norange" or "Range" not in self.headers else {"Range": self.headers["Range"]}
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=30)
        upstream.request(self.command, "/" + rest, headers=headers)
        got = upstream.getresponse()
        body = got.read()
        upstream.close()
        self.send_response(got.status)
        halve = fault == "rangehalf" and got.status == 206
        for name, value in got.getheaders():
            if name.lower() in ("connection", "keep-alive", "transfer-encoding", "server", "date"):
                continue
            if halve and name.lower() == "content-length":
                value = str(len(body) // 2)
            if halve and name.lower() == "content-range":  # bytes FIRST-LAST/SIZE
                first, _, rest = value[len("bytes "):].partition("-")
                value = f"bytes {first}-{int(first) + len(body) // 2 - 1}/{rest.partition('/')[2]}"
            self.send_header(name, value)
        self.end_headers()
        if halve:
            body = body[: len(body) // 2]
        if head:
            return
        if (kind == "drop" and first) or fault == "short":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)

    def answer(self, status, body, head):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        if not head:
            self.wfile.write(body)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-seconds", type=float, default=300)
    p.add_argument("--stall", type=float, default=3.0, help="how long a stalled request waits before closing")
    p.add_argument("--s3rver", help="s3rver's script (node_modules/.bin/s3rver): also run it")
    p.add_argument("program", nargs=argparse.REMAINDER)
    args = p.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        p.error("no program to run")
    for tool in ("nginx", "openssl"):
        if shutil.which(tool) is None:
            sys.exit(f"serve.py: {tool} is not installed (scripts/deps.sh installs nginx-light and openssl)")
    tmp = tempfile.mkdtemp(prefix="stoker-serve-")
    root = os.path.join(tmp, "root")
    os.mkdir(root)
    if args.s3rver and not os.access(args.s3rver, os.X_OK):
        sys.exit(f"serve.py: s3rver is not installed at {args.s3rver}: scripts/test.sh installs it "
                 f"(npm install --prefix BUILD/node s3rver@3.7.1)")
    nginx = proxy = s3 = None
    try:
        nginx, ports = start_nginx(tmp, root)
        extra = {}
        if args.s3rver:
            s3, port = start_s3rver(args.s3rver, tmp)
            extra["STOKER_TEST_S3"] = f"http://127.0.0.1:{port}"
        proxy = Proxy(ports["http"], args.stall)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        env = dict(os.environ, STOKER_TEST_ROOT=root, STOKER_TEST_CA=f"{tmp}/cert.pem",
                   STOKER_TEST_HTTP=f"http://127.0.0.1:{ports['http']}",
                   STOKER_TEST_HTTPS=f"https://127.0.0.1:{ports['https']}",
                   STOKER_TEST_PROXY=f"http://127.0.0.1:{proxy.server_address[1]}", **extra)
        child = subprocess.Popen(program, env=env)
        try:
            return child.wait(timeout=args.max_seconds)
        except subprocess.TimeoutExpired:
            print(f"serve.py: {program[0]} ran past {args.max_seconds} s: killed", file=sys.stderr)
            child.kill()
            child.wait()
            return 124
    finally:
        if proxy is not None:
            proxy.shutdown()
        for server in (nginx, s3):
            if server is not None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
