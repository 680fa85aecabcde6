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
  # pricing/feeds/aws.py and providers/aws.py: read-only EC2 calls, which IAM cannot scope to resources
  # (DescribeImages: the AMI's root device name, so the root volume's size, type and encryption can be set).
  statement {
    sid       = "Ec2Read"
    actions   = ["ec2:DescribeImages", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes", "ec2:DescribeInstances", "ec2:DescribeSpotPriceHistory"]
    resources = ["*"]
  }

  # providers/aws.py launch: RunInstances, or CreateFleet through a per-launch template named "overspill-<hash>"
  # (IAM cannot match launch template names: the template and the fleet carry the broker's tag instead). Every launch
  # statement is limited to the configured regions (aws:RequestedRegion and the ARNs). What is created (instance,
  # volume, template, fleet) must carry overspill:broker = broker_id, which is also what terminate requires.
  statement {
    sid       = "Ec2LaunchTaggedInstances"
    actions   = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = flatten([for r in local.regions : ["${local.ec2_arn[r]}:instance/*", "${local.ec2_arn[r]}:volume/*"]])
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.broker_tag}"
      values   = [var.broker_id]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = local.regions
    }
  }

  # Two statements, not one: a CreateFleet carrying the broker's tag must not make any launch template usable.
  statement {
    sid       = "Ec2LaunchTaggedFleets"
    actions   = ["ec2:CreateFleet"]
    resources = [for r in local.regions : "${local.ec2_arn[r]}:fleet/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.broker_tag}"
      values   = [var.broker_id]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = local.regions
    }
  }

  statement {
    sid       = "Ec2CreateTaggedLaunchTemplates"
    actions   = ["ec2:CreateLaunchTemplate"]
    resources = [for r in local.regions : "${local.ec2_arn[r]}:launch-template/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.broker_tag}"
      values   = [var.broker_id]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = local.regions
    }
  }

  # Launch from, and delete, only this broker's own templates.
  statement {
    sid       = "Ec2OwnLaunchTemplates"
    actions   = ["ec2:CreateFleet", "ec2:DeleteLaunchTemplate", "ec2:RunInstances"]
    resources = [for r in local.regions : "${local.ec2_arn[r]}:launch-template/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.broker_tag}"
      values   = [var.broker_id]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = local.regions
    }
  }

  # What a launch uses without creating it: the instances' security group (this module's, no other), the subnets
  # (aws_instance_subnet_ids when given, else any: the default VPC's), the network interface and spot request a
  # launch makes, and the AMI's snapshots.
  statement {
    sid     = "Ec2LaunchNetwork"
    actions = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = concat(
      ["arn:${local.partition}:ec2:${local.region}:${local.account}:security-group/${aws_security_group.instances.id}"],
      length(var.aws_instance_subnet_ids) > 0
      ? [for s in distinct(values(var.aws_instance_subnet_ids)) : "arn:${local.partition}:ec2:*:${local.account}:subnet/${s}"]
      : [for r in local.regions : "${local.ec2_arn[r]}:subnet/*"],
      flatten([for r in local.regions : [
        "${local.ec2_arn[r]}:network-interface/*",
        "${local.ec2_arn[r]}:spot-instances-request/*",
        "arn:${local.partition}:ec2:${r}::snapshot/*",
      ]]),
    )
    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = local.regions
    }
  }

  # The AMIs instances may boot: aws_allowed_image_ids (default: aws_image_id), and any image of
  # aws_allowed_image_owners. No images configured (aws_launch off): no launch can pass.
  dynamic "statement" {
    for_each = length(local.image_ids) > 0 ? [1] : []
    content {
      sid       = "Ec2LaunchAllowedImages"
      actions   = ["ec2:CreateFleet", "ec2:RunInstances"]
      resources = flatten([for r in local.regions : [for i in local.image_ids : "arn:${local.partition}:ec2:${r}::image/${i}"]])
      condition {
        test     = "StringEquals"
        variable = "aws:RequestedRegion"
        values   = local.regions
      }
    }
  }

  dynamic "statement" {
    for_each = length(var.aws_allowed_image_owners) > 0 ? [1] : []
    content {
      sid       = "Ec2LaunchImagesOfAllowedOwners"
      actions   = ["ec2:CreateFleet", "ec2:RunInstances"]
      resources = [for r in local.regions : "arn:${local.partition}:ec2:${r}::image/*"]
      condition {
        test     = "StringEquals"
        variable = "ec2:Owner"
        values   = var.aws_allowed_image_owners
      }
      condition {
        test     = "StringEquals"
        variable = "aws:RequestedRegion"
        values   = local.regions
      }
    }
  }

  # Instances start with the training instances' role (instances.tf): the function may pass it, and only to EC2.
  statement {
    sid       = "PassInstanceRole"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.instances.arn]
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  # Tags only as part of a launch (the TagSpecifications of RunInstances, CreateFleet, CreateLaunchTemplate), never
  # on existing resources, and only with this broker's tag.
  statement {
    sid       = "Ec2TagOnLaunch"
    actions   = ["ec2:CreateTags"]
    resources = flatten([for r in local.regions : [for t in ["instance", "volume", "fleet", "launch-template"] : "${local.ec2_arn[r]}:${t}/*"]])
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["CreateFleet", "CreateLaunchTemplate", "RunInstances"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.broker_tag}"
      values   = [var.broker_id]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = local.regions
    }
  }

  # providers/aws.py terminate: only instances this broker launched (tagged overspill:broker = broker_id).
  statement {
    sid       = "Ec2TerminateOwn"
    actions   = ["ec2:TerminateInstances"]
    resources = [for r in local.regions : "${local.ec2_arn[r]}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.broker_tag}"
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

  # broker/serverless.py: the database credentials RDS keeps in Secrets Manager; broker/config/secrets.py: the callback
  # secret and the metrics token this module generates (secrets.tf). Not the jobs' secrets.
  statement {
    sid     = "BrokerSecrets"
    actions = ["secretsmanager:GetSecretValue"]
    resources = concat(
      [aws_rds_cluster.this.master_user_secret[0].secret_arn],
      [for s in aws_secretsmanager_secret.generated : s.arn],
    )
  }

  # The key encrypting the buckets' objects and the secrets (S3 and Secrets Manager use it on the caller's behalf).
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
