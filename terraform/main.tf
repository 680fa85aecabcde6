# Overspill serverless on AWS: what every other file shares (identity, names, the broker's environment, the tasks).

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  partition = data.aws_partition.current.partition
  region    = data.aws_region.current.name
  tags      = merge({ "overspill:deployment" = var.name }, var.tags)

  # EventBridge Scheduler schedules: task name (the Lambda input {"overspill_task": NAME}, see
  # broker/serverless.py TASKS) => schedule expression.
  schedules = {
    tick           = var.tick_schedule
    refresh_prices = var.price_refresh_schedule
    reports        = var.reports_schedule
  }

  # EventBridge rules feeding the interruption queue: rule suffix => EC2 detail-type (providers/aws.py).
  interruption_events = {
    spot-interruption = "EC2 Spot Instance Interruption Warning"
    rebalance         = "EC2 Instance Rebalance Recommendation"
  }

  # The broker's environment: Settings fields (OVERSPILL_<FIELD>) and the database variables broker/serverless.py
  # reads. The Lambda gets no OVERSPILL_AWS_INTERRUPTION_QUEUE_URL: the SQS event source mapping delivers the
  # queue's messages, so the tick does not poll it.
  broker_environment = {
    OVERSPILL_ENV                 = "production"
    OVERSPILL_DATA_DIR            = "/tmp/overspill"
    OVERSPILL_BROKER_ID           = var.broker_id
    OVERSPILL_BOOTSTRAP_API_KEY   = var.bootstrap_api_key
    OVERSPILL_BOOTSTRAP_TENANT    = var.bootstrap_tenant
    OVERSPILL_SIMULATED           = tostring(var.simulated)
    OVERSPILL_AWS_REGIONS         = jsonencode(length(var.aws_regions) > 0 ? var.aws_regions : [local.region])
    OVERSPILL_AWS_LAUNCH          = tostring(var.aws_launch)
    OVERSPILL_AWS_IMAGE_ID        = var.aws_image_id
    OVERSPILL_AWS_SUBNET_IDS      = jsonencode(var.aws_instance_subnet_ids)
    OVERSPILL_PUBLIC_URL          = aws_apigatewayv2_api.this.api_endpoint
    OVERSPILL_DATABASE_SECRET_ARN = aws_rds_cluster.this.master_user_secret[0].secret_arn
    OVERSPILL_DATABASE_HOST       = aws_rds_cluster.this.endpoint
    OVERSPILL_DATABASE_PORT       = tostring(aws_rds_cluster.this.port)
    OVERSPILL_DATABASE_NAME       = var.db_name
    OVERSPILL_DATABASE_SSLMODE    = "require"
  }
  environment = merge(var.extra_environment, local.broker_environment)
}
