"""What both S3 client test files read from admin error answers."""

import json
import re


def admin_code(exc_info):
    """The error code of an admin answer: RustFS's s3s XML or MinIO's JSON."""
    body = exc_info.value._body
    if body.lstrip().startswith("<"):
        return re.search(r"<Code>([^<]*)</Code>", body).group(1)
    return json.loads(body)["Code"]
