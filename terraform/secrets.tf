# Secrets the module generates for the broker: the callback secret (signs the per-placement tokens instances
# report their exit status with; production refuses to start without it) and the metrics token (GET /metrics spans
# every tenant, team and spend: the HTTP API is public, so it must not be open).
#
# Each value comes from Secrets Manager's own generator (an ephemeral resource) and is written through a write-only
# argument: it is in neither the plan nor the state. The function reads it at cold start through
# OVERSPILL_<NAME>_ARN. Names live under "<name>/broker/", which the instances' secret prefix may not cover.

locals {
  generated_secrets = {
    callback_secret = "signs the callback tokens of training instances"
    metrics_token   = "bearer token of GET /metrics (give it to Prometheus)"
  }
}

ephemeral "aws_secretsmanager_random_password" "generated" {
  for_each            = local.generated_secrets
  password_length     = 64
  exclude_punctuation = true # travels in HTTP headers and shell variables
}

resource "aws_secretsmanager_secret" "generated" {
  #checkov:skip=CKV2_AWS_57:Rotation needs a rotation function and would cut off running instances (callback tokens) and scrapers mid-flight; rotate deliberately by raising generated_secrets_version.
  for_each                = local.generated_secrets
  name_prefix             = "${var.name}/broker/${replace(each.key, "_", "-")}-"
  description             = "Overspill ${var.name}: ${each.value}"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret_version" "generated" {
  for_each                 = local.generated_secrets
  secret_id                = aws_secretsmanager_secret.generated[each.key].id
  secret_string_wo         = ephemeral.aws_secretsmanager_random_password.generated[each.key].random_password
  secret_string_wo_version = var.generated_secrets_version
}
