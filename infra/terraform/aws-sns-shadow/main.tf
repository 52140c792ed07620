# A copy of an SNS topic's stream for a fencebridge shadow subscription (mode = "shadow"): a
# queue of its own (with a dead-letter queue and the bridge's least-privilege policy, from the
# aws-sqs module) subscribed to the topic with raw message delivery, so the bridge reads the
# same bodies and message attributes as the existing consumer while that consumer keeps its own
# queue. When the existing consumer reads a queue the producer sends to directly, create the
# topic here (topic_arn = null), point the producer at it, and subscribe the existing queue too
# (existing_queue_arn, existing_queue_url): both queues then receive every message.

locals {
  topic_arn = var.topic_arn == null ? aws_sns_topic.this[0].arn : var.topic_arn
  queues = merge(
    { shadow = { arn = module.shadow_queue.queue_arn, url = module.shadow_queue.queue_url } },
    {
      for key, queue in { existing = { arn = var.existing_queue_arn, url = var.existing_queue_url } } :
      key => queue if var.existing_queue_arn != null
    },
  )
}

resource "aws_sns_topic" "this" {
  count = var.topic_arn == null ? 1 : 0

  name = var.name
  tags = var.tags
}

module "shadow_queue" {
  source = "../aws-sqs"

  name                       = "${var.name}-shadow"
  visibility_timeout_seconds = var.visibility_timeout_seconds
  message_retention_seconds  = var.message_retention_seconds
  max_receive_count          = var.max_receive_count
  bridge_role_names          = var.bridge_role_names
  tags                       = var.tags
}

# SNS may send to each subscribed queue, from this topic only.
data "aws_iam_policy_document" "from_topic" {
  for_each = local.queues

  statement {
    sid       = "FromTopic"
    effect    = "Allow"
    actions   = ["sqs:SendMessage"]
    resources = [each.value.arn]

    principals {
      type        = "Service"
      identifiers = ["sns.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [local.topic_arn]
    }
  }
}

resource "aws_sqs_queue_policy" "from_topic" {
  for_each = local.queues

  queue_url = each.value.url
  policy    = data.aws_iam_policy_document.from_topic[each.key].json

  lifecycle {
    precondition {
      condition     = (var.existing_queue_arn == null) == (var.existing_queue_url == null)
      error_message = "existing_queue_arn and existing_queue_url go together."
    }
  }
}

# Raw delivery: the queue receives the published body and message attributes as they are, not
# wrapped in an SNS envelope, so the shadow subscription decodes them with the live rules.
resource "aws_sns_topic_subscription" "queue" {
  for_each = local.queues

  topic_arn            = local.topic_arn
  protocol             = "sqs"
  endpoint             = each.value.arn
  raw_message_delivery = true

  depends_on = [aws_sqs_queue_policy.from_topic]
}
