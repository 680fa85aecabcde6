# The training instances' identity: the role and instance profile the broker launches them with (the function may
# pass this role and no other, and only to EC2), and their security group.
#
# What an instance may touch, in the checkpoint bucket under the store's prefix P (local.checkpoint_prefix):
# - P tenants/*: read, write and delete objects (checkpoints, attempts' specs and logs, the tenants' mailboxes) and
#   list them (s3:ListBucket limited by s3:prefix);
# - P _agent/*: read the agent wheel the broker publishes (never write it);
# and nothing else in either bucket (the reports bucket not at all). Also: the jobs' named secrets (secret names
# starting with local.instance_secret_prefix), image pulls from the ECR repositories in
# var.instance_ecr_repository_arns, and the module's key through S3 and Secrets Manager only.
#
# Every instance has the same role: IAM does not tell tenants apart here, so isolation between tenants' areas rests on
# the broker's agent (the prefixes it hands out), not on IAM.

data "aws_iam_policy_document" "instances_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "instances" {
  name               = "${var.name}-instances"
  description        = "Overspill ${var.name}: training instances launched by the broker"
  assume_role_policy = data.aws_iam_policy_document.instances_assume.json
  tags               = local.tags
}

resource "aws_iam_instance_profile" "instances" {
  name = "${var.name}-instances"
  role = aws_iam_role.instances.name
  tags = local.tags
}

data "aws_iam_policy_document" "instances" {
  statement {
    sid       = "TenantObjects"
    actions   = ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:ListMultipartUploadParts", "s3:PutObject"]
    resources = ["${aws_s3_bucket.checkpoints.arn}/${local.checkpoint_prefix}tenants/*"]
  }

  statement {
    sid       = "TenantListing"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.checkpoints.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.checkpoint_prefix}tenants/*"]
    }
  }

  statement {
    sid       = "AgentWheel"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.checkpoints.arn}/${local.checkpoint_prefix}_agent/*"]
  }

  statement {
    sid       = "JobSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [for r in distinct(concat([local.region], local.regions)) : "arn:${local.partition}:secretsmanager:${r}:${local.account}:secret:${local.instance_secret_prefix}*"]
  }

  # The bucket is SSE-KMS with the module's key; job secrets may use it too. Only through those two services.
  statement {
    sid       = "DataKeyThroughS3AndSecrets"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.this.arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values = concat(
        ["s3.${local.region}.amazonaws.com"],
        [for r in distinct(concat([local.region], local.regions)) : "secretsmanager.${r}.amazonaws.com"],
      )
    }
  }

  dynamic "statement" {
    for_each = length(var.instance_ecr_repository_arns) > 0 ? [1] : []
    content {
      sid       = "RegistryLogin"
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"] # GetAuthorizationToken takes no resource-level permissions
    }
  }

  dynamic "statement" {
    for_each = length(var.instance_ecr_repository_arns) > 0 ? [1] : []
    content {
      sid       = "ImagePull"
      actions   = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = var.instance_ecr_repository_arns
    }
  }
}

resource "aws_iam_role_policy" "instances" {
  name   = "training-instance"
  role   = aws_iam_role.instances.id
  policy = data.aws_iam_policy_document.instances.json
}

# No inbound access at all (nothing listens: the agent reports through S3 and the broker's HTTPS API); all egress.
resource "aws_security_group" "instances" {
  #checkov:skip=CKV2_AWS_5:The broker attaches this group to every instance it launches (OVERSPILL_AWS_SECURITY_GROUP_IDS, and IAM lets it launch into no other group); no resource in this module uses it.
  name        = "${var.name}-instances"
  description = "Overspill training instances: no inbound access"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_egress_rule" "instances_ipv4" {
  #checkov:skip=CKV_AWS_382:Training containers pull images, packages and datasets from registries and stores whose addresses are not known here, and report to the broker's public API; the subnets' routes decide what is reachable.
  security_group_id = aws_security_group.instances.id
  description       = "All outbound IPv4"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "instances_ipv6" {
  #checkov:skip=CKV_AWS_382:Training containers pull images, packages and datasets from registries and stores whose addresses are not known here, and report to the broker's public API; the subnets' routes decide what is reachable.
  security_group_id = aws_security_group.instances.id
  description       = "All outbound IPv6"
  ip_protocol       = "-1"
  cidr_ipv6         = "::/0"
}
