#!/usr/bin/env python3
"""The project's own chaos run (issue 30): SQS and S3 on a moto_server on 127.0.0.1, behind a
fault-injecting proxy (5xx, throttling, slow answers, connections dropped before the request
reaches moto and after moto has done it; on result uploads also KMS throttling and a flipped
byte, which the proxy checks against the checksum the upload carries and rejects with
`BadDigest` as S3 does, since moto does not verify checksums); several `dispatcher run`
processes writing with SSE-KMS, one SIGKILLed or
SIGTERMed (and started again) every 5-10 s; inputs with awkward keys, a few that are not audio,
duplicate messages, poison messages. It ends with `dispatcher reconcile` straight against moto:
every input must have exactly one complete result (or a failure record, for the bad ones), the
queue must be empty and the dead-letter queue must hold the poison messages only; every result
upload must have asked for SSE-KMS and carried a checksum, and no flipped byte may reach moto.

    python3 scripts/chaos/chaos.py --dispatcher target/release/dispatcher --jobs 500

Prints one JSON summary line (and exits 1 when an expectation fails). Needs moto_server and
boto3 (scripts/ci-requirements.txt).
"""

import argparse
import asyncio
import base64
import glob
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import boto3

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models/tests/fixtures/tdt-real-options/model.nemo")
CLIPS = sorted(
    p for p in glob.glob(os.path.join(REPO, "models/tests/fixtures/clips/*.wav"))
    if not p.endswith("long.wav")
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the fault-injecting proxy ----------------------------------------------------------------

def decode_aws_chunked(body):
    """The payload, the trailers and the offset of the first payload byte of an `aws-chunked`
    body (`<hex size>[;ext]\r\n<data>\r\n ... 0\r\n<trailers>\r\n\r\n`)."""
    data, pos, first = b"", 0, None
    while True:
        eol = body.index(b"\r\n", pos)
        size = int(body[pos:eol].split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            break
        first = pos if first is None else first
        data += body[pos:pos + size]
        pos += size + 2
    trailers = {}
    for line in body[pos:].split(b"\r\n"):
        if b":" in line:
            k, v = line.split(b":", 1)
            trailers[k.strip().lower().decode()] = v.strip().decode()
    return data, trailers, first


def checksums_of(headers, body):
    """The payload and every checksum an S3 upload carries (header or aws-chunked trailer) as
    {name: (sent, computed)} for the algorithms the standard library has (CRC32, SHA-1,
    SHA-256, MD5); other algorithms are listed with computed None."""
    trailers = {}
    payload = body
    if "aws-chunked" in headers.get("content-encoding", ""):
        payload, trailers, _ = decode_aws_chunked(body)
    sent = {k: v for k, v in {**headers, **trailers}.items() if k.startswith("x-amz-checksum-")
            and k != "x-amz-checksum-type"}
    if "content-md5" in headers:
        sent["content-md5"] = headers["content-md5"]
    b64 = lambda raw: base64.b64encode(raw).decode()
    compute = {
        "x-amz-checksum-crc32": lambda p: b64(zlib.crc32(p).to_bytes(4, "big")),
        "x-amz-checksum-sha1": lambda p: b64(hashlib.sha1(p).digest()),
        "x-amz-checksum-sha256": lambda p: b64(hashlib.sha256(p).digest()),
        "content-md5": lambda p: b64(hashlib.md5(p).digest()),
    }
    return {k: (v, compute[k](payload) if k in compute else None) for k, v in sent.items()}


def flip_a_byte(headers, body):
    """The body with one payload byte inverted (in the first aws-chunked chunk when chunked)."""
    at = len(body) // 2
    if "aws-chunked" in headers.get("content-encoding", ""):
        _, _, first = decode_aws_chunked(body)
        if first is None:
            return body
        at = first
    if not body:
        return body
    return body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1:]


class Proxy:
    """HTTP/1.1, one request per connection (answers say `Connection: close`)."""

    KINDS = ["error_5xx", "throttle", "slow", "drop_before", "drop_after"]
    # Only on uploads of results (PUT into the output bucket), at their own rate.
    UPLOAD_KINDS = ["kms_throttle", "flip"]

    def __init__(self, upstream_port, rate, upload_rate, seed, out_bucket):
        self.upstream_port = upstream_port
        self.rate = rate
        self.upload_rate = upload_rate
        self.rng = random.Random(seed)
        self.out_bucket = out_bucket
        self.counts = {k: 0 for k in self.KINDS + self.UPLOAD_KINDS}
        self.requests = 0
        # Result uploads: seen, without SSE-KMS, without any checksum; flipped bytes the
        # upload's checksum caught (answered BadDigest) and those it could not (forwarded).
        self.uploads = {"puts": 0, "unencrypted": 0, "without_checksum": 0,
                        "flips_rejected": 0, "flips_undetected": 0}

    async def read_request(self, reader):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                body += size_line + chunk
                if size == 0:
                    break
        else:
            body = b""
        return head, headers, body

    def error_answer(self, headers, status, code):
        if "x-amz-target" in headers:  # SQS's JSON protocol
            body = json.dumps({"__type": code, "message": "injected by chaos.py"}).encode()
            ctype = "application/x-amz-json-1.0"
        else:
            body = f"<Error><Code>{code}</Code><Message>injected by chaos.py</Message></Error>".encode()
            ctype = "application/xml"
        reason = {500: "Internal Server Error", 503: "Slow Down", 400: "Bad Request"}[status]
        return (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body

    async def handle(self, reader, writer):
        try:
            head, headers, body = await self.read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            writer.close()
            return
        self.requests += 1
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        upload = request_line.startswith(f"PUT /{self.out_bucket}/")
        if upload and self.rng.random() < self.upload_rate:
            kind = self.rng.choice(self.UPLOAD_KINDS)
        else:
            kind = self.rng.choice(self.KINDS) if self.rng.random() < self.rate else None
        if kind:
            self.counts[kind] += 1
        if upload:
            self.uploads["puts"] += 1
            if headers.get("x-amz-server-side-encryption") != "aws:kms":
                self.uploads["unencrypted"] += 1
            if not checksums_of(headers, body):
                self.uploads["without_checksum"] += 1
        try:
            if kind == "kms_throttle":
                # What S3 passes on when KMS throttles an SSE-KMS write.
                writer.write(self.error_answer(headers, 400, "KMS.ThrottlingException"))
                return
            if kind == "flip":
                body = flip_a_byte(headers, body)
                sums = checksums_of(headers, body)
                if any(computed is not None and computed != sent
                       for sent, computed in sums.values()):
                    self.uploads["flips_rejected"] += 1
                    writer.write(self.error_answer(headers, 400, "BadDigest"))
                    return
                self.uploads["flips_undetected"] += 1
            if kind == "error_5xx":
                writer.write(self.error_answer(headers, 500, "InternalError"))
                return
            if kind == "throttle":
                sqs = "x-amz-target" in headers
                writer.write(self.error_answer(headers, 400 if sqs else 503,
                                               "ThrottlingException" if sqs else "SlowDown"))
                return
            if kind == "drop_before":
                return
            if kind == "slow":
                await asyncio.sleep(self.rng.uniform(1.0, 3.0))
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            lines = head.decode("latin-1").split("\r\n")
            kept = [l for l in lines[1:] if l and not l.lower().startswith("connection:")]
            up_writer.write(("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n")
                            .encode("latin-1") + body)
            await up_writer.drain()
            answer = await up_reader.read()
            up_writer.close()
            if kind == "drop_after":
                return  # moto did it; the client never hears
            writer.write(answer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def serve_in_background(self, port):
        loop = asyncio.new_event_loop()

        async def main():
            server = await asyncio.start_server(self.handle, "127.0.0.1", port)
            async with server:
                await server.serve_forever()

        threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True).start()


# ---- the run ----------------------------------------------------------------------------------

def wait_port(port, within=30):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", required=True)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--bad", type=int, default=10, help="inputs that are not audio")
    ap.add_argument("--duplicates", type=int, default=50, help="inputs sent twice")
    ap.add_argument("--poison", type=int, default=5, help="messages that are not jobs")
    ap.add_argument("--dispatchers", type=int, default=3)
    ap.add_argument("--fault-rate", type=float, default=0.08)
    ap.add_argument("--upload-fault-rate", type=float, default=0.1,
                    help="result uploads answered KMS.ThrottlingException or sent on with a flipped byte")
    ap.add_argument("--kill-every-s", type=float, nargs=2, default=[5.0, 10.0])
    ap.add_argument("--max-s", type=float, default=900)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = args.workdir or tempfile.mkdtemp(prefix="chaos-")
    os.makedirs(work, exist_ok=True)

    moto_port, proxy_port = free_port(), free_port()
    moto = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(moto_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(moto_port)
    proxy = Proxy(moto_port, args.fault_rate, args.upload_fault_rate, args.seed, "chaos-out")
    proxy.serve_in_background(proxy_port)
    wait_port(proxy_port)
    moto_url = f"http://127.0.0.1:{moto_port}"
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true", RUST_LOG="info")
    kw = dict(endpoint_url=moto_url, region_name="us-east-1",
              aws_access_key_id="testing", aws_secret_access_key="testing")
    s3, sqs = boto3.client("s3", **kw), boto3.client("sqs", **kw)
    s3.create_bucket(Bucket="chaos-in")
    s3.create_bucket(Bucket="chaos-out")
    dlq = sqs.create_queue(QueueName="chaos-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue = sqs.create_queue(QueueName="chaos-jobs", Attributes={
        "VisibilityTimeout": "20",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
    })["QueueUrl"]

    # Inputs: awkward keys (spaces, unicode, plus, percent, deep prefixes), a few not audio.
    keys, bad = [], set()
    names = ["call {i:04d}.wav", "café/réunion #{i}.wav", "a+b/{i}%20x.wav", "deep/x/y/z/{i}.wav"]
    for i in range(args.jobs):
        key = "calls/" + names[i % len(names)].format(i=i)
        if i < args.bad:
            key = f"calls/not-audio/{i}.wav"
            body = bytes(rng.getrandbits(8) for _ in range(4096))
            bad.add(key)
        else:
            body = open(CLIPS[i % len(CLIPS)], "rb").read()
        s3.put_object(Bucket="chaos-in", Key=key, Body=body)
        keys.append(key)
    messages = [json.dumps({"schema_version": 1, "job_id": f"chaos-{i}", "input": f"s3://chaos-in/{k}"})
                for i, k in enumerate(keys)]
    messages += [json.dumps({"schema_version": 1, "job_id": f"chaos-dup-{i}", "input": f"s3://chaos-in/{k}"})
                 for i, k in enumerate(rng.sample(keys, min(args.duplicates, len(keys))))]
    messages += ["{not json" for _ in range(args.poison)]
    rng.shuffle(messages)
    for start in range(0, len(messages), 10):
        sqs.send_message_batch(QueueUrl=queue, Entries=[
            {"Id": str(n), "MessageBody": b} for n, b in enumerate(messages[start:start + 10])])

    cmd = [args.dispatcher, "run", "--queue-url", queue.replace(str(moto_port), str(proxy_port)),
           "--output-uri", "s3://chaos-out/results/", "--model", MODEL,
           "--s3-force-path-style", "--wait-time-s", "2", "--visibility-timeout-s", "20",
           "--drain-grace-s", "10", "--max-retry-delay-s", "5",
           "--sse-kms-key-id", "arn:aws:kms:us-east-1:123456789012:key/chaos"]
    proxied_env = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy_port}")
    procs, starts = {}, 0

    def start(slot):
        nonlocal starts
        starts += 1
        log = open(os.path.join(work, f"dispatcher-{slot}-{starts}.log"), "w")
        procs[slot] = subprocess.Popen(cmd, env=proxied_env, stdout=subprocess.DEVNULL, stderr=log)

    for slot in range(args.dispatchers):
        start(slot)
    kills = {"SIGKILL": 0, "SIGTERM": 0}
    term_exits = []
    started = time.time()

    def queue_empty():
        a = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"]) == 0

    next_kill = time.time() + rng.uniform(*args.kill_every_s)
    while time.time() - started < args.max_s:
        time.sleep(0.5)
        for slot, p in list(procs.items()):
            if p.poll() is not None:  # exited by itself (an infrastructure stop): start again
                start(slot)
        if queue_empty():
            break
        if time.time() >= next_kill:
            slot = rng.randrange(args.dispatchers)
            sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            procs[slot].send_signal(sig)
            kills[sig.name] += 1
            try:
                rc = procs[slot].wait(timeout=60)
            except subprocess.TimeoutExpired:
                procs[slot].kill()
                rc = procs[slot].wait()
            if sig == signal.SIGTERM:
                term_exits.append(rc)
            start(slot)
            next_kill = time.time() + rng.uniform(*args.kill_every_s)
    elapsed = time.time() - started
    for p in procs.values():
        p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()

    # The verdict, straight from moto (no proxy).
    recon = subprocess.run(
        [args.dispatcher, "reconcile", "s3://chaos-in/calls/", "--output-uri", "s3://chaos-out/results/",
         "--model", MODEL, "--s3-force-path-style", "--json"],
        env=dict(env, AWS_ENDPOINT_URL=moto_url), capture_output=True, text=True)
    report = json.loads(recon.stdout) if recon.stdout.strip() else {"error": recon.stderr[-2000:]}
    manifests = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="chaos-out", Prefix="results/"):
        manifests += sum(1 for o in page.get("Contents", []) if o["Key"].endswith("/manifest.json"))
    dead = []
    while True:
        got = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, VisibilityTimeout=60,
                                  WaitTimeSeconds=0).get("Messages", [])
        if not got:
            break
        dead += [m["Body"] for m in got]
    summary = {
        "jobs": args.jobs, "bad_inputs": len(bad), "duplicate_messages": args.duplicates,
        "poison_messages": args.poison, "dispatchers": args.dispatchers,
        "elapsed_s": round(elapsed, 1), "queue_empty": queue_empty(),
        "kills": kills, "sigterm_exit_codes": sorted(set(term_exits)), "process_starts": starts,
        "proxy_requests": proxy.requests, "faults_injected": proxy.counts,
        "result_uploads": proxy.uploads,
        "reconcile_exit": recon.returncode,
        "reconcile": {k: report.get(k) for k in ("inputs", "complete", "failed", "missing", "incomplete")},
        "manifests": manifests,
        "dead_letters": len(dead), "dead_letters_that_are_jobs": sum(1 for b in dead if b.startswith("{\"")),
        "logs": work,
    }
    print(json.dumps(summary))
    moto.terminate()
    ok = (summary["queue_empty"] and recon.returncode == 0
          and report.get("complete") == args.jobs - len(bad) and report.get("failed") == len(bad)
          and manifests == args.jobs - len(bad) and len(dead) == args.poison
          and summary["dead_letters_that_are_jobs"] == 0 and set(term_exits) <= {0}
          and proxy.uploads["unencrypted"] == 0 and proxy.uploads["without_checksum"] == 0
          and proxy.uploads["flips_undetected"] == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
