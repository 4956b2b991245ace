"""A real S3-compatible server for the object-store tests: moto's standalone server
(``moto[server]``, installed by ``make``) in a process of its own on loopback.

``S3Server.start()`` runs it on a free port; ``export()`` points this process's
AWS environment at it (the way a user points tools at an S3-compatible store:
``AWS_ENDPOINT_URL`` and keys), so Spark's JVM, its Python workers and the
CLI started afterwards inherit it. ``requests()`` counts the S3 requests the
server answered (its access log), for the request counts the issue asks for.
``with_auth()`` makes the server check keys: only the key it returns is let in.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

_SERVE = r"""
import logging, sys, time
from moto.server import ThreadedMotoServer
counts = open(sys.argv[1], "a", buffering=1)
class Count(logging.Handler):
    def emit(self, record):
        counts.write(record.getMessage() + "\n")
log = logging.getLogger("werkzeug")
log.setLevel(logging.INFO)
log.addHandler(Count())
log.propagate = False
s = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
s.start()
print(s.get_host_and_port()[1], flush=True)
while True:
    time.sleep(3600)
"""

REGION = "us-east-1"


class S3Server:
    def __init__(self, proc: subprocess.Popen, port: int, access_log: str):
        self.proc, self.port, self.access_log = proc, port, access_log
        self.endpoint = f"http://127.0.0.1:{port}"
        self.key, self.secret = "testing", "testing"

    @classmethod
    def start(cls, log_dir: str) -> "S3Server":
        os.makedirs(log_dir, exist_ok=True)
        access_log = os.path.join(log_dir, "s3-requests.log")
        proc = subprocess.Popen([sys.executable, "-c", _SERVE, access_log], stdout=subprocess.PIPE,
                                stderr=open(os.path.join(log_dir, "s3-server.log"), "ab"), text=True)
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            proc.kill()
            raise RuntimeError(f"moto's S3 server did not start (see {log_dir}/s3-server.log)")
        return cls(proc, int(line), access_log)

    def env(self, key: str | None = None, secret: str | None = None) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": key or self.key,
                "AWS_SECRET_ACCESS_KEY": secret or self.secret, "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION, "AWS_ALLOW_HTTP": "true",      # deltalake over http
                "AWS_EC2_METADATA_DISABLED": "true"}

    def export(self) -> None:
        os.environ.update(self.env())

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        urllib.request.urlopen(req, timeout=10).read()

    def requests(self) -> int:
        """S3 requests answered so far (each access-log line is one)."""
        with open(self.access_log, encoding="utf-8") as f:
            lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in f]
        return sum(1 for line in lines if re.search(r'"(GET|PUT|POST|HEAD|DELETE) /', line)
                   and "/moto-api/" not in line)

    def with_auth(self) -> tuple[str, str]:
        """Turn on key checking; (key, secret) of a user it lets in."""
        import boto3        # moto[server] brings it
        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION,
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        iam.create_user(UserName="tier")
        iam.attach_user_policy(UserName="tier", PolicyArn=self._admin_policy(iam))
        k = iam.create_access_key(UserName="tier")["AccessKey"]
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0",
                                     headers={"Content-Type": "text/plain"}, method="POST")
        urllib.request.urlopen(req, timeout=10).read()
        return k["AccessKeyId"], k["SecretAccessKey"]

    @staticmethod
    def _admin_policy(iam) -> str:
        doc = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        return iam.create_policy(PolicyName="all", PolicyDocument=json.dumps(doc))["Policy"]["Arn"]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

