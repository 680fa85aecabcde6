# Overspill serverless on AWS: what every other file shares (identity, names, the broker's environment, the tasks).

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  partition = data.aws_partition.current.partition
  region    = data.aws_region.current.name
  tags      = merge({ "overspill:deployment" = var.name }, var.tags)

  # Regions the broker prices and launches in; IAM limits launches to them (aws:RequestedRegion and the ARNs).
  regions = length(var.aws_regions) > 0 ? var.aws_regions : [local.region]
  ec2_arn = { for r in local.regions : r => "arn:${local.partition}:ec2:${r}:${local.account}" }
  # The tag every instance, volume, launch template and fleet of this broker carries (providers/model.py BROKER_TAG).
  broker_tag = "overspill:broker"
  # AMIs RunInstances may use (with aws_allowed_image_owners' images).
  image_ids = length(var.aws_allowed_image_ids) > 0 ? var.aws_allowed_image_ids : compact([var.aws_image_id])

  # The checkpoint store's prefix P in the checkpoint bucket. The broker's layout under it: P tenants/<tenant>/...
  # (jobs' checkpoints and attempts, the tenant's mailbox; instances read and write there) and P _agent/ (the agent
  # wheel the broker publishes; instances only read it).
  checkpoint_prefix = "overspill/"
  # Secrets named with this prefix are the jobs' (instances may read them); the broker's own are under
  # "<name>/broker/", which instance_secret_prefix may not cover.
  instance_secret_prefix = coalesce(var.instance_secret_prefix, "${var.name}/jobs/")

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
  # queue's messages, so the tick does not poll it. Secrets are passed as Secrets Manager ARNs (*_ARN), read at
  # cold start. OVERSPILL_PUBLIC_URL is the API's own endpoint: the API does not depend on the function (only its
  # integration does), so there is no cycle.
  broker_environment = {
    OVERSPILL_ENV                    = "production"
    OVERSPILL_DATA_DIR               = "/tmp/overspill"
    OVERSPILL_BROKER_ID              = var.broker_id
    OVERSPILL_BOOTSTRAP_API_KEY      = var.bootstrap_api_key
    OVERSPILL_BOOTSTRAP_TENANT       = var.bootstrap_tenant
    OVERSPILL_SIMULATED              = tostring(var.simulated)
    OVERSPILL_AWS_REGIONS            = jsonencode(local.regions)
    OVERSPILL_AWS_LAUNCH             = tostring(var.aws_launch)
    OVERSPILL_AWS_IMAGE_ID           = var.aws_image_id
    OVERSPILL_AWS_SUBNET_IDS         = jsonencode(var.aws_instance_subnet_ids)
    OVERSPILL_AWS_INSTANCE_PROFILE   = aws_iam_instance_profile.instances.arn
    OVERSPILL_AWS_SECURITY_GROUP_IDS = jsonencode([aws_security_group.instances.id])
    OVERSPILL_AWS_IMDS_V2_REQUIRED   = "true"
    OVERSPILL_CHECKPOINT_STORES      = jsonencode({ "aws/${local.region}" = "s3://${aws_s3_bucket.checkpoints.id}/${local.checkpoint_prefix}" })
    OVERSPILL_PUBLIC_URL             = aws_apigatewayv2_api.this.api_endpoint
    OVERSPILL_CALLBACK_SECRET_ARN    = aws_secretsmanager_secret.generated["callback_secret"].arn
    OVERSPILL_METRICS_TOKEN_ARN      = aws_secretsmanager_secret.generated["metrics_token"].arn
    OVERSPILL_DATABASE_SECRET_ARN    = aws_rds_cluster.this.master_user_secret[0].secret_arn
    OVERSPILL_DATABASE_HOST          = aws_rds_cluster.this.endpoint
    OVERSPILL_DATABASE_PORT          = tostring(aws_rds_cluster.this.port)
    OVERSPILL_DATABASE_NAME          = var.db_name
    OVERSPILL_DATABASE_SSLMODE       = "require"
  }
  environment = merge(var.extra_environment, local.broker_environment)
}
