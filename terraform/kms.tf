# One customer-managed key encrypts the deployment's data at rest: buckets, database, its secret, logs, the
# function's environment and the schedules' inputs.

data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_109:This is a key policy, not an IAM policy: its Resource "*" means this key only, and the account-root statement is AWS's default that lets IAM policies (such as this module's, scoped to the key) grant use of it.
  #checkov:skip=CKV_AWS_111:This is a key policy: Resource "*" means this key only; write access is limited to the account's IAM principals and CloudWatch Logs for this account's log groups.
  #checkov:skip=CKV_AWS_356:This is a key policy: Resource "*" is the only valid resource in a key policy and means this key.
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"] # in a key policy "*" is this key
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account}:root"]
    }
  }

  statement {
    sid       = "CloudWatchLogsEncrypts"
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account}:log-group:*"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "Overspill ${var.name}: data at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
  tags                    = local.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}
