# IAM, least privilege.
#
# - aws_iam_role_policy.broker grants exactly the AWS actions the broker's code calls (tests/test_terraform_module.py
#   scans the code for boto3 calls and compares: a new call without its action here fails that test), each scoped
#   to this deployment's resources where the action allows it.
# - aws_iam_role_policy.platform grants what Lambda itself needs on the function's behalf: logs, VPC network
#   interfaces, X-Ray, the SQS event source mapping, and the dead-letter queue for failed asynchronous invocations.
# - aws_iam_role.scheduler lets EventBridge Scheduler invoke the function.

data "aws_iam_policy_document" "lambda_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "lambda" {
  name               = "${var.name}-broker"
  assume_role_policy = data.aws_iam_policy_document.lambda_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "broker" {
  # pricing/feeds/aws.py and providers/aws.py: read-only EC2 calls, which IAM cannot scope to resources.
  statement {
    sid       = "Ec2Read"
    actions   = ["ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes", "ec2:DescribeInstances", "ec2:DescribeSpotPriceHistory"]
    resources = ["*"]
  }

  # providers/aws.py launch: RunInstances or CreateFleet through a per-launch template, tagged at creation.
  statement {
    sid     = "Ec2Launch"
    actions = ["ec2:CreateFleet", "ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate", "ec2:RunInstances"]
    resources = [
      "arn:${local.partition}:ec2:*:${local.account}:*",
      "arn:${local.partition}:ec2:*::image/*",
      "arn:${local.partition}:ec2:*::snapshot/*",
    ]
  }

  # Tags only as part of a launch (RunInstances/CreateFleet TagSpecifications), never on existing resources.
  statement {
    sid       = "Ec2TagOnLaunch"
    actions   = ["ec2:CreateTags"]
    resources = ["arn:${local.partition}:ec2:*:${local.account}:*"]
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["CreateFleet", "RunInstances"]
    }
  }

  # providers/aws.py terminate: only instances this broker launched (tagged overspill:broker = broker_id).
  statement {
    sid       = "Ec2TerminateOwn"
    actions   = ["ec2:TerminateInstances"]
    resources = ["arn:${local.partition}:ec2:*:${local.account}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/overspill:broker"
      values   = [var.broker_id]
    }
  }

  # pricing/feeds/aws.py: on-demand prices from the Price List Query API (no resource-level permissions).
  statement {
    sid       = "PriceList"
    actions   = ["pricing:GetProducts"]
    resources = ["*"]
  }

  # providers/aws.py poll_interruptions (used when the queue is polled rather than delivered to the function).
  statement {
    sid       = "InterruptionQueue"
    actions   = ["sqs:DeleteMessage", "sqs:ReceiveMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
  }

  # providers/storage/s3.py: checkpoints (and reports) in this deployment's buckets.
  statement {
    sid       = "BucketsList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.checkpoints.arn, aws_s3_bucket.reports.arn]
  }

  statement {
    sid       = "BucketsObjects"
    actions   = ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:ListMultipartUploadParts", "s3:PutObject"]
    resources = ["${aws_s3_bucket.checkpoints.arn}/*", "${aws_s3_bucket.reports.arn}/*"]
  }

  # broker/serverless.py: the database credentials RDS keeps in Secrets Manager.
  statement {
    sid       = "DatabaseSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_rds_cluster.this.master_user_secret[0].secret_arn]
  }

  # The key encrypting the buckets' objects and the database secret (S3 and Secrets Manager use it on the caller's
  # behalf).
  statement {
    sid       = "DataKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.this.arn]
  }
}

resource "aws_iam_role_policy" "broker" {
  name   = "broker"
  role   = aws_iam_role.lambda.id
  policy = data.aws_iam_policy_document.broker.json
}

data "aws_iam_policy_document" "platform" {
  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.lambda.arn}:*"]
  }

  # Lambda in a VPC creates and deletes its network interfaces with the function's role: in this account and
  # region, in the function's subnets and security group.
  statement {
    sid     = "VpcNetworkInterfaces"
    actions = ["ec2:AssignPrivateIpAddresses", "ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface", "ec2:UnassignPrivateIpAddresses"]
    resources = concat(
      ["arn:${local.partition}:ec2:${local.region}:${local.account}:network-interface/*", aws_security_group.lambda.arn],
      [for s in var.subnet_ids : "arn:${local.partition}:ec2:${local.region}:${local.account}:subnet/${s}"],
    )
  }

  statement {
    sid       = "VpcNetworkInterfacesRead"
    actions   = ["ec2:DescribeNetworkInterfaces"]
    resources = ["*"] # Describe* takes no resource-level permissions
  }

  statement {
    sid       = "Tracing"
    actions   = ["xray:PutTelemetryRecords", "xray:PutTraceSegments"]
    resources = ["*"]
  }

  statement {
    sid       = "EventSourceMapping"
    actions   = ["sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:ReceiveMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
  }

  statement {
    sid       = "AsyncDeadLetters"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.failed_invocations.arn]
  }
}

resource "aws_iam_role_policy" "platform" {
  name   = "lambda-platform"
  role   = aws_iam_role.lambda.id
  policy = data.aws_iam_policy_document.platform.json
}

data "aws_iam_policy_document" "scheduler_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["scheduler.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

resource "aws_iam_role" "scheduler" {
  name               = "${var.name}-scheduler"
  assume_role_policy = data.aws_iam_policy_document.scheduler_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "scheduler" {
  statement {
    sid       = "InvokeBroker"
    actions   = ["lambda:InvokeFunction"]
    resources = [aws_lambda_function.broker.arn]
  }

  statement {
    sid       = "DeadLetters"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.failed_invocations.arn]
  }

  statement {
    sid       = "ScheduleInput"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.this.arn]
  }
}

resource "aws_iam_role_policy" "scheduler" {
  name   = "invoke-broker"
  role   = aws_iam_role.scheduler.id
  policy = data.aws_iam_policy_document.scheduler.json
}
