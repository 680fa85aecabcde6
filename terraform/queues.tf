# SQS: the interruption queue EventBridge feeds with EC2 spot warnings and rebalance recommendations (consumed by the
# function), its dead-letter queue, and the queue of failed scheduled/asynchronous invocations.

resource "aws_sqs_queue" "interruptions_dlq" {
  name                      = "${var.name}-interruptions-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = true
  tags                      = local.tags
}

resource "aws_sqs_queue" "interruptions" {
  name                       = "${var.name}-interruptions"
  message_retention_seconds  = var.interruption_message_retention_seconds
  visibility_timeout_seconds = var.lambda_timeout_seconds + 30 # at least the function timeout (an SQS event source requires it)
  receive_wait_time_seconds  = 20
  sqs_managed_sse_enabled    = true

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.interruptions_dlq.arn
    maxReceiveCount     = 5
  })

  tags = local.tags
}

resource "aws_sqs_queue" "failed_invocations" {
  name                      = "${var.name}-failed-invocations"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = true
  tags                      = local.tags
}

resource "aws_cloudwatch_event_rule" "interruption" {
  for_each = local.interruption_events

  name        = "${var.name}-${each.key}"
  description = "Overspill: ${each.value} to SQS"
  event_pattern = jsonencode({
    source        = ["aws.ec2"]
    "detail-type" = [each.value]
  })
  tags = local.tags
}

resource "aws_cloudwatch_event_target" "interruption" {
  for_each = local.interruption_events

  rule      = aws_cloudwatch_event_rule.interruption[each.key].name
  target_id = "overspill-sqs"
  arn       = aws_sqs_queue.interruptions.arn
}

data "aws_iam_policy_document" "interruptions_queue" {
  statement {
    sid       = "EventBridgeRulesSend"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [for rule in aws_cloudwatch_event_rule.interruption : rule.arn]
    }
  }
}

resource "aws_sqs_queue_policy" "interruptions" {
  queue_url = aws_sqs_queue.interruptions.id
  policy    = data.aws_iam_policy_document.interruptions_queue.json
}
