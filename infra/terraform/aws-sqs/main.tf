# An SQS queue for fencebridge, its dead-letter queue, and the least-privilege IAM policy the
# bridge consumes it with. The bridge writes each delivery to PostgreSQL before it deletes it,
# so SQS only has to hold a message until that commit; the dead-letter queue catches messages
# that could not be recorded after max_receive_count receives.

locals {
  suffix     = var.fifo ? ".fifo" : ""
  queue_name = "${var.name}${local.suffix}"
  dlq_name   = "${var.name}-dlq${local.suffix}"
}

resource "aws_sqs_queue" "dlq" {
  name                      = local.dlq_name
  fifo_queue                = var.fifo
  message_retention_seconds = var.dlq_message_retention_seconds

  sqs_managed_sse_enabled = var.kms_key_arn == null ? true : null
  kms_master_key_id       = var.kms_key_arn

  tags = var.tags
}

resource "aws_sqs_queue" "this" {
  name                       = local.queue_name
  fifo_queue                 = var.fifo
  visibility_timeout_seconds = var.visibility_timeout_seconds
  message_retention_seconds  = var.message_retention_seconds
  receive_wait_time_seconds  = var.receive_wait_time_seconds

  sqs_managed_sse_enabled = var.kms_key_arn == null ? true : null
  kms_master_key_id       = var.kms_key_arn

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = var.max_receive_count
  })

  tags = var.tags
}

# Only this queue may use the dead-letter queue as its target.
resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.this.arn]
  })
}

# What the bridge needs and nothing else: receive, delete, extend or release visibility, and
# read the queue's attributes. IAM authorises DeleteMessageBatch and ChangeMessageVisibilityBatch
# with the non-batch actions, so these four actions cover all six calls. No SendMessage, no
# PurgeQueue, no access to the dead-letter queue (draining it is an operator's job). The bridge
# is configured with the queue URL (output queue_url), so it needs no GetQueueUrl.
data "aws_iam_policy_document" "bridge" {
  statement {
    sid    = "ConsumeQueue"
    effect = "Allow"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
    ]
    resources = [aws_sqs_queue.this.arn]
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]
    content {
      sid       = "DecryptQueueMessages"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:EncryptionContext:aws:sqs:arn"
        values   = [aws_sqs_queue.this.arn]
      }
    }
  }
}

resource "aws_iam_policy" "bridge" {
  name        = "${var.name}-fencebridge-consumer"
  description = "fencebridge: consume ${local.queue_name} (receive, delete, change visibility)"
  policy      = data.aws_iam_policy_document.bridge.json
  tags        = var.tags
}

resource "aws_iam_role_policy_attachment" "bridge" {
  for_each = var.bridge_role_names

  role       = each.value
  policy_arn = aws_iam_policy.bridge.arn
}

# Messages in the dead-letter queue were never recorded as work: a person has to look.
resource "aws_cloudwatch_metric_alarm" "dlq_not_empty" {
  count = length(var.dlq_alarm_actions) > 0 ? 1 : 0

  alarm_name          = "${local.dlq_name}-not-empty"
  alarm_description   = "Messages reached the dead-letter queue of ${local.queue_name} without becoming work rows."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.dlq.name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = var.dlq_alarm_actions
  ok_actions          = var.dlq_alarm_actions
  tags                = var.tags
}
