output "topic_arn" {
  description = "The topic both queues receive from (the producer publishes here)."
  value       = local.topic_arn
}

output "shadow_queue_url" {
  description = "The URL the bridge's shadow subscription (mode = \"shadow\") names."
  value       = module.shadow_queue.queue_url
}

output "shadow_queue_arn" {
  description = "ARN of the shadow queue."
  value       = module.shadow_queue.queue_arn
}

output "bridge_policy_arn" {
  description = "ARN of the IAM policy that lets the bridge consume the shadow queue."
  value       = module.shadow_queue.bridge_policy_arn
}
