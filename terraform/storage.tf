# S3 buckets for checkpoints and reports: KMS-encrypted, versioned, private (public access blocked, owner-enforced,
# TLS only), with lifecycle rules.

resource "aws_s3_bucket" "checkpoints" {
  #checkov:skip=CKV_AWS_144:Checkpoints are working state that jobs rewrite every few minutes and the broker copies between regions itself when a job moves; replicating them would double the cost for nothing.
  #checkov:skip=CKV2_AWS_62:Nothing reacts to checkpoint writes; the broker reads checkpoints when it re-places a job.
  #checkov:skip=CKV_AWS_18:Access is through the broker's role and the instances'; CloudTrail S3 data events (an account-level trail) are the audit record, server access logs would need a further bucket per deployment.
  bucket_prefix = "${var.name}-checkpoints-"
  force_destroy = var.force_destroy_buckets
  tags          = local.tags
}

resource "aws_s3_bucket" "reports" {
  #checkov:skip=CKV_AWS_144:Reports are regenerated from the broker's ledger on demand; cross-region replication adds cost without protecting anything that cannot be rebuilt.
  #checkov:skip=CKV2_AWS_62:Nothing reacts to report writes; finance tools read them on their own schedule.
  #checkov:skip=CKV_AWS_18:Access is through the broker's role; CloudTrail S3 data events (an account-level trail) are the audit record, server access logs would need a further bucket per deployment.
  bucket_prefix = "${var.name}-reports-"
  force_destroy = var.force_destroy_buckets
  tags          = local.tags
}

locals {
  buckets = {
    checkpoints = aws_s3_bucket.checkpoints
    reports     = aws_s3_bucket.reports
  }
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_public_access_block" "reports" {
  bucket                  = aws_s3_bucket.reports.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "this" {
  for_each = local.buckets
  bucket   = each.value.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_versioning" "reports" {
  bucket = aws_s3_bucket.reports.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "reports" {
  bucket = aws_s3_bucket.reports.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  rule {
    id     = "expire-old-checkpoints"
    status = "Enabled"
    filter {}
    expiration {
      days = var.checkpoint_expiry_days
    }
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiry_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }

  depends_on = [aws_s3_bucket_versioning.checkpoints]
}

resource "aws_s3_bucket_lifecycle_configuration" "reports" {
  bucket = aws_s3_bucket.reports.id

  rule {
    id     = "age-reports"
    status = "Enabled"
    filter {}
    transition {
      days          = var.reports_infrequent_access_after_days
      storage_class = "STANDARD_IA"
    }
    expiration {
      days = var.reports_expiry_days
    }
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiry_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }

  depends_on = [aws_s3_bucket_versioning.reports]
}

data "aws_iam_policy_document" "tls_only" {
  for_each = local.buckets

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [each.value.arn, "${each.value.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  for_each = local.buckets
  bucket   = each.value.id
  policy   = data.aws_iam_policy_document.tls_only[each.key].json

  depends_on = [aws_s3_bucket_public_access_block.checkpoints, aws_s3_bucket_public_access_block.reports]
}
