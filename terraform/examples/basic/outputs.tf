output "api_url" {
  description = "Base URL of the broker's HTTP API."
  value       = module.overspill.api_url
}

output "function_name" {
  description = "Name of the broker's Lambda function."
  value       = module.overspill.function_name
}

output "interruption_queue_url" {
  description = "URL of the interruption queue."
  value       = module.overspill.interruption_queue_url
}

output "checkpoint_bucket" {
  description = "Name of the checkpoint bucket."
  value       = module.overspill.checkpoint_bucket
}

output "reports_bucket" {
  description = "Name of the reports bucket."
  value       = module.overspill.reports_bucket
}

output "schedule_names" {
  description = "Schedules by broker task."
  value       = module.overspill.schedule_names
}

output "schedule_group" {
  description = "Schedule group."
  value       = module.overspill.schedule_group
}

output "database_secret_arn" {
  description = "Secret holding the database credentials."
  value       = module.overspill.database_secret_arn
}

output "metrics_token_secret_arn" {
  description = "Secret holding the bearer token of GET /metrics."
  value       = module.overspill.metrics_token_secret_arn
}

output "callback_secret_arn" {
  description = "Secret holding the key that signs instances' callback tokens."
  value       = module.overspill.callback_secret_arn
}

output "instance_profile_arn" {
  description = "Instance profile of the training instances."
  value       = module.overspill.instance_profile_arn
}

output "instance_security_group_id" {
  description = "Security group of the training instances."
  value       = module.overspill.instance_security_group_id
}

output "kms_key_arn" {
  description = "Key encrypting the deployment's data."
  value       = module.overspill.kms_key_arn
}
