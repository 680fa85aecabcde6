"""Lambda events as AWS delivers them, for the serverless handler's tests.

- `http_event`: API Gateway HTTP API, payload format 2.0 (the shape of the AWS docs' example event, with
  base64-less JSON bodies as API Gateway sends them).
- `schedule_event`: what EventBridge Scheduler passes to a Lambda target: the schedule's Input, verbatim (the
  module sets it to {"overspill_task": NAME}).
- `sqs_event`: the SQS event source mapping's batch, one record per message received from the queue.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

API_ID = "a1b2c3d4e5"
ACCOUNT = "123456789012"


def http_event(
    method: str,
    path: str,
    *,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    now = time.time()
    raw_body = json.dumps(body) if body is not None else None
    all_headers = {
        "accept": "application/json",
        "content-length": str(len(raw_body or "")),
        "host": f"{API_ID}.execute-api.us-east-1.amazonaws.com",
        "user-agent": "curl/8.5.0",
        "x-amzn-trace-id": "Root=1-65f1c2a3-0123456789abcdef01234567",
        "x-forwarded-for": "203.0.113.9",
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https",
    }
    if raw_body is not None:
        all_headers["content-type"] = "application/json"
    all_headers.update({k.lower(): v for k, v in (headers or {}).items()})
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": urlencode(dict(query or {})),
        "headers": all_headers,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": API_ID,
            "domainName": f"{API_ID}.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": API_ID,
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.9",
                "userAgent": "curl/8.5.0",
            },
            "requestId": uuid.uuid4().hex[:16] + "=",
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": False,
    }
    if query:
        event["queryStringParameters"] = dict(query)
    if raw_body is not None:
        event["body"] = raw_body
    return event


def schedule_event(task: str) -> dict[str, Any]:
    return {"overspill_task": task}


def sqs_record(body: str, *, queue_arn: str, message_id: str | None = None) -> dict[str, Any]:
    now_ms = str(int(time.time() * 1000))
    return {
        "messageId": message_id or str(uuid.uuid4()),
        "receiptHandle": "AQEB" + uuid.uuid4().hex,
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": now_ms,
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": now_ms,
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": queue_arn.split(":")[3],
    }


def sqs_event(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Records": records}


def spot_warning(ec2_id: str, region: str = "us-east-1", kind: str = "EC2 Spot Instance Interruption Warning") -> str:
    """An EventBridge EC2 event as EventBridge writes it to an SQS target (the message body)."""
    detail: dict[str, str] = {"instance-id": ec2_id}
    if kind == "EC2 Spot Instance Interruption Warning":
        detail["instance-action"] = "terminate"
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": kind,
            "source": "aws.ec2",
            "account": ACCOUNT,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "region": region,
            "resources": [f"arn:aws:ec2:{region}a:instance/{ec2_id}"],
            "detail": detail,
        }
    )
