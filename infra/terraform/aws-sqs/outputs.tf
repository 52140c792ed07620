output "queue_url" {
  description = "The URL the bridge's subscription configuration names."
  value       = aws_sqs_queue.this.id
}

output "queue_arn" {
  description = "ARN of the queue."
  value       = aws_sqs_queue.this.arn
}

output "queue_name" {
  description = "Name of the queue (the QueueName dimension of its CloudWatch metrics)."
  value       = aws_sqs_queue.this.name
}

output "dlq_url" {
  description = "URL of the dead-letter queue."
  value       = aws_sqs_queue.dlq.id
}

output "dlq_arn" {
  description = "ARN of the dead-letter queue."
  value       = aws_sqs_queue.dlq.arn
}

output "bridge_policy_arn" {
  description = "ARN of the IAM policy to attach to the bridge's role."
  value       = aws_iam_policy.bridge.arn
}

output "bridge_policy_json" {
  description = "The bridge policy document, for review or use elsewhere."
  value       = data.aws_iam_policy_document.bridge.json
}
