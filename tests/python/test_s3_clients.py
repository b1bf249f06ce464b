"""Unmodified third-party clients against the drivelab S3 fake.

boto3 (S3 data plane) and minio-py's MinioAdmin (admin API on /minio/admin,
madmin-encrypted bodies). Run by fakes/tests/python_clients.rs, which starts
the fake and sets S3_ENDPOINT, S3_ADMIN_ACCESS_KEY and S3_ADMIN_SECRET_KEY.
"""

import json
import os
import uuid
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from minio import Minio
from minio.credentials import StaticProvider
from minio.error import MinioAdminException
from minio.minioadmin import MinioAdmin

from s3_admin import admin_code

ENDPOINT = os.environ.get("S3_ENDPOINT", "")
ADMIN_AK = os.environ.get("S3_ADMIN_ACCESS_KEY", "")
ADMIN_SK = os.environ.get("S3_ADMIN_SECRET_KEY", "")
REGION = "us-east-1"

if not ENDPOINT:
    pytest.exit("S3_ENDPOINT is not set: run this through `cargo test -p drivelab-fakes --test python_clients`", 2)

HOSTPORT = urlsplit(ENDPOINT).netloc


def s3(access_key=ADMIN_AK, secret_key=ADMIN_SK):
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1, "mode": "standard"},
        ),
    )


def admin(secret_key=ADMIN_SK):
    return MinioAdmin(
        endpoint=HOSTPORT,
        credentials=StaticProvider(ADMIN_AK, secret_key),
        region=REGION,
        secure=False,
    )


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def error_code(exc_info):
    return exc_info.value.response["Error"]["Code"]


def bucket_policy(bucket):
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:*"],
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            }
        ],
    }


def test_boto3_bucket_and_object_round_trip():
    c = s3()
    b = name("bkt")
    c.create_bucket(Bucket=b)
    c.head_bucket(Bucket=b)
    assert b in [x["Name"] for x in c.list_buckets()["Buckets"]]
    c.put_object(Bucket=b, Key="dir/hello world+~.txt", Body=b"hello from boto3")
    got = c.get_object(Bucket=b, Key="dir/hello world+~.txt")
    assert got["Body"].read() == b"hello from boto3"
    head = c.head_object(Bucket=b, Key="dir/hello world+~.txt")
    assert head["ContentLength"] == len(b"hello from boto3")
    listed = c.list_objects_v2(Bucket=b, Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/hello world+~.txt"]
    delimited = c.list_objects_v2(Bucket=b, Delimiter="/")
    assert [p["Prefix"] for p in delimited["CommonPrefixes"]] == ["dir/"]

    with pytest.raises(ClientError) as e:
        c.delete_bucket(Bucket=b)
    assert error_code(e) == "BucketNotEmpty"
    with pytest.raises(ClientError) as e:
        c.create_bucket(Bucket=b)
    assert error_code(e) == "BucketAlreadyOwnedByYou"
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=b, Key="missing")
    assert error_code(e) == "NoSuchKey"

    c.delete_object(Bucket=b, Key="dir/hello world+~.txt")
    c.delete_bucket(Bucket=b)
    with pytest.raises(ClientError) as e:
        c.head_bucket(Bucket=b)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=b, Key="k", Body=b"x")
    assert error_code(e) == "NoSuchBucket"


def test_boto3_presigned_get():
    c = s3()
    b = name("pre")
    c.create_bucket(Bucket=b)
    c.put_object(Bucket=b, Key="obj", Body=b"presigned body")
    url = c.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "obj"}, ExpiresIn=300)
    import urllib.request

    with urllib.request.urlopen(url) as r:
        assert r.read() == b"presigned body"


def test_boto3_wrong_secret_gets_signature_does_not_match():
    with pytest.raises(ClientError) as e:
        s3(secret_key="definitely-not-the-secret").list_buckets()
    assert error_code(e) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as e:
        s3(access_key="no-such-key", secret_key="whatever123").list_buckets()
    assert error_code(e) == "InvalidAccessKeyId"


def test_minio_admin_users_and_policies():
    adm = admin()
    user = name("user")
    pol = name("pol")
    bucket = name("adm")

    assert json.loads(adm.info())["mode"] == "online"
    adm.user_add(user, "user-secret-123")
    info = json.loads(adm.user_info(user))
    assert info["status"] == "enabled"
    adm.user_disable(user)
    assert json.loads(adm.user_info(user))["status"] == "disabled"
    adm.user_enable(user)
    users = json.loads(adm.user_list())  # madmin-encrypted answer
    assert user in users

    adm.policy_add(pol, policy=bucket_policy(bucket))
    assert pol in json.loads(adm.policy_list())
    assert json.loads(adm.policy_info(pol))["Statement"][0]["Resource"][0] == f"arn:aws:s3:::{bucket}"

    adm.policy_set(pol, user=user)
    assert json.loads(adm.user_info(user))["policyName"] == pol

    other = name("pol2")
    adm.policy_add(other, policy=bucket_policy(bucket + "-x"))
    attached = json.loads(adm.attach_policy([other], user=user))  # encrypted request and answer
    assert attached["policiesAttached"] == [other]
    assert sorted(json.loads(adm.user_info(user))["policyName"].split(",")) == sorted([pol, other])
    detached = json.loads(adm.detach_policy([other], user=user))
    assert detached["policiesDetached"] == [other]

    # add-canned-policy replaces the document.
    adm.policy_add(pol, policy=bucket_policy(bucket + "-replaced"))
    assert json.loads(adm.policy_info(pol))["Statement"][0]["Resource"][0] == f"arn:aws:s3:::{bucket}-replaced"

    with pytest.raises(MinioAdminException) as e:
        adm.policy_add(name("bad"), policy={"Statement": "nope"})
    assert admin_code(e) == "InvalidRequest"  # RustFS: the policy parser's error

    adm.policy_remove(other)
    adm.user_remove(user)
    assert user not in json.loads(adm.user_list())
    with pytest.raises(MinioAdminException) as e:
        adm.user_info(user)
    assert admin_code(e) == "NoSuchResource"  # RustFS: iam_error_to_s3_error(NoSuchUser)


def test_minio_admin_with_wrong_secret_is_refused():
    with pytest.raises(MinioAdminException) as e:
        admin(secret_key="wrong-admin-secret").user_list()
    assert admin_code(e) == "SignatureDoesNotMatch"


def test_policy_limited_user_gets_access_denied_elsewhere():
    adm = admin()
    root = s3()
    mine, theirs = name("mine"), name("theirs")
    root.create_bucket(Bucket=mine)
    root.create_bucket(Bucket=theirs)
    user, secret, pol = name("wl"), "workload-secret-1", name("grant")
    adm.user_add(user, secret)
    adm.policy_add(pol, policy=bucket_policy(mine))
    adm.attach_policy([pol], user=user)

    c = s3(user, secret)
    c.put_object(Bucket=mine, Key="k", Body=b"allowed")
    assert c.get_object(Bucket=mine, Key="k")["Body"].read() == b"allowed"
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=theirs, Key="k", Body=b"denied")
    assert error_code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        c.create_bucket(Bucket=name("new"))
    assert error_code(e) == "AccessDenied"

    # Re-running add-user (a retried grant) rotates the secret: old credentials stop working.
    adm.user_add(user, "rotated-secret-2")
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=mine, Key="k")
    assert error_code(e) == "SignatureDoesNotMatch"


def test_minio_py_data_plane():
    m = Minio(HOSTPORT, access_key=ADMIN_AK, secret_key=ADMIN_SK, region=REGION, secure=False)
    b = name("mpy")
    m.make_bucket(b)
    assert m.bucket_exists(b)
    import io

    m.put_object(b, "obj", io.BytesIO(b"from minio-py"), length=13)
    r = m.get_object(b, "obj")
    try:
        assert r.read() == b"from minio-py"
    finally:
        r.close()
        r.release_conn()
    m.remove_object(b, "obj")
    m.remove_bucket(b)
    assert not m.bucket_exists(b)
