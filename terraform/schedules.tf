# EventBridge Scheduler: one schedule per broker task (local.schedules), each invoking the function with
# {"overspill_task": "<task>"}.

resource "aws_scheduler_schedule_group" "this" {
  name = var.name
  tags = local.tags
}

resource "aws_scheduler_schedule" "task" {
  for_each = local.schedules

  name                         = "${var.name}-${replace(each.key, "_", "-")}"
  group_name                   = aws_scheduler_schedule_group.this.name
  schedule_expression          = each.value
  schedule_expression_timezone = var.schedule_timezone
  kms_key_arn                  = aws_kms_key.this.arn

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = aws_lambda_function.broker.arn
    role_arn = aws_iam_role.scheduler.arn
    input    = jsonencode({ overspill_task = each.key })

    retry_policy {
      maximum_retry_attempts       = 0
      maximum_event_age_in_seconds = 60
    }

    dead_letter_config {
      arn = aws_sqs_queue.failed_invocations.arn
    }
  }
}
