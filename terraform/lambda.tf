# The broker as one function: HTTP API requests, scheduled tasks and interruption messages all enter through
# broker.serverless.handler, which dispatches on the event's shape.

resource "aws_lambda_function" "broker" {
  #checkov:skip=CKV_AWS_272:The package is built from source by build_lambda.py in the deploying pipeline; code signing needs an AWS Signer profile the deployer owns, not something this module can create meaningfully.
  function_name                  = var.name
  description                    = "Overspill GPU cloud-burst broker"
  role                           = aws_iam_role.lambda.arn
  filename                       = var.lambda_zip_path
  source_code_hash               = filebase64sha256(var.lambda_zip_path)
  handler                        = "broker.serverless.handler"
  runtime                        = var.lambda_runtime
  architectures                  = [var.lambda_architecture]
  memory_size                    = var.lambda_memory_mb
  timeout                        = var.lambda_timeout_seconds
  reserved_concurrent_executions = var.lambda_reserved_concurrency
  kms_key_arn                    = aws_kms_key.this.arn

  environment {
    variables = local.environment
  }

  vpc_config {
    subnet_ids         = var.subnet_ids
    security_group_ids = [aws_security_group.lambda.id]
  }

  tracing_config {
    mode = "Active"
  }

  dead_letter_config {
    target_arn = aws_sqs_queue.failed_invocations.arn
  }

  logging_config {
    log_format = "Text"
    log_group  = aws_cloudwatch_log_group.lambda.name
  }

  tags = local.tags

  # the generated secrets hold their values before the first cold start reads them
  depends_on = [aws_iam_role_policy.platform, aws_cloudwatch_log_group.lambda, aws_secretsmanager_secret_version.generated]
}

# Scheduled invocations are asynchronous: a failed tick is not retried (the next one comes within a minute), it is
# recorded in the failed-invocations queue.
resource "aws_lambda_function_event_invoke_config" "broker" {
  function_name                = aws_lambda_function.broker.function_name
  maximum_retry_attempts       = 0
  maximum_event_age_in_seconds = 300
}

resource "aws_lambda_event_source_mapping" "interruptions" {
  event_source_arn                   = aws_sqs_queue.interruptions.arn
  function_name                      = aws_lambda_function.broker.arn
  batch_size                         = 10
  maximum_batching_window_in_seconds = 0
  function_response_types            = ["ReportBatchItemFailures"]
}

resource "aws_lambda_permission" "api" {
  statement_id  = "AllowHttpApi"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.broker.function_name
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_apigatewayv2_api.this.execution_arn}/*/*"
}
