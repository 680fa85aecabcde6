output "api_url" {
  description = "Base URL of the broker's HTTP API (set OVERSPILL_URL to it for the CLI)."
  value       = aws_apigatewayv2_api.this.api_endpoint
}

output "function_name" {
  description = "Name of the broker's Lambda function."
  value       = aws_lambda_function.broker.function_name
}

output "function_arn" {
  description = "ARN of the broker's Lambda function."
  value       = aws_lambda_function.broker.arn
}

output "interruption_queue_url" {
  description = "URL of the SQS queue EventBridge feeds with EC2 spot interruption warnings and rebalance recommendations."
  value       = aws_sqs_queue.interruptions.url
}

output "interruption_dead_letter_queue_url" {
  description = "URL of the queue interruption messages land in after failing 5 times."
  value       = aws_sqs_queue.interruptions_dlq.url
}

output "failed_invocations_queue_url" {
  description = "URL of the queue failed scheduled (asynchronous) invocations land in."
  value       = aws_sqs_queue.failed_invocations.url
}

output "checkpoint_bucket" {
  description = "Name of the checkpoint bucket (use s3://<name>/... as jobs' checkpoint_uri)."
  value       = aws_s3_bucket.checkpoints.id
}

output "reports_bucket" {
  description = "Name of the reports bucket."
  value       = aws_s3_bucket.reports.id
}

output "schedule_names" {
  description = "EventBridge Scheduler schedules by broker task."
  value       = { for task, schedule in aws_scheduler_schedule.task : task => schedule.name }
}

output "schedule_group" {
  description = "EventBridge Scheduler group holding the schedules."
  value       = aws_scheduler_schedule_group.this.name
}

output "database_endpoint" {
  description = "Writer endpoint of the Aurora PostgreSQL cluster."
  value       = aws_rds_cluster.this.endpoint
}

output "database_secret_arn" {
  description = "ARN of the Secrets Manager secret holding the database credentials (managed and rotated by RDS)."
  value       = aws_rds_cluster.this.master_user_secret[0].secret_arn
}

output "kms_key_arn" {
  description = "ARN of the KMS key encrypting the deployment's data."
  value       = aws_kms_key.this.arn
}

output "lambda_security_group_id" {
  description = "Security group of the function (allow it in VPC endpoint policies and security groups)."
  value       = aws_security_group.lambda.id
}

output "metrics_token_secret_arn" {
  description = "Secrets Manager secret holding the bearer token GET /metrics requires (configure Prometheus with it)."
  value       = aws_secretsmanager_secret.generated["metrics_token"].arn
}

output "callback_secret_arn" {
  description = "Secrets Manager secret holding the key that signs training instances' callback tokens."
  value       = aws_secretsmanager_secret.generated["callback_secret"].arn
}

output "instance_profile_name" {
  description = "Instance profile the broker launches training instances with."
  value       = aws_iam_instance_profile.instances.name
}

output "instance_profile_arn" {
  description = "ARN of the training instances' instance profile (OVERSPILL_AWS_INSTANCE_PROFILE)."
  value       = aws_iam_instance_profile.instances.arn
}

output "instance_role_arn" {
  description = "Role of the training instances (the only role the function may pass)."
  value       = aws_iam_role.instances.arn
}

output "instance_security_group_id" {
  description = "Security group of the training instances: no inbound rules, all outbound."
  value       = aws_security_group.instances.id
}

output "checkpoint_store" {
  description = "The checkpoint store the broker is given (OVERSPILL_CHECKPOINT_STORES), by location."
  value       = { "aws/${local.region}" = "s3://${aws_s3_bucket.checkpoints.id}/${local.checkpoint_prefix}" }
}
