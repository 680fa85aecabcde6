# A root module deploying the broker with terraform/ : `terraform apply -var-file=my.tfvars` after building the
# package with `python terraform/build_lambda.py --out dist/overspill-lambda.zip`.
#
# `aws_endpoint_url` points every AWS API at one endpoint (a moto server in tests/test_terraform_apply.py); leave it
# null to deploy to AWS.

terraform {
  required_version = ">= 1.11.0, < 2.0.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "5.100.0"
    }
  }
}

locals {
  local_endpoint = var.aws_endpoint_url != null
  endpoint_services = [
    "apigatewayv2", "cloudwatch", "ec2", "events", "iam", "kms", "lambda", "logs", "rds", "s3", "scheduler",
    "secretsmanager", "sqs", "sts",
  ]
}

provider "aws" {
  region = var.region

  skip_credentials_validation = local.local_endpoint
  skip_metadata_api_check     = local.local_endpoint
  skip_requesting_account_id  = false
  s3_use_path_style           = local.local_endpoint

  dynamic "endpoints" {
    for_each = local.local_endpoint ? [var.aws_endpoint_url] : []
    content {
      apigatewayv2   = endpoints.value
      cloudwatch     = endpoints.value
      ec2            = endpoints.value
      events         = endpoints.value
      iam            = endpoints.value
      kms            = endpoints.value
      lambda         = endpoints.value
      logs           = endpoints.value
      rds            = endpoints.value
      s3             = endpoints.value
      scheduler      = endpoints.value
      secretsmanager = endpoints.value
      sqs            = endpoints.value
      sts            = endpoints.value
    }
  }

  default_tags {
    tags = { "overspill:example" = "basic" }
  }
}

module "overspill" {
  source = "../.."

  name              = var.name
  lambda_zip_path   = var.lambda_zip_path
  vpc_id            = var.vpc_id
  subnet_ids        = var.subnet_ids
  bootstrap_api_key = var.bootstrap_api_key
  aws_regions       = [var.region]
  aws_image_id      = var.aws_image_id

  db_deletion_protection = var.db_deletion_protection
  db_skip_final_snapshot = var.db_skip_final_snapshot
  force_destroy_buckets  = var.force_destroy_buckets
}
