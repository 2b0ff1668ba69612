"""Checks s3-memory with boto3, the protocol's reference client: what the dispatcher relies on.

Usage: s3-memory --port 8015 --access-key bench --secret-key bench &
       python3 scripts/bench/s3-memory/check.py [http://127.0.0.1:8015]
"""
import sys

import boto3
import botocore

endpoint = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8015"
s3 = boto3.client(
    "s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
    region_name="us-east-1", config=botocore.config.Config(s3={"addressing_style": "path"}))


def status(call, **kw):
    try:
        call(**kw)
    except botocore.exceptions.ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]
    return 200, "OK"


bucket = "check-bucket"
s3.create_bucket(Bucket=bucket)
etag = s3.put_object(Bucket=bucket, Key="a/b.txt", Body=b"hello", IfNoneMatch="*")["ETag"]
assert etag == '"5d41402abc4b2a76b9719d911017c592"', etag  # MD5, as S3 names one part
assert status(s3.put_object, Bucket=bucket, Key="a/b.txt", Body=b"x", IfNoneMatch="*")[0] == 412
got = s3.get_object(Bucket=bucket, Key="a/b.txt", IfMatch=etag)
assert got["Body"].read() == b"hello" and got["ETag"] == etag
assert status(s3.get_object, Bucket=bucket, Key="a/b.txt", IfMatch='"0"')[0] == 412
assert s3.head_object(Bucket=bucket, Key="a/b.txt")["ContentLength"] == 5
assert status(s3.head_object, Bucket=bucket, Key="missing")[0] == 404
assert status(s3.get_object, Bucket=bucket, Key="missing")[1] == "NoSuchKey"
assert status(s3.put_object, Bucket=bucket, Key="c", Body=b"x", ChecksumCRC32="AAAAAA==")[1] \
    == "BadDigest"
s3.put_object(Bucket=bucket, Key="c", Body=b"x", ChecksumAlgorithm="CRC32")  # trailer checksum
keys = [f"list/{i:04d}" for i in range(2345)]
for k in keys:
    s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
listed = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
    Bucket=bucket, Prefix="list/", PaginationConfig={"PageSize": 1000}) for o in page["Contents"]]
assert listed == keys, (len(listed), len(keys))
after = s3.list_objects_v2(Bucket=bucket, Prefix="list/", StartAfter="list/2340")["Contents"]
assert [o["Key"] for o in after] == keys[-4:]
print("s3-memory: every check passed")
