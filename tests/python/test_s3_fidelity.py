"""Issue 19 probes: the S3/admin fake as real clients use it.

boto3 (ranges, metadata, ETags, Content-MD5 and checksums, multipart,
CopyObject, DeleteObjects), minio-py's MinioAdmin (64-character secrets,
policy in use, service accounts) and the aws CLI (multipart upload and
download of a 20 MiB object). Run by fakes/tests/python_clients.rs, which
sets S3_ENDPOINT (rustfs profile) and S3_MINIO_ENDPOINT (minio profile).
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from urllib.parse import urlsplit

import boto3
import pytest
import urllib3
from botocore.config import Config
from botocore.exceptions import ClientError
from minio.credentials import StaticProvider
from minio.error import MinioAdminException
from minio.minioadmin import MinioAdmin

from s3_admin import admin_code

ENDPOINT = os.environ.get("S3_ENDPOINT", "")
MINIO_ENDPOINT = os.environ.get("S3_MINIO_ENDPOINT", "")
AK = os.environ.get("S3_ADMIN_ACCESS_KEY", "")
SK = os.environ.get("S3_ADMIN_SECRET_KEY", "")

if not ENDPOINT or not MINIO_ENDPOINT:
    pytest.exit("S3_ENDPOINT / S3_MINIO_ENDPOINT are not set: run this through `cargo test -p drivelab-fakes --test python_clients`", 2)


def s3(endpoint=ENDPOINT, ak=AK, sk=SK, region="eu-central-1"):
    # Any region: the fakes are started with none configured.
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ak,
        aws_secret_access_key=sk,
        region_name=region,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def admin(endpoint):
    return MinioAdmin(endpoint=urlsplit(endpoint).netloc, credentials=StaticProvider(AK, SK), secure=False)


def name(p):
    return f"{p}-{uuid.uuid4().hex[:10]}"


def code(e):
    return e.value.response["Error"]["Code"]


def test_boto3_range_metadata_etag_and_checksums():
    c = s3()
    b = name("rng")
    c.create_bucket(Bucket=b)
    assert c.head_bucket(Bucket=b)["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "us-east-1"
    data = bytes(range(256)) * 4
    put = c.put_object(Bucket=b, Key="k", Body=data, Metadata={"owner": "drivelab"}, ChecksumAlgorithm="SHA256")
    assert put["ETag"] == '"%s"' % hashlib.md5(data).hexdigest()
    assert put["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    got = c.get_object(Bucket=b, Key="k", Range="bytes=100-199")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == "bytes 100-199/1024"
    assert got["Body"].read() == data[100:200]
    assert c.head_object(Bucket=b, Key="k")["Metadata"] == {"owner": "drivelab"}
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=b, Key="k", Range="bytes=5000-")
    assert code(e) == "InvalidRange"
    # CRC32C in botocore needs botocore[crt]; the fake's CRC32C is unit-tested.
    for algo in ["CRC32", "SHA1"]:
        r = c.put_object(Bucket=b, Key="c-" + algo, Body=b"abc", ChecksumAlgorithm=algo)
        assert r["Checksum" + algo]
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=b, Key="bad", Body=b"abc", ContentMD5=base64.b64encode(hashlib.md5(b"xyz").digest()).decode())
    assert code(e) == "BadDigest"
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=b, Key="bad", Body=b"abc", ChecksumCRC32="AAAAAA==")
    assert code(e) == "BadDigest"


def test_boto3_multipart_copy_and_delete_objects():
    c = s3()
    b = name("mpu")
    c.create_bucket(Bucket=b)
    up = c.create_multipart_upload(Bucket=b, Key="big")["UploadId"]
    p1, p2 = os.urandom(5 * 1024 * 1024), b"last part"
    e1 = c.upload_part(Bucket=b, Key="big", UploadId=up, PartNumber=1, Body=p1)["ETag"]
    e2 = c.upload_part(Bucket=b, Key="big", UploadId=up, PartNumber=2, Body=p2)["ETag"]
    assert [p["PartNumber"] for p in c.list_parts(Bucket=b, Key="big", UploadId=up)["Parts"]] == [1, 2]
    done = c.complete_multipart_upload(
        Bucket=b, Key="big", UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
    )
    want = hashlib.md5(hashlib.md5(p1).digest() + hashlib.md5(p2).digest()).hexdigest() + "-2"
    assert done["ETag"] == '"%s"' % want
    assert c.get_object(Bucket=b, Key="big")["Body"].read() == p1 + p2
    aborted = c.create_multipart_upload(Bucket=b, Key="gone")["UploadId"]
    c.abort_multipart_upload(Bucket=b, Key="gone", UploadId=aborted)
    with pytest.raises(ClientError) as e:
        c.list_parts(Bucket=b, Key="gone", UploadId=aborted)
    assert code(e) == "NoSuchUpload"

    c.copy_object(Bucket=b, Key="copy", CopySource={"Bucket": b, "Key": "big"})
    assert c.head_object(Bucket=b, Key="copy")["ContentLength"] == len(p1) + len(p2)
    r = c.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "big"}, {"Key": "copy"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["big", "copy"]
    assert "Contents" not in c.list_objects_v2(Bucket=b)


def test_minio_admin_profiles():
    long_secret = "S" * 64
    for endpoint, in_use in [(ENDPOINT, "InternalError"), (MINIO_ENDPOINT, "XMinioAdminPolicyInUse")]:
        adm = admin(endpoint)
        user, pol = name("u"), name("p")
        adm.user_add(user, long_secret)  # no 40-character limit on either server's add-user
        adm.policy_add(pol, policy={"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]}]})
        adm.attach_policy([pol], user=user)
        s3(endpoint, user, long_secret).list_buckets()
        if in_use == "InternalError":
            # RustFS answers 500, which minio-py's urllib3 retries, then gives up.
            with pytest.raises(urllib3.exceptions.MaxRetryError) as e:
                adm.policy_remove(pol)
            assert "500" in str(e.value)
        else:
            with pytest.raises(MinioAdminException) as e:
                adm.policy_remove(pol)
            assert admin_code(e) == in_use
        with pytest.raises(MinioAdminException) as e:
            adm.list_service_account(user)
        assert admin_code(e) == "NotImplemented"
        adm.user_remove(user)
        adm.policy_remove(pol)


def aws(*args, endpoint=ENDPOINT):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK, AWS_DEFAULT_REGION="us-east-1")
    return subprocess.run(["aws", "--endpoint-url", endpoint, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("aws") is None, reason="the aws CLI is not installed (pip install awscli)")
def test_aws_cli_multipart_round_trip(tmp_path):
    b = name("cli")
    assert aws("s3", "mb", f"s3://{b}").returncode == 0
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(20 * 1024 * 1024))  # above the CLI's 8 MiB multipart threshold
    r = aws("s3", "cp", str(src), f"s3://{b}/obj")
    assert r.returncode == 0, r.stderr
    dst = tmp_path / "dst.bin"
    r = aws("s3", "cp", f"s3://{b}/obj", str(dst))  # ranged GETs in parallel
    assert r.returncode == 0, r.stderr
    assert dst.read_bytes() == src.read_bytes()
    head = json.loads(aws("s3api", "head-object", "--bucket", b, "--key", "obj").stdout)
    assert head["ETag"].endswith('-3"')  # 8 MiB chunks: three parts
    r = aws("s3api", "get-object", "--bucket", b, "--key", "obj", "--range", "bytes=0-9", str(tmp_path / "part"))
    assert r.returncode == 0 and json.loads(r.stdout)["ContentRange"] == "bytes 0-9/20971520"
    assert aws("s3", "rm", "--recursive", f"s3://{b}").returncode == 0
    assert aws("s3", "rb", f"s3://{b}").returncode == 0
