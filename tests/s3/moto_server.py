#!/usr/bin/env python3
"""An S3-compatible server for the tests (moto, from PyPI), with IAM enforced.

Starts moto on 127.0.0.1 (a free port), creates a bucket and two IAM users, then prints
one JSON line and serves until its stdin closes (the test's end):

    {"endpoint": "http://127.0.0.1:PORT", "bucket": "...", "region": "us-east-1",
     "admin": {"key": "...", "secret": "..."},            # s3:* on everything
     "scoped": {"key": "...", "secret": "...", "prefix": "..."}}   # only bucket/prefix/*

The scoped user's policy is what an operator gives a cluster that shares a bucket: object
calls on `bucket/prefix/*` and listing with that prefix, nothing else. With `--iam`, moto
enforces IAM identity policies once INITIAL_NO_AUTH_ACTION_COUNT requests have been served
(the setup's); without it, any credentials pass. (moto 5.1's signature check then refuses
a listing whose prefix holds a `/`, which S3 accepts, and it does not evaluate the listing
condition: the tests check the object calls under IAM and list without it.)

Usage: moto_server.py BUCKET PREFIX [--iam]
"""
import json
import os
import sys

# The setup below makes exactly this many requests; with --iam every later one is checked.
SETUP_REQUESTS = 7
if "--iam" in sys.argv:
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = str(SETUP_REQUESTS)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402


def main():
    bucket, prefix = sys.argv[1], sys.argv[2].strip("/")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
    s3 = boto3.client("s3", **kw)
    iam = boto3.client("iam", **kw)
    s3.create_bucket(Bucket=bucket)  # 1
    users = {}
    policies = {
        "admin": {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]},
        "scoped": {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                    "Resource": f"arn:aws:s3:::{bucket}/{prefix}/*",
                },
                {
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": f"arn:aws:s3:::{bucket}",
                    "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*"]}},
                },
            ],
        },
    }
    for name, policy in policies.items():  # 3 requests each
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        users[name] = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    users["scoped"]["prefix"] = prefix
    print(json.dumps({"endpoint": endpoint, "bucket": bucket, "region": "us-east-1", **users}), flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
